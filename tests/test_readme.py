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


OUTSIDE = "shared" + "/design|[.][.]/" + "shared"  # split, so this file does not name it


def test_nothing_in_the_repository_points_outside_it() -> None:
    """The contract is docs/semantics.md: no README, docs page, source or test names the team's own folders."""
    tracked = [
        path
        for folder in ("src", "docs", "tests", "bench", "examples")
        for path in (ROOT / folder).rglob("*")
        if path.is_file()
        and "node_modules" not in path.parts
        and path.suffix in (".py", ".md", ".js", ".json", ".go", ".java", ".yml", ".toml")
    ]
    tracked += [ROOT / "README.md", ROOT / "pyproject.toml"]
    outside = [str(p.relative_to(ROOT)) for p in tracked if re.search(OUTSIDE, p.read_text(errors="replace"))]
    assert outside == []
    assert "## Scenarios every implementation must pass" in (ROOT / "docs" / "semantics.md").read_text()
