"""The README's test command is the one CI runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _commands(text: str) -> list[str]:
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S)]


def test_readme_has_the_two_set_up_commands_and_ci_runs_the_test_one() -> None:
    readme = (ROOT / "README.md").read_text()
    setup = readme.split("## Set up", 1)[1].split("\n## ", 1)[0]
    serve, tests = _commands(setup)
    assert serve.endswith("oncebus serve")
    ci = (ROOT / ".ci" / "run").read_text()
    assert tests in ci.splitlines()
