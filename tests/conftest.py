"""The whole suite's one hook: the ``quick`` subset a contributor runs while working (``pytest -m quick``).

Quick are the pure and in-process layers: the rule and the models (``tests/core``), the broker on the memory store
(``tests/broker``), and the repository's own checks (layering, exported names, the README). They start no server,
no browser, no JVM and no Spark, and run in well under two minutes on two cores; everything else runs in CI.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
QUICK_FOLDERS = ("core", "broker")
QUICK_FILES = ("test_layering.py", "test_exported_members.py", "test_readme.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        relative = item.path.resolve().relative_to(HERE) if item.path.resolve().is_relative_to(HERE) else None
        if relative is None:
            continue
        if relative.parts[0] in QUICK_FOLDERS or (len(relative.parts) == 1 and relative.name in QUICK_FILES):
            item.add_marker(pytest.mark.quick)
