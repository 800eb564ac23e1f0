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
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

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
    _serving: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "ONCEBUS_DATA_DIR")}
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
        done = subprocess.run(
            ["bash", "-e", "-c", code],
            cwd=self.folder,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=self.timeout,
            check=False,
        )
        output = done.stdout + done.stderr
        self.outputs.append((code, output))
        if done.returncode != 0:
            raise AssertionError(f"{where} failed (exit {done.returncode}):\n{code}\n--- output ---\n{output[-4000:]}")
        return output

    def _serve(self, code: str, where: str) -> str:
        p = self.ports
        code = re.sub(
            r"oncebus serve\s*$",
            f"oncebus serve --port {p[5672]} --tls-port {p[5671]} --http-port {p[5300]}",
            code.strip(),
        )
        log = self.folder / f".serve-{len(self._serving)}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                ["bash", "-e", "-c", code],
                cwd=self.folder,
                env=self.env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._serving.append(process)
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            text = log.read_text(errors="replace")
            if "ready" in text.splitlines():
                self.outputs.append((code, text))
                return text
            if process.poll() is not None:
                raise AssertionError(f"{where}: the server stopped (exit {process.returncode}):\n{text[-4000:]}")
            time.sleep(0.2)
        raise AssertionError(f"{where}: the server printed no 'ready' in {self.timeout} s")

    def stop(self) -> None:
        for process in self._serving:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(30)
        self._serving.clear()
