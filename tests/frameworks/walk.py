"""Following a framework's page (docs/celery.md, docs/taskiq.md) as its reader does, block by block.

A test takes the page's fenced blocks in the page's order (``Walk.take`` names what the next block must contain)
and does with each what the prose asks:

- an ``sh`` block is pasted in the reader's terminal, in the reader's folder (``run``); what it ``export``s stays
  set for the blocks after it, as in one terminal;
- a long-running ``sh`` block (a worker) is started in the background (``start``), and waited on for what it
  prints when ready;
- a ``python`` block after "Save this as `FILE`" is written to FILE, and run with the command the prose names
  ("... and run `COMMAND`") if it names one (``run``);
- the install line is checked rather than run (``check_install``): its pins are the ``frameworks`` extra's and
  are what is installed; ``oncebus serve`` is the test's own server (``tests/amqp/conftest.py``'s ServerProcess).

``Walk.finish`` fails when a block was left untaken, so a block added to a page without its test fails.

The one change made to what is written: the page's address and ports (127.0.0.1, 5672, 5671) become the test
server's (``replace``), so that tests bind free ports. The reader's ``.venv`` is the test's own environment.
"""

from __future__ import annotations

import random
import re
import socket
import sys
import time
import tomllib
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

from tests.docs.pages import FENCE, Block, blocks
from tests.processes import Background, reader_environment, run_bash

ROOT = Path(__file__).resolve().parents[2]
SAVE_AS = re.compile(r"[Ss]ave\s+this\s+as\s+`(?P<file>[^`]+)`(?:\s+and\s+run\s+`(?P<command>[^`]+)`)?")
PIN = re.compile(r"^(?P<name>[A-Za-z0-9_.-]+)(?:\[[^\]]+\])?==(?P<version>[^\s\"']+)$")


def reader_folder(tmp_path: Path) -> Path:
    """An empty folder whose ``.venv`` is the test's environment (where the frameworks extra is installed)."""
    folder = tmp_path / "reader"
    folder.mkdir()
    (folder / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    return folder


def loopback_address_with_free(port: int) -> str:
    """A loopback address (127.x.y.z) on which ``port`` is free: for a client that can only dial a fixed port."""
    rng = random.Random()
    for _ in range(50):
        address = f"127.{rng.randint(1, 254)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}"
        with socket.socket() as s:
            try:
                s.bind((address, port))
            except OSError:
                continue
            return address
    raise AssertionError(f"no loopback address with port {port} free")


def stats_row(output: str, entity: str) -> dict[str, str]:
    """One entity's row of ``oncebus stats``, by column name."""
    lines = [line.split() for line in output.splitlines() if line.strip()]
    header = next(line for line in lines if line[0] == "ENTITY")
    row = next(line for line in lines if line[0] == entity)
    return dict(zip(header, row, strict=False))


def check_install(block: Block) -> None:
    """The page's pip line pins what the ``frameworks`` extra pins, and that is what is installed here."""
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["frameworks"]
    pins = [word.strip("\"'") for word in block.code.split() if "==" in word]
    assert pins, block.code
    for pin in pins:
        assert pin in extra, f"{pin} is not pinned so in pyproject.toml's frameworks extra {extra}"
        match = PIN.match(pin)
        assert match is not None, pin
        assert version(match["name"]) == match["version"], f"{pin}: {version(match['name'])} installed"


@dataclass
class Walk:
    page: Path
    folder: Path
    replace: dict[str, str]  # what the page says -> what the test's server has (address, ports)
    env: dict[str, str] = field(default_factory=dict)  # set on top of the test's environment
    timeout: float = 60.0
    _taken: int = 0
    _prose: list[str] = field(default_factory=list)
    _blocks: list[Block] = field(default_factory=list)
    _background: list[Background] = field(default_factory=list)

    def __post_init__(self) -> None:
        text = self.page.read_text()
        last = 0
        for match, block in zip(FENCE.finditer(text), blocks(text), strict=True):
            self._prose.append(text[last : match.start()])
            self._blocks.append(block)
            last = match.end()
        base = reader_environment()
        for name in ("REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "CURL_CA_BUNDLE"):
            base.pop(name, None)  # only what the page sets
        self.env = {**base, "PYTHONUNBUFFERED": "1", **self.env}  # a terminal shows output as it comes

    def where(self, block: Block) -> str:
        return f"{self.page.name} line {block.line}"

    def take(self, contains: str, lang: str | None = None) -> Block:
        """The page's next block, which must contain ``contains`` (and be of ``lang``)."""
        assert self._taken < len(self._blocks), f"{self.page.name} has no block left (wanted {contains!r})"
        block = self._blocks[self._taken]
        assert contains in block.code and (lang is None or block.lang == lang), (
            f"{self.where(block)}: the next block ({block.lang}) does not contain {contains!r}:\n{block.code}"
        )
        self._taken += 1
        return block

    def prose_before(self, block: Block) -> str:
        return self._prose[self._blocks.index(block)]

    def localize(self, code: str) -> str:
        for written, actual in self.replace.items():
            code = re.sub(rf"(?<![0-9.]){re.escape(written)}(?![0-9])", actual, code)
        return code

    def run(self, block: Block) -> str:
        """Do what the page asks with ``block``: paste it (sh), or save it and run the command the prose names."""
        if block.lang in ("sh", "bash"):
            return self.shell(self.localize(block.code), self.where(block))
        saved = list(SAVE_AS.finditer(self.prose_before(block)))
        assert saved, f"{self.where(block)}: no 'Save this as' before this {block.lang} block"
        target = self.folder / saved[-1]["file"]
        target.write_text(self.localize(block.code))
        command = saved[-1]["command"]
        return self.shell(command, self.where(block)) if command else ""

    def start(self, block: Block, ready: str) -> Background:
        """Start a block that runs until stopped (a worker) in the background, once it printed ``ready``."""
        log = self.folder / f".background-{len(self._background)}.log"
        running = Background.start(self.localize(block.code), self.folder, self.env, log)
        self._background.append(running)
        running.wait_for(re.escape(ready), self.timeout)
        return running

    def idle_stats(self, entity: str, timeout: float = 30.0) -> dict[str, str]:
        """``oncebus stats`` of ``entity`` once it holds no active message (the worker has settled them all)."""
        deadline = time.monotonic() + timeout
        while True:
            row = stats_row(self.shell(f".venv/bin/oncebus stats {entity}"), entity)
            if row["ACTIVE"] == "0" or time.monotonic() > deadline:
                return row
            time.sleep(0.5)

    def finish(self) -> None:
        untaken = [f"{self.where(b)} ({b.lang})" for b in self._blocks[self._taken :]]
        assert untaken == [], f"blocks no test follows: {untaken}"

    def stop(self) -> None:
        for running in self._background:
            running.stop()

    def shell(self, code: str, where: str = "a command") -> str:
        env_file = self.folder / ".env-after"
        output = run_bash(code, self.folder, self.env, self.timeout, where, then=f"env -0 > {env_file}")
        after = dict(item.split("=", 1) for item in env_file.read_text().split("\0") if "=" in item)
        after.pop("_", None)
        self.env = after  # what the block exported stays set, as in the reader's terminal
        return output
