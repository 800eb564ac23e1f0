"""A backlog waits on disk, not in memory: ``oncebus serve`` with 200,000 messages of 1 KiB waiting in a queue.

The server's resident memory (``/proc/<pid>/status``) is measured, not timed: holding a message costs its
entry (sequence number, state, times, size, session id), about 200 bytes, while its content stays in the
store (and, for recent sends, in a cache bounded at 64 MB). Keeping every body in memory, as before, costs
more than 2 KiB per message (the body, its record and their objects): over 400 MB here.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli_support import Serve, oncebus

WAITING = 200_000
BODY = "x" * 1024


def _rss_mb(serve: Serve) -> float:
    assert serve.process is not None
    for line in Path(f"/proc/{serve.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc")


def test_rss_stays_bounded_while_200000_messages_wait_and_after_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    serve = Serve(data).start()
    try:
        created = oncebus("queue", "create", "backlog", "--max-size-mb", "5120", data_dir=data)
        assert created.returncode == 0, created.stderr
        idle = _rss_mb(serve)
        sent = oncebus(
            "send", "backlog", BODY, "--count", str(WAITING), "--message-id", "m{i}", "--batch-size", "1000",
            "--json", data_dir=data,
        )  # fmt: skip
        assert sent.returncode == 0, sent.stderr
        assert json.loads(sent.stdout)["stored"] == WAITING
        waiting = _rss_mb(serve)
        stats = json.loads(oncebus("stats", "backlog", "--json", data_dir=data).stdout)[0]
        assert stats["active_message_count"] == WAITING
        # entries (about 40 MB) and the content cache (at most 64 MB), plus what the sends left to the allocator
        assert waiting - idle < 180, (idle, waiting)
    finally:
        assert serve.stop() == 0
    restarted = Serve(data).start()
    try:
        held = _rss_mb(restarted)
        empty = Serve(tmp_path / "empty").start()
        try:
            baseline = _rss_mb(empty)
        finally:
            empty.stop()
        assert held - baseline < 70, (baseline, held)  # the entries alone: nothing of the content was read
        got = oncebus("receive", "backlog", "--max", "3", "--json", data_dir=data)
        assert got.returncode == 0, got.stderr
        received = json.loads(got.stdout)
        assert [m["message_id"] for m in received] == ["m0", "m1", "m2"]
        assert all(m["body"] == BODY for m in received)
    finally:
        restarted.stop()
