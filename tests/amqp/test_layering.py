"""Guards of the layering: the AMQP handlers depend on the host protocol, not on the listener; the engine on neither."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import oncebus

PACKAGE = Path(oncebus.__file__).parent

# Parts of the AMQP adapter that must work without the listener that hosts them.
HANDLERS = ["connection", "links", "management", "routing", "cbs", "host", "values", "codec"]


def _imported_by(module: str) -> list[str]:
    """The oncebus modules a fresh interpreter has loaded after ``import <module>``."""
    code = f"import json, sys, {module}; print(json.dumps(sorted(m for m in sys.modules if m.startswith('oncebus'))))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60)
    return list(json.loads(out.stdout))


def _static_imports(path: Path) -> set[str]:
    """Every module a file names in an import statement, TYPE_CHECKING and function-level ones included."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_importing_a_connection_does_not_import_the_listener() -> None:
    loaded = _imported_by("oncebus.amqp.connection")
    assert "oncebus.amqp.connection" in loaded  # the check ran on what it names
    assert "oncebus.amqp.server" not in loaded


def test_amqp_handlers_never_name_the_listener() -> None:
    for name in HANDLERS:
        imports = _static_imports(PACKAGE / "amqp" / f"{name}.py")
        assert "oncebus.amqp.server" not in imports, f"amqp/{name}.py imports amqp/server.py: depend on amqp/host.py"


def test_the_engine_imports_no_adapter_and_no_process() -> None:
    for folder in ("core", "store", "broker"):
        for path in sorted((PACKAGE / folder).rglob("*.py")):
            outward = sorted(
                name
                for name in _static_imports(path)
                if name.split(".")[:2] in (["oncebus", "server"], ["oncebus", "amqp"], ["oncebus", "http"])
            )
            assert not outward, f"{path.relative_to(PACKAGE)} imports {outward}"
