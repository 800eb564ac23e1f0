"""The README's set-up and quickstart, then docs/getting-started.md, followed in order by a reader on a fresh copy
of the repository: every block the reader is asked to run is run as written (``tests/docs/pages.py`` says how),
and what the pages say will be printed is printed.

A page that fails when followed in order is a failing test. This needs what the pages need: Python 3.11 with
network access to the package index, Node 20 with npm, Java 17 (the Spark block).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docs.pages import Block, Reader, blocks

ROOT = Path(__file__).resolve().parents[2]
CI_TEST_LINE = next(
    line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.startswith("python3 -m venv .venv &&")
)


def _fresh_copy(target: Path) -> None:
    """The repository's tracked files as they are in the working tree (a fresh clone, with what is not committed)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def _section(text: str, first: str, last: str) -> str:
    """From the heading ``first`` up to (not including) the heading ``last``."""
    assert first in text and last in text, (first, last)
    return text[text.index(first) : text.index(last)]


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reader]:
    folder = tmp_path_factory.mktemp("reader") / "oncebus"
    folder.mkdir()
    _fresh_copy(folder)
    reader = Reader(folder)
    yield reader
    reader.stop()


def _follow(reader: Reader, page: str, chosen: list[Block]) -> list[str]:
    return [reader.follow(block, f"{page} line {block.line} ({block.lang})") for block in chosen]


# the reader's installs build oncebus twice (the set-up, the Spark extra: mypyc where a compiler is) and fetch
# pyspark: over the suite's 300 s on a loaded 2-core machine (5 min 4 s, stopped in the Spark install, here)
@pytest.mark.timeout(1800)
def test_the_readme_from_set_up_to_the_end_of_its_quickstart(reader: Reader) -> None:
    text = (ROOT / "README.md").read_text()
    chosen = [
        b for b in blocks(_section(text, "## Set up", "## Documentation")) if b.code.strip() != CI_TEST_LINE.strip()
    ]
    assert len(chosen) >= 10, [b.code for b in chosen]
    outputs = dict(zip((b.code for b in chosen), _follow(reader, "README.md", chosen), strict=True))
    stats = next(out for code, out in outputs.items() if "oncebus stats quickstart" in code)
    assert "quickstart" in stats
    python = next(out for code, out in outputs.items() if "from python" in code)
    assert python.count("greeting-2 from python") == 1 and "greeting-1 hello" in python
    websockets = next(out for code, out in outputs.items() if "AmqpOverWebsocket" in code)
    assert websockets.count("greeting-ws over websockets") == 1, websockets
    node = next(out for code, out in outputs.items() if "from node" in code)
    assert node.count("greeting-3 from node") == 1 and "greeting-ws" not in node
    lost_ack = next(out for code, out in outputs.items() if "test_lost_ack.py" in code)
    # no warning either: without pytest-timeout, pytest warns of the repository's own `timeout` setting
    assert "1 passed" in lost_ack and "warning" not in lost_ack, lost_ack
    spark = next(out for code, out in outputs.items() if "deduplicate(sends" in code)
    assert "10:00:00" in spark and "10:11:00" in spark and "10:05:00" not in spark
    # the rule's columns built for a frame without partition_key and session_id compared two identical nulls,
    # which Spark warned of in the reader's terminal
    assert "trivially true" not in spark, spark
    reader.stop()


def test_getting_started_followed_in_order(reader: Reader) -> None:
    page = "docs/getting-started.md"
    chosen = [b for b in blocks((ROOT / page).read_text()) if b.lang != "text"]
    outputs = dict(zip((b.code for b in chosen), _follow(reader, page, chosen), strict=True))
    created = next(out for code, out in outputs.items() if "create_queue(" in code)
    assert "0:10:00" in created
    sent = next(out for code, out in outputs.items() if "payment-1" in code)
    assert "['payment-1']" in sent
    stats = next(out for code, out in outputs.items() if "oncebus stats payments" in code)
    assert "payments" in stats
    reader.stop()
