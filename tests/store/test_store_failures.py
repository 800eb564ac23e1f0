"""Store failures: a full disk (SQLite's max_page_count) and failed writes, at the store and the broker.

The real cause reaches the caller as a server-busy error, is logged once, nothing uncommitted is counted,
and once the store can write again sends are accepted without a restart. Nothing acknowledged is lost.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path

import pytest

from oncebus.broker import ManualClock, Message, Namespace, ServiceBusReceiveMode
from oncebus.core.errors import ServerBusyError, StoreWriteError
from oncebus.core.messages import StoredMessage
from oncebus.core.tiers import Tier, TierQuotas
from oncebus.store.base import Op, PutMessage
from oncebus.store.memory import MemoryStore
from oncebus.store.sqlite import SqliteStore

RAD = ServiceBusReceiveMode.RECEIVE_AND_DELETE
FULL = "database or disk is full"


def _fill_up(store: SqliteStore, spare_pages: int = 0) -> None:
    """Let the database grow by ``spare_pages`` pages at most: the disk is then full for it."""
    with store._lock:
        pages = store._db.execute("PRAGMA page_count").fetchone()[0]
        store._db.execute(f"PRAGMA max_page_count = {pages + spare_pages}")


def _free_space(store: SqliteStore) -> None:
    with store._lock:
        store._db.execute("PRAGMA max_page_count = 1073741823")


def _message(seq: int, size: int) -> StoredMessage:
    return StoredMessage(
        path="q", sequence_number=seq, message_id=str(seq), body=b"x" * size, enqueued_time_us=0, expires_at_us=None
    )


def test_a_full_disk_reports_the_real_cause_and_the_store_goes_on(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "oncebus.db")
    store.submit([PutMessage(_message(1, 10))]).result()
    _fill_up(store)
    with pytest.raises(StoreWriteError) as caught:
        store.submit([PutMessage(_message(2, 100_000))]).result()
    text = str(caught.value)
    assert FULL in text and str(tmp_path / "oncebus.db") in text and "free disk space" in text
    assert "rollback" not in text
    assert isinstance(caught.value, ServerBusyError)
    _free_space(store)
    store.submit([PutMessage(_message(3, 100_000))]).result()  # no restart needed
    store.close()
    assert [m[1] for m in SqliteStore(tmp_path / "oncebus.db").load().messages] == [1, 3]


async def _recovered(ns: Namespace) -> None:
    for _ in range(500):
        if ns._failure is None:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the namespace did not recover")


def test_disk_full_at_the_broker_refuses_clearly_counts_nothing_and_recovers_without_a_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def go() -> None:
        clock = ManualClock()
        store = SqliteStore(tmp_path / "oncebus.db")
        ns = await Namespace.open(store, clock, quotas=PREMIUM)  # a 500 KB batch: Premium's (1 MB a send)
        await ns.create_queue("q", requires_duplicate_detection=True)
        acked = [f"ok-{i}" for i in range(5)]
        for mid in acked:
            await ns.send("q", Message(b"small", message_id=mid))
        _fill_up(store)
        batch = [Message(b"y" * 50_000, message_id=f"big-{i}") for i in range(10)]
        for attempt in range(3):  # the first fails writing; then refused while reloading, or fails again
            with pytest.raises(StoreWriteError, match=FULL) as caught:
                await ns.send("q", batch)
            assert isinstance(caught.value, ServerBusyError)
            await _recovered(ns)
            stats = ns.stats("q")
            assert (stats.accepted, stats.active_message_count, stats.keys_held) == (5, 5, 5), attempt
        assert ns.reloads >= 1
        assert [m.message_id for m in ns.peek_messages("q", 20)] == acked
        _free_space(store)
        outcomes = await ns.send("q", batch)  # the same batch: new, not duplicates of the failed sends
        assert [o.duplicate for o in outcomes] == [False] * 10
        assert ns.stats("q").accepted == 15
        await ns.close()
        store.close()

        store = SqliteStore(tmp_path / "oncebus.db")  # a restart keeps every acknowledged message, once
        ns = await Namespace.open(store, clock, quotas=PREMIUM)
        got = await ns.receive("q", 50, receive_mode=RAD)
        assert [m.message_id for m in got] == acked + [m.message_id for m in batch]
        assert ns.stats("q").accepted == 15
        store.close()

    with caplog.at_level(logging.INFO, logger="oncebus"):
        asyncio.run(go())
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors  # logged once for the whole episode
    assert FULL in errors[0] and "oncebus.db" in errors[0]
    assert any("accepts writes again" in r.getMessage() for r in caplog.records)


PREMIUM = TierQuotas.of(Tier.PREMIUM)


class GatedStore(MemoryStore):
    """A store whose writes complete when the test says, each as it says (committed or failed)."""

    def __init__(self) -> None:
        super().__init__()
        self.gated = False
        self.pending: list[tuple[list[Op], Future[None]]] = []

    def submit(self, unit: Sequence[Op], *, durable: bool = True) -> Future[None]:
        if not self.gated:
            return super().submit(unit, durable=durable)
        future: Future[None] = Future()
        self.pending.append((list(unit), future))
        return future

    async def wait_for(self, count: int) -> None:
        for _ in range(1000):
            if len(self.pending) >= count:
                return
            await asyncio.sleep(0.001)
        raise AssertionError(f"{len(self.pending)} writes pending, not {count}")

    def finish(self, fail: Sequence[int] = ()) -> None:
        """Complete the pending writes in order; those at the positions in ``fail`` fail and store nothing."""
        pending, self.pending, self.gated = self.pending, [], False
        for position, (unit, future) in enumerate(pending):
            if position in fail:
                future.set_exception(StoreWriteError("could not write to the store: database or disk is full"))
            else:
                super().submit(unit).result()
                future.set_result(None)


def test_a_duplicate_of_a_send_whose_write_fails_is_refused_not_dropped() -> None:
    async def go() -> None:
        store = GatedStore()
        ns = await Namespace.open(store, ManualClock())
        await ns.create_queue("q", requires_duplicate_detection=True)
        store.gated = True
        original = asyncio.create_task(ns.send("q", Message(b"1", message_id="k")))
        await store.wait_for(1)
        resend = asyncio.create_task(ns.send("q", Message(b"2", message_id="k")))  # judged a duplicate of it
        other = asyncio.create_task(ns.send("q", Message(b"3", message_id="other")))
        await store.wait_for(3)
        store.finish(fail=[0])  # the original fails; the later writes commit
        with pytest.raises(StoreWriteError, match=FULL):
            await original
        with pytest.raises(StoreWriteError, match="judged a duplicate of failed to store"):
            await resend  # never acknowledged as a duplicate of something that is not stored
        assert (await other)[0].sequence_number is not None
        await _recovered(ns)
        stats = ns.stats("q")
        assert (stats.accepted, stats.duplicates_dropped) == (1, 0)  # the committed send only
        assert not (await ns.send("q", Message(b"2", message_id="k")))[0].duplicate  # the retry is stored
        got = await ns.receive("q", 5, receive_mode=RAD)
        assert [(m.message_id, m.body) for m in got] == [("other", b"3"), ("k", b"2")]
        restarted = await Namespace.open(store, ManualClock())
        assert restarted.stats("q").accepted == 2  # no later unit wrote the failed send's count back

    asyncio.run(go())


def test_a_settlement_whose_write_fails_leaves_the_message_to_be_received_again() -> None:
    async def go() -> None:
        store = GatedStore()
        ns = await Namespace.open(store, ManualClock())
        await ns.create_queue("q")
        await ns.send("q", Message(b"x", message_id="m"))
        got = await ns.receive("q")
        store.gated = True
        completing = asyncio.create_task(ns.complete("q", got[0].lock_token))  # type: ignore[arg-type]
        await store.wait_for(1)
        store.finish(fail=[0])
        with pytest.raises(StoreWriteError):
            await completing
        await _recovered(ns)
        again = await ns.receive("q")  # memory was reloaded: the message is neither lost nor stuck
        assert [m.message_id for m in again] == ["m"]
        await ns.complete("q", again[0].lock_token)  # type: ignore[arg-type]
        assert ns.stats("q").active_message_count == 0

    asyncio.run(go())


def test_a_created_queue_whose_write_fails_does_not_exist() -> None:
    async def go() -> None:
        store = GatedStore()
        ns = await Namespace.open(store, ManualClock())
        store.gated = True
        creating = asyncio.create_task(ns.create_queue("q"))
        await store.wait_for(1)
        store.finish(fail=[0])
        with pytest.raises(StoreWriteError):
            await creating
        await _recovered(ns)
        assert ns.list_queues() == []  # no sends accepted to a queue a restart would not know
        await ns.create_queue("q")
        assert [q.name for q in (await Namespace.open(store, ManualClock())).list_queues()] == ["q"]

    asyncio.run(go())


def test_one_failing_unit_does_not_fail_the_others_committed_with_it(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "oncebus.db")
    transactions: list[int] = []
    run_transaction = store._transaction

    def counted(ops: list[Op], durable: bool = True) -> None:
        transactions.append(len(ops))
        run_transaction(ops, durable)

    store._transaction = counted  # type: ignore[method-assign]
    with store._lock:  # the writer takes the first unit, then waits: the rest queue up as one group
        first = store.submit([PutMessage(_message(1, 10))])
        while store._queue.qsize():  # until the writer has taken it (it then waits for the lock)
            time.sleep(0.001)
        time.sleep(0.05)  # and found nothing more queued
        futures = [store.submit([PutMessage(_message(seq, 10))]) for seq in range(2, 12)]
        bad = _message(99, 10)
        bad.path = None  # type: ignore[assignment]  # NOT NULL: this unit cannot be written
        futures.insert(5, store.submit([PutMessage(bad)]))
    first.result()
    with pytest.raises(StoreWriteError, match="NOT NULL constraint failed"):
        futures[5].result()
    assert all(f.exception() is None for i, f in enumerate(futures) if i != 5)
    assert transactions == [1, 11] + [1] * 11  # the group failed as a whole, then each unit was tried alone
    store.close()
    assert [m[1] for m in SqliteStore(tmp_path / "oncebus.db").load().messages] == list(range(1, 12))


def test_deleted_store_files_are_recreated_from_the_open_database(tmp_path: Path) -> None:
    path = tmp_path / "oncebus.db"
    store = SqliteStore(path)
    store.submit([PutMessage(_message(1, 10))]).result()
    with store._lock:  # deleted while the writer is not checking (it checks every second when idle)
        for name in ("oncebus.db", "oncebus.db-wal", "oncebus.db-shm"):
            (tmp_path / name).unlink()
        store.submit([PutMessage(_message(2, 10))])  # recreated before this commit
    for _ in range(50):
        if store.recreated == 1 and store.units == 2:
            break
        time.sleep(0.05)
    assert store.recreated == 1 and path.exists()
    with store._lock:
        (tmp_path / "oncebus.db-wal").unlink()  # the WAL alone: what it held is not in the main file yet
        store.submit([PutMessage(_message(3, 10))])
    for _ in range(50):
        if store.recreated == 2 and store.units == 3:
            break
        time.sleep(0.05)
    assert store.recreated == 2
    (tmp_path / "oncebus.db").unlink()
    for _ in range(50):  # idle: the writer checks every second
        if store.recreated == 3:
            break
        time.sleep(0.1)
    assert store.recreated == 3 and path.exists()
    store._db.execute("SELECT 1")  # still usable
    # what a restart after SIGKILL would find (the store stays open, and owns its file: read a copy of the files)
    (tmp_path / "copy").mkdir()
    for name in ("oncebus.db", "oncebus.db-wal"):
        if (tmp_path / name).exists():
            shutil.copyfile(tmp_path / name, tmp_path / "copy" / name)
    copy = SqliteStore(tmp_path / "copy" / "oncebus.db")
    assert [m[1] for m in copy.load().messages] == [1, 2, 3]
    copy.close()
    store.close()


def test_a_store_file_replaced_under_the_store_is_not_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "oncebus.db"
    store = SqliteStore(path)
    store.submit([PutMessage(_message(1, 10))]).result()
    (tmp_path / "foreign.db").write_bytes(b"someone else's file")
    os.replace(tmp_path / "foreign.db", path)
    with pytest.raises(StoreWriteError, match="replaced by another one while oncebus ran"):
        store.submit([PutMessage(_message(2, 10))]).result()
    assert path.read_bytes() == b"someone else's file"
    store.close()


def test_a_deleted_store_file_that_cannot_be_recreated_refuses_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SqliteStore(tmp_path / "oncebus.db")
    store.submit([PutMessage(_message(1, 10))]).result()

    def no_space() -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "_recreate", no_space)
    (tmp_path / "oncebus.db").unlink()
    futures = [store.submit([PutMessage(_message(seq, 10))]) for seq in (2, 3)]
    for future in futures:  # never acknowledged into a file that is gone
        with pytest.raises(StoreWriteError, match="deleted while oncebus ran and could not be recreated"):
            future.result()
    store.close()
