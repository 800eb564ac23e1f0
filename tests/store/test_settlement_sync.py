"""Settlements are confirmed once committed to the WAL; sends still wait for their fsync (docs/store.md).

A settlement (complete, abandon, defer, dead-letter) commits with ``synchronous=NORMAL``: a crash of the
process cannot lose it (the WAL is in the OS's hands), a power failure can (its message comes back: at
least once). Anything that stores a message or a key commits with ``synchronous=FULL``, whoever shares
its transaction, and the writer fsyncs the WAL itself soon after settlements no durable commit carried.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue

from oncebus.core.messages import MessageState, StoredMessage
from oncebus.store import sqlite as sqlite_module
from oncebus.store import writer as writer_module
from oncebus.store.base import (
    SETTLEMENT_SYNC_SECONDS,
    DeleteMessage,
    MoveMessage,
    Op,
    PutDedupKey,
    PutMessage,
    UpdateMessage,
)
from oncebus.store.sqlite import SqliteStore
from tests.store.test_files_deleted_under_serve import Serve, cli
from tests.store.writer_support import writer_idle


def _message(seq: int) -> StoredMessage:
    return StoredMessage(
        path="q",
        sequence_number=seq,
        body=b"x",
        message_id=f"m{seq}",
        enqueued_time_us=1,
        expires_at_us=None,
        state=MessageState.ACTIVE,
    )


class _Statements:
    """The writer connection's statements, in order."""

    def __init__(self, store: SqliteStore) -> None:
        self.seen: list[str] = []
        store._db.set_trace_callback(self.seen.append)

    def synchronous_at_commits(self) -> list[tuple[str, str]]:
        """(the setting in force, the first statement of the transaction) for each COMMIT."""
        setting, first, out = "FULL", "", []
        for statement in self.seen:
            if statement.startswith("PRAGMA synchronous="):
                setting = statement.split("=", 1)[1]
            elif statement == "BEGIN IMMEDIATE":
                first = ""
            elif statement == "COMMIT":
                out.append((setting, first))
            elif not first:
                first = statement.split("(", 1)[0].strip()
        return out


def _fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files the store fsyncs itself (SQLite's own fsyncs do not go through Python)."""
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced


def _until(condition: Callable[[], bool], what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_settlement_commits_without_fsync_and_the_wal_is_synced_soon_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SqliteStore(tmp_path / "oncebus.db")
    try:
        store.submit([PutMessage(_message(1)), PutMessage(_message(2))]).result()
        statements = _Statements(store)
        synced = _fsyncs(monkeypatch)
        confirmed = time.monotonic()
        store.submit([DeleteMessage("q", 1)], durable=False).result()
        assert statements.synchronous_at_commits() == [
            ("NORMAL", "DELETE FROM message WHERE path = 'q' AND sequence_number = 1")
        ]
        assert store.relaxed_commits == 1
        _until(lambda: store.syncs == 1, "the writer's own fsync")
        assert time.monotonic() - confirmed < SETTLEMENT_SYNC_SECONDS + 2  # soon, not at the next send
        assert str(store.wal_path) in synced and str(tmp_path) in synced  # the WAL and its directory
        synced.clear()
        time.sleep(SETTLEMENT_SYNC_SECONDS * 2)
        assert synced == [] and store.syncs == 1  # nothing more to sync: no fsync while idle
    finally:
        store.close()
    reopened = SqliteStore(tmp_path / "oncebus.db")
    try:
        assert [row[1] for row in reopened.load().messages] == [2]
    finally:
        reopened.close()


def test_a_durable_commit_carries_the_settlements_before_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer_module, "SETTLEMENT_SYNC_SECONDS", 60.0)  # no sync of the writer's own meanwhile
    store = SqliteStore(tmp_path / "oncebus.db")
    try:
        store.submit([PutMessage(_message(1))]).result()
        statements = _Statements(store)
        synced = _fsyncs(monkeypatch)
        store.submit([DeleteMessage("q", 1)], durable=False).result()
        assert store._unsynced_since is not None
        store.submit([PutMessage(_message(2)), PutDedupKey("q", "k2", 5)]).result()
        assert [setting for setting, _ in statements.synchronous_at_commits()] == ["NORMAL", "FULL"]
        assert store._unsynced_since is None  # the send's fsync of the WAL synced the completion before it too
    finally:
        store.close()
    assert synced == [] and store.syncs == 0  # nothing left to sync, not even on close


def test_a_group_holding_a_send_commits_with_fsync_whole(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "oncebus.db")
    try:
        store.submit([PutMessage(_message(1))]).result()
        statements = _Statements(store)
        with store._lock:  # the writer waits: the settlement and the send are committed together
            first = store.submit([DeleteMessage("q", 1)], durable=False)
            while store._queue.qsize():
                time.sleep(0.001)
            settlement = store.submit([MoveMessage("q", 9, "q/$deadletterqueue", 0, "r", None)], durable=False)
            send = store.submit([PutMessage(_message(2)), PutDedupKey("q", "k2", 5)])
        first.result(), settlement.result(), send.result()
        assert [setting for setting, _ in statements.synchronous_at_commits()] == ["NORMAL", "FULL"]
        assert store.relaxed_commits == 1
    finally:
        store.close()


def test_a_unit_that_stores_a_message_or_key_waits_for_fsync_whatever_was_asked(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "oncebus.db")
    try:
        statements = _Statements(store)
        store.submit([PutMessage(_message(1))], durable=False).result()
        store.submit([PutDedupKey("q", "k", 1)], durable=False).result()
        assert [setting for setting, _ in statements.synchronous_at_commits()] == ["FULL", "FULL"]
        assert store.relaxed_commits == 0
    finally:
        store.close()


def test_settlements_confirmed_to_the_sdk_survive_kill_9_of_serve(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = Serve(data)
    try:
        cli(data, "queue", "create", "q", "--max-delivery-count", "10")
        ids = [f"m{i}" for i in range(30)]
        with ServiceBusClient.from_connection_string(server.connection_string) as client:
            with client.get_queue_sender("q") as sender:
                sender.send_messages([ServiceBusMessage(i.encode(), message_id=i) for i in ids])
            with client.get_queue_receiver("q", max_wait_time=5) as receiver:
                got = []
                while len(got) < len(ids):
                    batch = receiver.receive_messages(max_message_count=30, max_wait_time=5)
                    assert batch, f"received {len(got)} of {len(ids)}"
                    got += batch
                by_id = {str(m.message_id): m for m in got}
                first_count = {by_id[i].delivery_count for i in ids}
                for i in ids[:20]:  # confirmed by the server when these calls return
                    receiver.complete_message(by_id[i])
                for i in ids[20:25]:
                    receiver.dead_letter_message(by_id[i], reason="bad", error_description="test")
                for i in ids[25:]:
                    receiver.abandon_message(by_id[i])
                server.kill()  # right after the last confirmation: before the writer's own fsync, most times
        server = Serve(data)
        with ServiceBusClient.from_connection_string(server.connection_string) as client:
            with client.get_queue_receiver("q", max_wait_time=3) as receiver:
                left = {str(m.message_id): m.delivery_count for m in receiver.receive_messages(30, max_wait_time=3)}
            with client.get_queue_receiver(
                "q", sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=3
            ) as dead_letters:
                dead = {str(m.message_id): m.dead_letter_reason for m in dead_letters.receive_messages(30, 3)}
        assert sorted(left) == sorted(ids[25:])  # the completed ones are gone, the abandoned ones are back
        assert len(first_count) == 1, first_count
        assert set(left.values()) == {first_count.pop() + 1}  # their abandon (and its delivery count) stayed
        assert dead == {i: "bad" for i in ids[20:25]}
    finally:
        server.stop()


def test_commit_now_commits_a_settlement_on_the_callers_thread_only_when_the_writer_has_nothing(
    tmp_path: Path,
) -> None:
    store = SqliteStore(tmp_path / "oncebus.db")
    try:
        store.submit([PutMessage(_message(i)) for i in range(1, 5)]).result()
        statements = _Statements(store)
        caller = threading.get_ident()
        threads: list[int] = []
        store._db.set_trace_callback(
            lambda statement: (statements.seen.append(statement), threads.append(threading.get_ident()))
        )
        # the writer is idle: confirmed here, now, by a record in the settlement log (no transaction on this thread)
        writer_idle(store)
        assert store.commit_now([DeleteMessage("q", 1)])
        assert caller not in threads
        assert store.direct_commits == store.logged_settlements == 1
        assert os.path.getsize(store.log_path) > 0
        # the writer applies it in a transaction of its own (no fsync), then syncs, then empties the log
        _until(lambda: store._unsynced_since is None, "the writer's sync of the logged settlement")
        assert statements.synchronous_at_commits() == [
            ("NORMAL", "DELETE FROM message WHERE path = 'q' AND sequence_number = 1")
        ]
        assert os.path.getsize(store.log_path) == 0
        assert not store.commit_now([PutMessage(_message(9))])  # never a send: that waits for its fsync
        assert not store.commit_now([])
        with store._lock:  # the writer is committing
            assert not store.commit_now([DeleteMessage("q", 2)])
            queued = store.submit([DeleteMessage("q", 3)], durable=False)
            while store._queue.qsize():  # the writer has taken it and waits for the lock
                time.sleep(0.001)
        queued.result()
        with store._lock:
            pending = store.submit([DeleteMessage("q", 4)], durable=False)
            assert not store.commit_now([DeleteMessage("q", 2)])  # it would overtake the unit queued before it
        pending.result()
        writer_idle(store)
        assert store.commit_now([DeleteMessage("q", 2)])
        _until(lambda: store._unsynced_since is None, "the writer's sync after direct commits")
        assert store.syncs >= 1
    finally:
        store.close()
    reopened = SqliteStore(tmp_path / "oncebus.db")
    try:
        assert list(reopened.load().messages) == []
    finally:
        reopened.close()


def test_the_wal_stays_bounded_when_settlements_commit_on_the_callers_thread(tmp_path: Path) -> None:
    """Completions logged (the writer applies them) and committed on the caller's thread (a merge of properties:
    a transaction there, which never checkpoints) alike: the WAL is reused past the checkpoint limit, not grown."""
    store = SqliteStore(tmp_path / "oncebus.db")
    try:
        rounds, per_round = 36, 500  # the first third with merges, then 24 rounds of log records: past the limit
        # a body of its own each (one shared body object would be one content row, which they all reference)
        store.submit(
            [PutMessage(replace(_message(i), body=b"%06d" % i + bytes(1018))) for i in range(1, rounds * per_round + 1)]
        ).result()
        side = sqlite3.connect(store.path)  # the WAL file starts empty: its size is then what the rounds wrote
        try:
            side.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            side.close()
        sizes = []
        for r in range(rounds):
            for seq in range(r * per_round + 1, (r + 1) * per_round + 1):
                if r < rounds // 3 and seq % 50 == 0:  # not loggable: committed on this thread
                    unit: list[Op] = [UpdateMessage("q", seq, 0, 1, {"merged": True}), DeleteMessage("q", seq)]
                else:
                    unit = [DeleteMessage("q", seq)]
                writer_idle(store)
                assert store.commit_now(unit)
            _until(lambda: store._unsynced_since is None, "the writer's sync")
            sizes.append(os.path.getsize(store.wal_path))
        # past AUTOCHECKPOINT_PAGES the next commit checkpoints and the WAL starts over: it holds the limit and what
        # one sync's commit writes at most (a round's 500 completions: about 100 pages), each page a frame
        limit = (sqlite_module.AUTOCHECKPOINT_PAGES + 200) * (sqlite_module.PAGE_SIZE + 24)
        assert min(sizes) > 0, sizes
        assert max(sizes) <= limit, sizes
    finally:
        store.close()
