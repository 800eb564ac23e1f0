"""``oncebus serve`` SIGKILLed while a dedup checkpoint is being written, then started again (the real SDK).

The checkpoint's child process is caught alive and frozen (SIGSTOP: the image half-written or written but not
committed), the server is killed, and the child too. After the restart every acknowledged key is still judged
exactly: resends of acknowledged (and of pre-loaded) keys are dropped, nothing else is, and every message
acknowledged is there once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from tests.store.test_files_deleted_under_serve import Serve, _drain, cli

PRELOADED = 30_000  # keys written straight into the store: an image of some size for the child to write


def _committed_checkpoints(db: Path) -> int:
    connection = sqlite3.connect(db, timeout=5)
    try:
        return int(connection.execute("SELECT count(*) FROM dedup_checkpoint").fetchone()[0])
    finally:
        connection.close()


def _preload(db: Path, count: int) -> list[str]:
    keys = [f"pre-{i}" for i in range(count)]
    now = time.time_ns() // 1000
    connection = sqlite3.connect(db)
    with connection:
        connection.executemany(
            "INSERT INTO dedup_key (entity, first_accepted_us, key) VALUES ('q', ?, ?)",
            [(now - 60_000_000 + i, key) for i, key in enumerate(keys)],
        )
        connection.execute("DELETE FROM dedup_checkpoint")  # the CLI's image at its stop does not hold them
    connection.close()
    return keys


def _state(pid: int) -> str | None:
    """The process's state letter (``/proc/<pid>/stat``: R, S, T stopped, Z exited...), None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2]


def _freeze(pid: int) -> bool:
    """SIGSTOP the child; True once it is stopped, False if it had already exited (its checkpoint finished between
    the listing of the children and the signal: a zombie takes the signal and stays a zombie)."""
    try:
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        state = _state(pid)
        if state in ("T", "t"):
            return True
        if state in (None, "Z", "X"):
            return False
        time.sleep(0.001)
    raise AssertionError(f"child {pid} did not stop (state {_state(pid)})")


_CHILDREN = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children")  # Linux, CONFIG_PROC_CHILDREN


@pytest.mark.skipif(not _CHILDREN.exists() or not hasattr(os, "fork"), reason="needs /proc/<pid>/task/<tid>/children")
def test_sigkill_during_a_checkpoint_keeps_every_acknowledged_key_judged_exactly(tmp_path: Path) -> None:
    data = tmp_path / "data"
    cli(data, "queue", "create", "q", "--duplicate-detection", "--window", "PT1H")
    db = data / "oncebus.db"
    preloaded = _preload(db, PRELOADED)
    # a checkpoint at every timer tick that follows 200 new keys
    server = Serve(data, {"ONCEBUS_CHECKPOINT_KEYS": "200", "ONCEBUS_CHECKPOINT_SECONDS": "0"})
    acked: list[str] = []
    in_flight: list[str] = []
    stop_sending = threading.Event()

    def send() -> None:
        with contextlib.suppress(Exception):  # the server dies under it
            with ServiceBusClient.from_connection_string(server.connection_string, retry_total=0) as client:
                with client.get_queue_sender("q") as sender:
                    n = 0
                    while not stop_sending.is_set():
                        batch = [f"m-{n + i}" for i in range(50)]
                        in_flight[:] = batch
                        sender.send_messages([ServiceBusMessage(m.encode(), message_id=m) for m in batch])
                        acked.extend(batch)
                        n += 50

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    frozen = None
    deadline = time.monotonic() + 60
    try:
        while frozen is None and time.monotonic() < deadline:
            if len(acked) < 1000 or _committed_checkpoints(db) == 0:
                time.sleep(0.01)  # an earlier checkpoint committed first: the restart has one to start from
                continue
            for child in server.children():
                if _freeze(child):  # the checkpoint's writer, caught alive
                    frozen = child
                    break
        assert frozen is not None, "no checkpoint was caught being written\n" + "\n".join(server.output)
        os.kill(server.process.pid, signal.SIGKILL)
        server.process.wait(10)
    finally:
        stop_sending.set()
        if server.process.poll() is None:
            server.process.kill()
        if frozen is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(frozen, signal.SIGKILL)
    sender.join(30)
    doubtful = [m for m in in_flight if m not in set(acked)]
    assert len(acked) >= 1000

    again = Serve(data)
    try:
        assert not list(data.glob("oncebus.db.dedup*.tmp")) or again.children()  # the frozen one's is gone
        fresh = [f"fresh-{i}" for i in range(50)]
        with ServiceBusClient.from_connection_string(again.connection_string) as client:
            with client.get_queue_sender("q") as sender:
                for start in range(0, len(acked), 100):
                    chunk = acked[start : start + 100]
                    sender.send_messages([ServiceBusMessage(b"resend", message_id=m) for m in chunk])
                sender.send_messages([ServiceBusMessage(b"resend", message_id=m) for m in doubtful])
                sender.send_messages([ServiceBusMessage(b"pre", message_id=m) for m in preloaded[::1200]])
                sender.send_messages([ServiceBusMessage(m.encode(), message_id=m) for m in fresh])
        got = _drain(again.connection_string)
    finally:
        again.stop()
    assert len(got) == len(set(got)), "a resend inside the window was stored again"
    assert set(got) == set(acked) | set(doubtful) | set(fresh)  # nothing acknowledged lost, nothing new dropped
