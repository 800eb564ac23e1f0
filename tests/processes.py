"""A reader's terminal, for the tests that follow a page as its reader does (tests/docs/pages.py for the README and
docs/getting-started.md, tests/frameworks/walk.py for the framework pages): pasting a block in bash, and starting a
block that runs until stopped (``oncebus serve``, a worker) in the background."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

NOT_THE_READERS = ("VIRTUAL_ENV", "PYTHONPATH", "ONCEBUS_DATA_DIR")  # set by the tests' own run, not by a reader


def reader_environment() -> dict[str, str]:
    """The tests' environment without what only the tests' own run sets."""
    return {k: v for k, v in os.environ.items() if k not in NOT_THE_READERS}


def run_bash(code: str, folder: Path, env: dict[str, str], timeout: float, where: str, then: str = "") -> str:
    """``code`` pasted in bash (``-e``) in ``folder``, followed by ``then`` (the caller's own, not shown in an
    error); its output (stdout, then stderr). A failure raises, naming ``where`` and showing the output's end."""
    done = subprocess.run(
        ["bash", "-e", "-c", f"{code}\n{then}" if then else code],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise AssertionError(f"{where} failed (exit {done.returncode}):\n{code}\n--- output ---\n{output[-4000:]}")
    return output


@dataclass
class Background:
    """A block that runs until stopped, started in bash in its own process group: its output so far (in ``log``),
    waiting for a line of it, stopping it."""

    process: subprocess.Popen[bytes]
    log: Path

    @classmethod
    def start(cls, code: str, folder: Path, env: dict[str, str], log: Path) -> Background:
        with log.open("wb") as out:
            process = subprocess.Popen(
                ["bash", "-e", "-c", code],
                cwd=folder,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return cls(process, log)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float = 30.0, count: int = 1) -> str:
        """The output once ``pattern`` (a regular expression) was printed ``count`` times; fails if the block
        stops first or does not print it in ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.output()
            if len(re.findall(pattern, text)) >= count:
                return text
            if self.process.poll() is not None:
                raise AssertionError(f"stopped (exit {self.process.returncode}) before {pattern!r}:\n{text[-4000:]}")
            time.sleep(0.2)
        raise AssertionError(f"{pattern!r} ({count}) not printed in {timeout} s:\n{self.output()[-4000:]}")

    def stop(self, sig: signal.Signals = signal.SIGINT, whole_group: bool = False, grace: float = 20.0) -> None:
        """``sig`` to the block (as Ctrl-C stops it: a worker's warm shutdown stops its own children), or to its whole
        process group; after ``grace`` seconds, whatever is left of the group is killed."""
        if self.process.poll() is None:
            if whole_group:
                os.killpg(self.process.pid, sig)
            else:
                self.process.send_signal(sig)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(grace)
