"""SIGKILL a process that is sending through the broker on SQLite; nothing acknowledged is lost or doubled."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.store.crash_worker", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


def _read_until(
    proc: subprocess.Popen[str], prefix: str, stop: str | None = None, count: int | None = None
) -> list[str]:
    assert proc.stdout is not None
    seen: list[str] = []
    for line in proc.stdout:
        line = line.strip()
        if stop is not None and line == stop:
            return seen
        if line.startswith(prefix):
            seen.append(line.split(" ", 1)[1])
            if count is not None and len(seen) >= count:
                return seen
    raise AssertionError(f"worker ended early after {len(seen)} lines; exit {proc.wait()}")


def _kill(proc: subprocess.Popen[str]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def test_sigkill_mid_send_then_retry_then_drained_resend(tmp_path: Path) -> None:
    db = str(tmp_path / "oncebus.db")
    total = 100_000
    sender = _start("send", db, "0", str(total), "8")
    acked = {int(i) for i in _read_until(sender, "ACK ", count=1500)}
    _kill(sender)  # sends are in flight: 8 tasks sharing group commits
    assert sender.stdout is not None
    acked |= {int(line.split()[1]) for line in sender.stdout.read().splitlines() if line.startswith("ACK ")}
    assert len(acked) >= 1500
    # the sender retries everything that may have been sent: all ids up to the highest it started
    in_doubt_end = max(acked) + 8 + 1
    retry = _start("send", db, "0", str(in_doubt_end), "8")
    _read_until(retry, "ACK ", stop="DONE")
    _kill(retry)

    drainer = _start("drain", db)
    got = Counter(_read_until(drainer, "GOT ", stop="DRAINED"))
    assert all(n == 1 for n in got.values()), [k for k, n in got.items() if n > 1][:5]
    assert {f"id-{i}" for i in acked} <= set(got)
    assert set(got) == {f"id-{i}" for i in range(in_doubt_end)}
    _kill(drainer)  # drained, and killed again

    resend = _start("send", db, "0", str(in_doubt_end), "8")
    _read_until(resend, "ACK ", stop="DONE")
    _kill(resend)
    final = _start("drain", db)
    assert _read_until(final, "GOT ", stop="DRAINED") == []  # the history outlived both crashes and the messages
    _kill(final)
