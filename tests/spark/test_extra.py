"""The ``spark`` extra declares every distribution the ``oncebus.spark`` package imports.

A truly clean venv with the extra costs about 2 minutes and 860 MB here (pyspark builds from a 456 MB
sdist), too much for every CI run; this reads what the installed ``oncebus`` declares
(``importlib.metadata.requires``) and every import statement of ``src/oncebus/spark`` (including the
ones inside functions, which a user meets only at first use, as ``format("oncebus")`` met
``azure.servicebus``), and checks each third-party module is provided by a distribution the base
dependencies or the ``spark`` extra name.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import oncebus.spark

PACKAGE = Path(oncebus.spark.__file__).parent
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared_for_spark() -> set[str]:
    """Distributions a ``pip install oncebus[spark]`` installs directly (base + the spark extra)."""
    declared = set()
    for requirement in importlib.metadata.requires("oncebus") or []:
        match = _NAME.match(requirement)
        assert match, requirement
        marker = requirement.split(";", 1)[1] if ";" in requirement else ""
        if not marker or re.search(r"extra\s*==\s*['\"]spark['\"]", marker):
            declared.add(_normal(match.group(1)))
    return declared


def _imported_modules() -> dict[str, set[str]]:
    """Top-level third-party modules imported anywhere in the package -> the files importing them."""
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in ("oncebus", "__future__"):
                    continue
                # a namespace package (azure) is provided by several distributions: keep the subpackage
                module = ".".join(name.split(".")[:2]) if top == "azure" else top
                found.setdefault(module, set()).add(str(path.relative_to(PACKAGE)))
    return found


def _providers(module: str) -> set[str]:
    by_package = importlib.metadata.packages_distributions()
    if module.startswith("azure."):
        return {"azure-" + module.split(".")[1]}
    return {_normal(d) for d in by_package.get(module, [])}


def test_the_spark_extra_declares_every_module_the_package_imports() -> None:
    declared = _declared_for_spark()
    imported = _imported_modules()
    assert "pyspark" in imported and "azure.servicebus" in imported  # the scan sees lazy imports too
    missing = {module: sorted(files) for module, files in imported.items() if not (_providers(module) & declared)}
    assert not missing, (
        f"oncebus.spark imports modules that `pip install oncebus[spark]` does not install: {missing}; "
        f"declared: {sorted(declared)}"
    )


def test_the_data_source_imports_what_it_needs() -> None:
    """The source's reader and writer import the SDK; with the extra installed that import works."""
    from azure.servicebus import ServiceBusClient

    from oncebus.spark import OncebusDataSource

    assert ServiceBusClient is not None and OncebusDataSource.name() == "oncebus"
