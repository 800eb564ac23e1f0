from __future__ import annotations

import asyncio
import sqlite3
from concurrent.futures import wait
from pathlib import Path

import pytest

from oncebus.broker import ManualClock, Message, Namespace
from oncebus.core.errors import StoreWriteError
from oncebus.core.messages import StoredMessage
from oncebus.store.base import PutDedupKey, PutEntity, PutMessage
from oncebus.store.memory import MemoryStore
from oncebus.store.sqlite import SqliteStore


def _message(seq: int, path: str | None = "q") -> StoredMessage:
    return StoredMessage(
        path=path,
        sequence_number=seq,
        message_id=str(seq),
        body=b"x",
        enqueued_time_us=0,  # type: ignore[arg-type]
        expires_at_us=None,
    )


_Q = PutEntity("q", "queue", {"requires_duplicate_detection": True})  # keys are loaded for such entities only


def test_wal_mode_and_group_commit(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "db")
    store.submit([_Q]).result()
    assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    futures = [store.submit([PutMessage(_message(i)), PutDedupKey("q", str(i), i)]) for i in range(2000)]
    wait(futures)
    assert all(f.exception() is None for f in futures)
    assert store.units == 2001
    assert store.commits < 2000  # queued units shared transactions
    store.close()
    snapshot = SqliteStore(tmp_path / "db").load()
    assert len(list(snapshot.messages)) == 2000 and len(list(snapshot.dedup_keys)) == 2000


def test_a_failing_unit_stores_nothing_and_the_next_unit_is_tried_afresh(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "db")
    store.submit([_Q, PutMessage(_message(1))]).result()
    bad = store.submit([PutDedupKey("q", "k", 5), PutMessage(_message(2, path=None))])
    with pytest.raises(StoreWriteError, match="NOT NULL constraint failed"):
        bad.result()
    store.submit([PutDedupKey("q", "later", 6)]).result()
    store.close()
    snapshot = SqliteStore(tmp_path / "db").load()
    assert [m[1] for m in snapshot.messages] == [1]
    assert [k.key for k in snapshot.dedup_keys] == ["later"]


class _FailingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.fail = False

    def submit(self, unit, *, durable=True):  # type: ignore[no-untyped-def]
        if self.fail and unit:
            from concurrent.futures import Future

            future: Future[None] = Future()
            future.set_exception(OSError("disk full"))
            return future
        return super().submit(unit, durable=durable)


def test_broker_refuses_then_recovers_when_the_store_fails() -> None:
    async def go() -> None:
        store = _FailingStore()
        ns = await Namespace.open(store, ManualClock())
        await ns.create_queue("q", requires_duplicate_detection=True)
        store.fail = True
        with pytest.raises(StoreWriteError, match="disk full"):
            await ns.send("q", Message(b"x", message_id="a"))
        with pytest.raises(StoreWriteError, match=r"disk full.*try again shortly"):
            await ns.send("q", Message(b"x", message_id="b"))  # refused, saying why, until reloaded
        store.fail = False
        await _recovered(ns)
        assert ns.stats("q").active_message_count == 0 and ns.stats("q").accepted == 0
        assert not (await ns.send("q", Message(b"x", message_id="a")))[0].duplicate  # the failed send kept no key
        assert ns.stats("q").active_message_count == 1
        restarted = await Namespace.open(store, ManualClock())
        assert restarted.stats("q").active_message_count == 1 and restarted.stats("q").accepted == 1

    asyncio.run(go())


async def _recovered(ns: Namespace) -> None:
    for _ in range(200):
        if ns._failure is None:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the namespace did not recover")


def test_history_is_pruned_and_rebuilt_within_the_window(tmp_path: Path) -> None:
    async def go() -> None:
        clock = ManualClock()
        store = SqliteStore(tmp_path / "db")
        ns = await Namespace.open(store, clock)
        await ns.create_queue("q", requires_duplicate_detection=True, duplicate_detection_history_time_window="PT20S")
        await ns.send("q", Message(b"x", message_id="old"))
        clock.advance(15)
        await ns.send("q", Message(b"x", message_id="new"))
        clock.advance(70)
        await ns.send("q", Message(b"x", message_id="fresh"))
        clock.advance(5)
        ns.tick()  # prunes keys older than the window
        await ns.close()
        store.close()
        db = sqlite3.connect(tmp_path / "db")
        assert [key for (key,) in db.execute("SELECT key FROM dedup_key")] == ["fresh"]
        db.close()
        store2 = SqliteStore(tmp_path / "db")
        ns2 = await Namespace.open(store2, clock)
        assert ns2.stats("q").keys_held == 1
        assert (await ns2.send("q", Message(b"x", message_id="fresh")))[0].duplicate
        store2.close()

    asyncio.run(go())
