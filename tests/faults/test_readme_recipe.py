"""docs/faults.md's recipe, run as it is written there (and kept equal to
examples/test_lost_ack.py): it passes with duplicate detection and fails, as it should, without.

The recipe is a pytest test taking the plugin's ``oncebus_namespace``; here it is called with this module's
broker (the same ``OncebusServer`` interface) on a fresh namespace holding the entities its marker declares,
which saves a pytest subprocess (the plugin itself is tested in tests/testing)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from oncebus.testing import OncebusServer

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "faults.md"


def _recipe() -> str:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)[0]


def _test_function(source: str) -> Callable[[OncebusServer], None]:
    scope: dict[str, Any] = {}
    exec(compile(source, "docs/faults.md", "exec"), scope)  # our own page
    (function,) = [value for name, value in scope.items() if name.startswith("test_")]
    return function  # type: ignore[no-any-return]


def _declared_queues(function: Callable[[OncebusServer], None]) -> dict[str, dict[str, Any]]:
    (marker,) = [m for m in function.pytestmark if m.name == "oncebus_entities"]  # type: ignore[attr-defined]
    return dict(marker.kwargs["queues"])


def test_the_readme_recipe_is_the_example_file() -> None:
    assert _recipe() == (ROOT / "examples" / "test_lost_ack.py").read_text()


@pytest.mark.parametrize("dedup", [True, False], ids=["as-written", "without-duplicate-detection"])
def test_the_recipe_passes_and_fails_without_duplicate_detection(server: OncebusServer, dedup: bool) -> None:
    source = _recipe()
    if not dedup:
        source = source.replace('{"requires_duplicate_detection": True}', "{}")
        assert source != _recipe()
    recipe = _test_function(source)
    for name, properties in _declared_queues(recipe).items():
        server.create_queue(name, **properties)
    if dedup:
        recipe(server)
    else:
        with pytest.raises(AssertionError):
            recipe(server)
        assert server.stats("orders")["accepted"] == 6  # "order 2" twice
