"""Reading a page's fenced code blocks, and following a page in order as a reader does.

A reader is asked to run three kinds of block, and the runner does exactly that, in the page's order:

- a ``sh`` block: its commands, in bash, in the reader's folder; a block ending with ``oncebus serve`` is the
  "leave it running" one: started in the background, and the next block runs once it printed ``ready``;
- a ``python`` or ``js`` block after "Save this as `FILE` and run `COMMAND`": written to FILE, then COMMAND run;
- anything else (``text``, ``yaml``, a block the prose does not ask to run) is only read.

The one change made to what is written: the default ports (5672, 5671, 5300) become free ones, on the serve
command and in every block, so that tests never bind a fixed port.
"""

from __future__ import annotations

import os
import re
import signal
import socket
from dataclasses import dataclass, field
from pathlib import Path

from tests.processes import Background, reader_environment, run_bash

SAVE = re.compile(r"Save (?:this )?as `(?P<file>[^`]+)` and run `(?P<command>[^`]+)`")
FENCE = re.compile(r"^```(?P<info>[^\n]*)\n(?P<code>.*?)^```\s*$", re.S | re.M)
DEFAULT_PORTS = (5672, 5671, 5300)


@dataclass
class Block:
    lang: str
    code: str
    line: int  # where the block starts in its page (1-based)
    save_as: str | None = None  # "Save this as `FILE` and run `COMMAND`" just before it
    run: str | None = None


def blocks(text: str) -> list[Block]:
    found: list[Block] = []
    last = 0
    for match in FENCE.finditer(text):
        prose = text[last : match.start()]
        save = list(SAVE.finditer(prose.rsplit("```", 1)[-1]))
        block = Block(
            lang=match["info"].strip().split(" ")[0],
            code=match["code"],
            line=text.count("\n", 0, match.start()) + 1,
        )
        if save:
            block.save_as, block.run = save[-1]["file"], save[-1]["command"]
        found.append(block)
        last = match.end()
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Reader:
    """A reader's folder and terminal: runs blocks there, keeps every output, stops what it left running."""

    folder: Path
    timeout: float = 600.0
    ports: dict[int, int] = field(default_factory=lambda: {p: free_port() for p in DEFAULT_PORTS})
    outputs: list[tuple[str, str]] = field(default_factory=list)  # (what ran, its output), in order
    _serving: list[Background] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        env = reader_environment()
        path = [p for p in env.get("PATH", "").split(os.pathsep) if "/.venv" not in p]  # not the tests' own venv
        env["PATH"] = os.pathsep.join(path)
        return env

    def localize(self, code: str) -> str:
        for default, port in self.ports.items():
            code = re.sub(rf"(?<![0-9]){default}(?![0-9])", str(port), code)
        return code

    def follow(self, block: Block, where: str) -> str:
        """Do what the page asks with ``block``; returns its output (a failure raises, naming the block)."""
        if block.lang in ("sh", "bash"):
            code = self.localize(block.code)
            if re.search(r"oncebus serve\s*$", code.strip()):
                return self._serve(code, where)
            return self._run(code, where)
        if block.save_as is not None and block.run is not None:
            target = self.folder / block.save_as
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(self.localize(block.code))
            return self._run(block.run, where)
        return ""

    def _run(self, code: str, where: str) -> str:
        output = run_bash(code, self.folder, self.env(), self.timeout, where)
        self.outputs.append((code, output))
        return output

    def _serve(self, code: str, where: str) -> str:
        p = self.ports
        code = re.sub(
            r"oncebus serve\s*$",
            f"oncebus serve --port {p[5672]} --tls-port {p[5671]} --http-port {p[5300]}",
            code.strip(),
        )
        serving = Background.start(code, self.folder, self.env(), self.folder / f".serve-{len(self._serving)}.log")
        self._serving.append(serving)
        try:
            text = serving.wait_for(r"(?m)^ready$", self.timeout)
        except AssertionError as failure:
            raise AssertionError(f"{where}: the server printed no 'ready': {failure}") from None
        self.outputs.append((code, text))
        return text

    def stop(self) -> None:
        for serving in self._serving:
            serving.stop(signal.SIGTERM, whole_group=True, grace=30.0)
        self._serving.clear()
