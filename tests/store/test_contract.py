"""The Store protocol's contract (store/base.py), run against both durable stores: SQLite and PostgreSQL.

Each test opens a store, writes through ``submit``, and reads back through ``load`` and ``read_messages``,
mostly after closing and opening the store again (what a restart sees).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import wait
from pathlib import Path
from typing import Any

import psycopg
import pytest

from oncebus.broker import ManualClock, Message, Namespace
from oncebus.core.errors import StoreError, StoreWriteError
from oncebus.core.keys import id_text
from oncebus.core.messages import MessageState, StoredMessage
from oncebus.core.timeutil import us_to_datetime
from oncebus.store.base import (
    AddCounters,
    DeleteEntity,
    DeleteMessage,
    MoveMessage,
    PruneDedupKeys,
    PutDedupKey,
    PutEntity,
    PutMessage,
    PutRules,
    PutSessionState,
    Snapshot,
    UpdateMessage,
)
from oncebus.store.postgres import PostgresStore
from oncebus.store.postgres_layout import SCHEMA_VERSION as PG_SCHEMA_VERSION
from oncebus.store.sqlite import SCHEMA_VERSION as SQLITE_SCHEMA_VERSION
from oncebus.store.sqlite import SqliteStore
from tests.postgres_cluster import PostgresCluster

Store = SqliteStore | PostgresStore


class Stores:
    """Opens the same durable store again, as a restarted process would; closes what it opened."""

    def __init__(self, kind: str, location: str) -> None:
        self.kind = kind
        self.location = location
        self._open: list[Store] = []

    def open(self) -> Store:
        store: Store = SqliteStore(self.location) if self.kind == "sqlite" else PostgresStore(self.location)
        self._open.append(store)
        return store

    def reopen(self, store: Store) -> Store:
        store.close()
        self._open.remove(store)
        return self.open()

    def close(self) -> None:
        for store in self._open:
            store.close()

    def set_schema_version(self, version: int) -> None:
        """Mark the (closed) store as written by another layout version."""
        if self.kind == "sqlite":
            import sqlite3

            db = sqlite3.connect(self.location)
            db.execute(f"PRAGMA user_version = {version}")
            db.commit()
            db.close()
        else:
            with psycopg.connect(self.location, autocommit=True) as db:
                db.execute("UPDATE oncebus_schema SET version = %s", (version,))


@pytest.fixture(params=["sqlite", "postgres"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stores]:
    if request.param == "sqlite":
        factory = Stores("sqlite", str(tmp_path / "oncebus.db"))
    else:
        cluster: PostgresCluster = request.getfixturevalue("postgres_cluster")
        factory = Stores("postgres", cluster.fresh_url())
    yield factory
    factory.close()


def _message(seq: int, path: str | None = "q", **fields: Any) -> StoredMessage:
    return StoredMessage(
        path=path,  # type: ignore[arg-type]
        sequence_number=seq,
        message_id=fields.pop("message_id", f"id-{seq}"),
        body=fields.pop("body", b"x%d" % seq),
        enqueued_time_us=fields.pop("enqueued_time_us", 1000 + seq),
        expires_at_us=fields.pop("expires_at_us", None),
        **fields,
    )


_Q = PutEntity("q", "queue", {"requires_duplicate_detection": True, "max_delivery_count": 10})


def _rows(snapshot: Snapshot) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in snapshot.messages]


def _keys(snapshot: Snapshot) -> dict[tuple[str, str], int]:
    """The keys in effect: a key given several rows counts with its latest (the contract: the latest last)."""
    effective: dict[tuple[str, str], int] = {}
    for key in snapshot.dedup_keys:
        effective[(key.entity, key.key)] = key.first_accepted_us
    return effective


def test_messages_round_trip_with_their_content_and_state(stores: Stores) -> None:
    store = stores.open()
    wire = b"\x00Sp\xc0\x01\x00" + b"\x00Su\xa0\x05hello"  # a body that is a slice of its wire encoding
    session = "s\x00one"  # texts a client chooses may hold NUL
    messages = [
        _message(1, body=b"hello", wire=wire),
        _message(2, message_id=uuid.UUID(int=7), session_id=session, application_properties={"n": 1, "t": "x"}),
        _message(3, message_id=b"\x01\xff", expires_at_us=99_000, body=b"", subject="s", correlation_id="c"),
        _message(4, message_id=42, body=b"\x00" * 3000, wire=b"w" * 10),  # a body that is not part of its wire
    ]
    store.submit([_Q, *(PutMessage(m) for m in messages)]).result()
    store.submit(
        [
            UpdateMessage("q", 2, int(MessageState.DEFERRED), 3, application_properties={"t": "changed", "u": True}),
            MoveMessage("q", 3, "q/$deadletterqueue", int(MessageState.ACTIVE), "why\x00", "what", "q"),
            DeleteMessage("q", 4),
        ],
        durable=False,
    ).result()
    store = stores.reopen(store)
    snapshot = store.load()
    assert [e.path for e in snapshot.entities] == ["q"]
    assert snapshot.entities[0].properties == _Q.properties
    assert _rows(snapshot) == [
        ("q", 1, 0, 0, 1001, None, len(wire), None),
        ("q", 2, int(MessageState.DEFERRED), 3, 1002, None, messages[1].size, session),
        ("q/$deadletterqueue", 3, 0, 0, 1003, 99_000, messages[2].size, None),
    ]
    got = store.read_messages("q", [1, 2, 3, 4])
    assert sorted(got) == [1, 2]
    assert got[1].body == b"hello" and got[1].wire == wire and got[1].message_id == "id-1"
    assert got[2].message_id == uuid.UUID(int=7) and got[2].session_id == session
    assert got[2].application_properties == {"n": 1, "t": "changed", "u": True}
    # failed before: the abandon's properties were stored, yet receivers got the sender's encoding without them
    # (found by the Java SDK's abandon with properties to modify: tests/java, test_peek_lock_settlement)
    assert got[2].rewritten == {"application_properties"} and got[1].rewritten == frozenset()
    dead = store.read_messages("q/$deadletterqueue", [3])[3]
    assert dead.message_id == b"\x01\xff" and dead.body == b"" and dead.subject == "s" and dead.correlation_id == "c"
    assert (dead.dead_letter_reason, dead.dead_letter_error_description, dead.dead_letter_source) == (
        "why\x00",
        "what",
        "q",
    )
    store.submit([PutMessage(_message(4, message_id=42, body=b"\x00" * 3000, wire=b"w" * 10))]).result()
    assert store.read_messages("q", [4])[4].body == b"\x00" * 3000  # a body that is not part of its wire
    store.submit([PutMessage(_message(4, body=b"again"))]).result()  # written again: replaced
    assert store.read_messages("q", [4])[4].body == b"again"


def test_dedup_keys_sessions_rules_and_counters_survive_a_reopen(stores: Stores) -> None:
    store = stores.open()
    typed = id_text(uuid.UUID(int=1))  # starts with NUL
    store.submit(
        [
            _Q,
            PutEntity("plain", "queue", {}),  # no duplicate detection: its keys are not loaded
            PutEntity("t", "topic", {"requires_duplicate_detection": True}),
            PutEntity("t/subscriptions/s", "subscription", {}),
            PutRules("t/subscriptions/s", [{"name": "$Default"}]),
            PutMessage(_message(1), dedup_key=("q", "a", 10)),
            PutDedupKey("q", typed, 11),
            PutDedupKey("t", "k", 12),
            PutDedupKey("plain", "p", 13),
            PutSessionState("q", "s\x00", b"state-1"),
            PutSessionState("q", "other", b"x"),
            AddCounters("q", 2, {"accepted": 1}),
        ]
    ).result()
    store.submit(
        [
            PutDedupKey("q", "a", 50),  # accepted again, later: its time is the later one
            PutSessionState("q", "s\x00", b"state-2"),
            PutSessionState("q", "other", None),
            AddCounters("q", 5, {"accepted": 2, "duplicates": 1}),
            AddCounters("q", 3, {"accepted": 1}),  # the next sequence number never shrinks
            PutRules("t/subscriptions/s", []),
        ]
    ).result()
    store = stores.reopen(store)
    snapshot = store.load()
    assert _keys(snapshot) == {("q", "a"): 50, ("q", typed): 11, ("t", "k"): 12}
    assert snapshot.newest_key_us >= 50
    assert [(s.path, s.session_id, s.state) for s in snapshot.session_states] == [("q", "s\x00", b"state-2")]
    assert snapshot.counters["q"].next_sequence_number == 5
    assert snapshot.counters["q"].counters == {"accepted": 4, "duplicates": 1}
    assert snapshot.rules == {"t/subscriptions/s": []}
    assert [(k.key, k.first_accepted_us) for k in snapshot.keys_of("t")] == [("k", 12)]
    store.submit([PruneDedupKeys("q", 50)]).result()  # keys first accepted before 50 go
    assert _keys(store.load()) == {("q", "a"): 50, ("t", "k"): 12}


def test_deleting_an_entity_takes_what_it_owns_and_nothing_else(stores: Stores) -> None:
    store = stores.open()
    ops: list[Any] = []
    for path, kind in (("orders", "topic"), ("orders/eu", "queue"), ("orders0", "queue")):
        ops.append(PutEntity(path, kind, {"requires_duplicate_detection": True}))
        ops.append(PutDedupKey(path, "k", 1))
        ops.append(AddCounters(path, 2, {"accepted": 1}))
    ops += [
        PutEntity("orders/subscriptions/a", "subscription", {}),
        PutRules("orders/subscriptions/a", []),
        PutMessage(_message(1, "orders/subscriptions/a")),
        PutMessage(_message(2, "orders/subscriptions/a/$deadletterqueue")),
        PutMessage(_message(3, "orders/eu")),
        PutMessage(_message(4, "orders/eu/$deadletterqueue")),
        PutMessage(_message(5, "orders0")),
        PutSessionState("orders/subscriptions/a", "s", b"1"),
        PutSessionState("orders/eu", "s", b"1"),
    ]
    store.submit(ops).result()
    store.submit([DeleteEntity("orders")]).result()
    store = stores.reopen(store)
    snapshot = store.load()
    assert sorted(e.path for e in snapshot.entities) == ["orders/eu", "orders0"]
    assert [row[:2] for row in _rows(snapshot)] == [("orders/eu", 3), ("orders/eu/$deadletterqueue", 4), ("orders0", 5)]
    assert sorted(_keys(snapshot)) == [("orders/eu", "k"), ("orders0", "k")]
    assert sorted(snapshot.counters) == ["orders/eu", "orders0"]
    assert [s.path for s in snapshot.session_states] == ["orders/eu"]
    assert snapshot.rules == {}


def test_queued_units_share_commits_and_all_land(stores: Stores) -> None:
    store = stores.open()
    store.submit([_Q]).result()
    futures = [store.submit([PutMessage(_message(i), dedup_key=("q", str(i), i))]) for i in range(1, 2001)]
    wait(futures)
    assert all(f.exception() is None for f in futures)
    assert store.units == 2001
    assert store.commits < 2000  # queued units shared transactions
    store = stores.reopen(store)
    snapshot = store.load()
    assert len(_rows(snapshot)) == 2000 and len(_keys(snapshot)) == 2000


def test_a_failing_unit_fails_alone_and_stores_nothing(stores: Stores) -> None:
    store = stores.open()
    store.submit([_Q]).result()
    futures = [store.submit([PutMessage(_message(i), dedup_key=("q", str(i), i))]) for i in range(1, 40)]
    bad = store.submit([PutDedupKey("q", "bad", 5), PutMessage(_message(100, path=None))])
    futures += [store.submit([PutMessage(_message(i), dedup_key=("q", str(i), i))]) for i in range(40, 80)]
    with pytest.raises(StoreWriteError, match=r"(?i)null"):
        bad.result()
    assert all(f.exception() is None for f in futures)  # the units sharing its group landed
    store.submit([PutDedupKey("q", "later", 6)]).result()  # the next unit is tried afresh
    store = stores.reopen(store)
    snapshot = store.load()
    assert [row[1] for row in _rows(snapshot)] == list(range(1, 80))
    keys = _keys(snapshot)
    assert ("q", "bad") not in keys and ("q", "later") in keys


def test_settlements_confirmed_before_their_flush_are_kept(stores: Stores) -> None:
    store = stores.open()
    store.submit([_Q, *(PutMessage(_message(i)) for i in range(1, 11))]).result()
    for i in range(1, 6):
        store.submit([DeleteMessage("q", i), AddCounters("q", 11, {"completed": 1})], durable=False).result()
    store = stores.reopen(store)
    snapshot = store.load()
    assert [row[1] for row in _rows(snapshot)] == list(range(6, 11))
    assert snapshot.counters["q"].counters == {"completed": 5}


def test_message_rows_are_read_as_the_store_was_at_load(stores: Stores) -> None:
    store = stores.open()
    store.submit([_Q, *(PutMessage(_message(i)) for i in range(1, 6))]).result()
    snapshot = store.load()
    store.submit([PutMessage(_message(6)), DeleteMessage("q", 1)]).result()  # while the rows are being read
    assert [row[1] for row in _rows(snapshot)] == [1, 2, 3, 4, 5]
    assert sorted(store.read_messages("q", [1, 6])) == [6]  # content is read as it is now


def test_a_store_written_by_a_newer_schema_is_refused_naming_both_versions(stores: Stores) -> None:
    stores.open().close()
    stores._open.clear()
    current = SQLITE_SCHEMA_VERSION if stores.kind == "sqlite" else PG_SCHEMA_VERSION
    stores.set_schema_version(current + 1)
    with pytest.raises(StoreError) as refused:
        stores.open()
    message = str(refused.value)
    assert "newer oncebus" in message and f"schema {current + 1}" in message and f"up to {current}" in message
    assert "\n" not in message


def _run(coro: Callable[[], Any]) -> Any:
    return asyncio.run(coro())


def test_a_namespace_keeps_its_dedup_history_across_a_restart_within_the_window(stores: Stores) -> None:
    async def go() -> None:
        clock = ManualClock()
        store = stores.open()
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
        store = stores.reopen(store)
        ns2 = await Namespace.open(store, clock)
        assert ns2.stats("q").keys_held == 1 and ns2.stats("q").active_message_count == 3
        assert (await ns2.send("q", Message(b"x", message_id="fresh")))[0].duplicate
        assert not (await ns2.send("q", Message(b"x", message_id="old")))[0].duplicate
        got = await ns2.receive("q", 10)
        assert [m.message_id for m in got] == ["old", "new", "fresh", "old"]
        await ns2.close()

    _run(go)


def test_a_session_state_keeps_the_time_it_was_set_across_a_restart(stores: Stores) -> None:
    """``get-message-sessions`` with a last-updated time: a state set before a restart keeps its own time."""

    async def go() -> None:
        clock = ManualClock()
        store = stores.open()
        ns = await Namespace.open(store, clock)
        await ns.create_queue("s", requires_session=True)
        await ns.send("s", Message(b"1", session_id="s1"))
        session = await ns.accept_session("s", "s1")
        set_at = clock.now_us()
        await ns.set_session_state(session, b"state")
        await ns.close()
        clock.advance(10)  # the restart
        store = stores.reopen(store)
        assert [(s.session_id, s.updated_us) for s in store.load().session_states] == [("s1", set_at)]
        ns = await Namespace.open(store, clock)
        assert ns.list_sessions("s", state_updated_after=us_to_datetime(set_at - 1)) == ["s1"]
        assert ns.list_sessions("s", state_updated_after=us_to_datetime(set_at + 1_000_000)) == []
        await ns.close()

    _run(go)


def test_a_failing_settlement_stores_nothing_and_the_next_one_lands(stores: Stores) -> None:
    store = stores.open()
    dead = "q/$deadletterqueue"
    store.submit([_Q, PutMessage(_message(1)), PutMessage(_message(2)), PutMessage(_message(1, dead))]).result()
    clash = MoveMessage("q", 1, dead, int(MessageState.ACTIVE), "r\x00", None, "q")  # dead/1 is taken
    failed = store.submit([DeleteMessage("q", 2), clash, AddCounters("q", 3, {"completed": 1})], durable=False)
    with pytest.raises(StoreWriteError):
        failed.result()
    store.submit([UpdateMessage("q", 2, int(MessageState.DEFERRED), 1), DeleteMessage(dead, 1)], durable=False).result()
    store.submit([clash], durable=False).result()
    store = stores.reopen(store)
    snapshot = store.load()
    assert [row[:4] for row in _rows(snapshot)] == [("q", 2, int(MessageState.DEFERRED), 1), (dead, 1, 0, 0)]
    assert "q" not in snapshot.counters  # the failed unit's counts went with it
    assert store.read_messages(dead, [1])[1].dead_letter_reason == "r\x00"


def test_a_clean_stop_keeps_dedup_images_so_a_start_replays_only_the_keys_since(stores: Stores) -> None:
    async def go() -> None:
        clock = ManualClock()
        store = stores.open()
        ns = await Namespace.open(store, clock)
        await ns.create_queue("q", requires_duplicate_detection=True, duplicate_detection_history_time_window="PT1H")
        await ns.create_queue("gone", requires_duplicate_detection=True)
        for i in range(50):
            await ns.send("q", Message(b"x", message_id=f"a-{i}"))
        await ns.send("gone", Message(b"x", message_id="g"))
        clock.advance(1)  # the images' mark is the time of the stop: keys accepted at it are read again
        await ns.close()  # a clean stop: the images are kept
        store = stores.reopen(store)
        clock.advance(1)
        ns = await Namespace.open(store, clock)
        assert store.keys_read == 0  # every key came from the images
        assert (await ns.send("q", Message(b"x", message_id="a-7")))[0].duplicate
        for i in range(5):
            await ns.send("q", Message(b"x", message_id=f"b-{i}"))
        await ns.delete_queue("gone")
        await ns.create_queue("gone", requires_duplicate_detection=True)
        store = stores.reopen(store)  # a crash: the namespace never closed, no new images
        ns = await Namespace.open(store, clock)
        assert store.keys_read == 5  # the images of the last clean stop, then the keys accepted since
        assert ns.stats("q").keys_held == 55
        assert (await ns.send("q", Message(b"x", message_id="a-0")))[0].duplicate
        assert (await ns.send("q", Message(b"x", message_id="b-4")))[0].duplicate
        assert not (await ns.send("gone", Message(b"x", message_id="g")))[0].duplicate  # a new queue of that name
        await ns.close()

    _run(go)


def test_a_checkpoint_while_serving_bounds_what_a_crash_restart_replays(stores: Stores) -> None:
    async def go() -> None:
        clock = ManualClock()
        store = stores.open()
        ns = await Namespace.open(store, clock)
        await ns.create_queue("q", requires_duplicate_detection=True, duplicate_detection_history_time_window="PT1H")
        for i in range(40):
            await ns.send("q", Message(b"x", message_id=f"a-{i}"))
        clock.advance(1)
        assert ns.checkpoint_dedup()  # a forked child writes the images; the store keeps them behind the sends
        assert store.wait_checkpoint(30) and store.checkpoints == 1
        for i in range(3):
            await ns.send("q", Message(b"x", message_id=f"b-{i}"))
        store = stores.reopen(store)  # a crash: no clean stop
        ns = await Namespace.open(store, clock)
        assert store.keys_read == 3  # the checkpoint's images, then the keys accepted since its mark
        assert ns.stats("q").keys_held == 43
        assert (await ns.send("q", Message(b"x", message_id="a-39")))[0].duplicate
        assert (await ns.send("q", Message(b"x", message_id="b-2")))[0].duplicate
        await ns.close()

    _run(go)
