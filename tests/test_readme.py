"""The README's test command is the one CI runs."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.docs.pages import blocks

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


VENV_TOOLS = re.compile(r"^(pip|pip3|python|pytest|mkdocs|pyspark)\s+\S+\s+\S")  # a command with arguments


def test_every_command_the_readme_gives_runs_from_the_venv() -> None:
    """The set-up makes `.venv` and nothing activates it: a bare `pip install x` or `pytest ...` would run whatever
    the reader's PATH has (or nothing), so every command for the venv's tools names `.venv/bin/`."""
    readme = (ROOT / "README.md").read_text()
    spans = re.findall(r"(?<!`)`([^`\n]+)`(?!`)", readme)
    lines = [line for block in _commands(readme) for line in block.splitlines()]
    commands = [part.strip() for text in spans + lines for part in re.split(r"&&|\|\||;|\|", text)]
    bare = [command for command in commands if VENV_TOOLS.match(command)]
    assert bare == []


def test_what_the_quickstart_has_the_reader_create_is_ignored_by_git() -> None:
    """A reader follows the quickstart in the clone: what it saves there leaves ``git status`` clean."""
    saved = [block.save_as for block in blocks((ROOT / "README.md").read_text()) if block.save_as]
    assert len(saved) >= 4, saved
    for name in saved:
        done = subprocess.run(["git", "check-ignore", "-q", "--no-index", name], cwd=ROOT, check=False)
        assert done.returncode == 0, f"{name}, which the README has the reader save, is not in .gitignore"
