"""The engine's boundary: front ends reach the broker through ``oncebus.broker`` alone, and the
packages that must be one-way (``broker/``, ``amqp/``'s wire layer) hold no import circle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import oncebus

PACKAGE = Path(oncebus.__file__).parent
FRONT_ENDS = ["amqp", "http", "server", "testing", "spark", "cli.py", "cli_rules.py"]


def _imports(path: Path) -> set[str]:
    """Every module a file names in an import statement (TYPE_CHECKING and function-level ones included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def _files(place: str) -> list[Path]:
    where = PACKAGE / place
    return [where] if where.is_file() else sorted(where.rglob("*.py"))


def test_front_ends_import_the_engine_only_through_its_package() -> None:
    offenders = []
    for place in FRONT_ENDS:
        for path in _files(place):
            inner = sorted(name for name in _imports(path) if name.startswith("oncebus.broker."))
            if inner:
                offenders.append(f"{path.relative_to(PACKAGE)} imports {inner}")
    assert offenders == [], "import these names from oncebus.broker:\n" + "\n".join(offenders)


ADAPTERS = ["amqp", "http", "testing", "spark", "cli.py", "cli_rules.py"]
CONCRETE = {"Namespace"}  # the class implementing the ports: only oncebus.server (the composition root) names it
# Files that still type by the concrete class: none (the AMQP door is typed by the ports since the engine rewrite).
# A file that offends again fails; the list may only shrink.
NOT_YET: set[str] = set()


def _names_from_broker(path: Path) -> set[str]:
    """The names a file imports from ``oncebus.broker`` (TYPE_CHECKING and function-level imports included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module == "oncebus.broker":
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Attribute) and node.attr in CONCRETE:  # oncebus.broker.Namespace, broker.Namespace
            value = node.value
            if (isinstance(value, ast.Name) and value.id == "broker") or ast.unparse(value) == "oncebus.broker":
                names.add(node.attr)
    return names


def _concrete_users() -> dict[str, set[str]]:
    users = {}
    for place in ADAPTERS:
        for path in _files(place):
            named = _names_from_broker(path) & CONCRETE
            if named:
                users[str(path.relative_to(PACKAGE))] = named
    return users


def test_adapters_are_typed_by_the_ports_not_the_namespace() -> None:
    """``amqp``, ``http``, ``testing``, ``spark`` and the CLI hold ``Messaging``/``Administration``/``Observation``
    (or ``Broker``, the three together); ``oncebus.server`` builds the ``Namespace`` and hands it to them."""
    offenders = {path: named for path, named in _concrete_users().items() if path not in NOT_YET}
    assert offenders == {}, "type these by the ports (oncebus.broker.Messaging, ...):\n" + "\n".join(
        f"{path} imports {sorted(named)}" for path, named in sorted(offenders.items())
    )


def test_the_list_of_files_not_yet_on_the_ports_only_shrinks() -> None:
    assert NOT_YET <= set(_concrete_users()), sorted(NOT_YET - set(_concrete_users()))


def test_the_concrete_class_check_finds_an_import(tmp_path: Path) -> None:
    """The check above is not vacuous: it sees the import forms a file could use."""
    for text in (
        "from oncebus.broker import Namespace\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from oncebus.broker import Messaging, Namespace\n",
        "def f():\n    from oncebus.broker import Namespace\n",
        "import oncebus.broker\nx: oncebus.broker.Namespace\n",
    ):
        path = tmp_path / "adapter.py"
        path.write_text(text)
        assert _names_from_broker(path) & CONCRETE == {"Namespace"}, text
    path.write_text("from oncebus.broker import Broker, Messaging\nfrom oncebus.testing import IsolatedNamespace\n")
    assert _names_from_broker(path) & CONCRETE == set()


def _cycle(folder: str) -> list[str] | None:
    prefix = f"oncebus.{folder.replace('/', '.')}."
    modules = {prefix + path.stem: path for path in sorted((PACKAGE / folder).glob("*.py")) if path.stem != "__init__"}
    graph = {name: sorted(n for n in _imports(path) if n in modules and n != name) for name, path in modules.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        stack.append(name)
        for nxt in graph[name]:
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        stack.pop()
        state[name] = 2
        return None

    for name in graph:
        if name not in state and (found := visit(name)) is not None:
            return found
    return None


def test_the_broker_has_no_import_circle() -> None:
    assert _cycle("broker") is None, " -> ".join(_cycle("broker") or [])


def test_the_amqp_adapter_has_no_import_circle() -> None:
    assert _cycle("amqp") is None, " -> ".join(_cycle("amqp") or [])


def _packages() -> list[str]:
    return sorted(str(p.parent.relative_to(PACKAGE)) for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE)


def test_every_package_is_checked() -> None:
    assert {"broker", "amqp", "testing", "store", "core"} <= set(_packages())


@pytest.mark.parametrize("folder", [p for p in _packages() if p not in ("broker", "amqp")])
def test_no_package_has_an_import_circle(folder: str) -> None:
    assert _cycle(folder) is None, " -> ".join(_cycle(folder) or [])


def test_the_observe_app_reads_the_observation_port_not_the_amqp_engine() -> None:
    """``/metrics`` and the dashboard get the AMQP gauges from the port (the AMQP server reports them there)."""
    imported = set().union(*(_imports(path) for path in _files("http/observe")))
    assert {name for name in imported if name.split(".")[0] == "proton" or name.startswith("oncebus.amqp")} == set()
