"""The documentation site builds strictly (a broken link or a page missing from the nav fails), and every code
block in the README and the docs at least parses: Python with ``ast``, shell with ``bash -n``. The blocks a
reader is asked to run are run by tests/docs/test_pages_in_order.py and the pages' own tests."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.docs.pages import blocks

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md", ROOT / "CONTRIBUTING.md"]


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    mkdocs = Path(sys.executable).parent / "mkdocs"
    done = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "getting-started" / "index.html").exists()


def test_every_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    missing = [p.name for p in (ROOT / "docs").glob("*.md") if f": {p.name}" not in nav]
    assert missing == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_code_block_parses(page: Path) -> None:
    for block in blocks(page.read_text()):
        where = f"{page.name} line {block.line}"
        if block.lang == "python":
            source = textwrap.dedent(block.code)
            if source.lstrip().startswith(">>>"):
                continue
            try:
                ast.parse(source)
            except SyntaxError as exc:
                raise AssertionError(f"{where}: {exc}") from None
        elif block.lang in ("sh", "bash"):
            done = subprocess.run(["bash", "-n"], input=block.code, capture_output=True, text=True, check=False)
            assert done.returncode == 0, f"{where}: {done.stderr}"


def test_the_readme_links_only_to_files_that_exist() -> None:
    text = (ROOT / "README.md").read_text()
    targets = [t.split("#", 1)[0] for t in re.findall(r"\]\(([^)]+)\)", text) if "://" not in t]
    assert targets and [t for t in targets if not (ROOT / t).exists()] == []
    assert len(text.splitlines()) <= 200


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_a_link_named_after_a_page_goes_to_that_page(page: Path) -> None:
    """``[store.md](durability.md)`` sends the reader elsewhere than it says (a page renamed, its links kept)."""
    named = re.findall(r"\[`?([\w.-]+\.md)`?\]\(([^)#]+)", page.read_text())
    assert [(text, target) for text, target in named if Path(target).name != text] == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_a_file_a_command_sends_is_made_before_it(page: Path) -> None:
    """``oncebus send --file order.json`` in a block a reader pastes: the block makes ``order.json`` first."""
    for block in blocks(page.read_text()):
        for match in re.finditer(r"--file\s+(\S+)", block.code):
            before = block.code[: match.start()]
            assert f"> {match[1]}" in before, f"{page.name} line {block.line}: nothing makes {match[1]}"
