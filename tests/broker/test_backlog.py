"""A backlog across a restart: every message delivered exactly once, its content read back from the store.

The broker holds an entry per message and reads a message's content (body, wire encoding, properties)
when it delivers it, from a bounded cache of recent sends or from the store: these tests run with the
cache and without it (every delivery reads the store), through a restart with messages waiting,
settled, abandoned, deferred, dead-lettered and still locked when the broker stopped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from oncebus.broker import ManualClock, Message, Namespace, ServiceBusReceiveMode
from oncebus.broker.contents import DEFAULT_CACHE_BYTES
from oncebus.store.sqlite import SqliteStore

COUNT = 2_000
T0 = 1_700_000_000_000_000


def _body(i: int) -> bytes:
    return f"body-{i}-".encode() * (1 + i % 7)


def _message(i: int) -> Message:
    if i % 3 == 0:  # as the AMQP front end gives it: the whole encoding, the body inside it
        body = _body(i)
        return Message(body, message_id=f"m{i}", wire=b"\x00Sp\x45" + b"\x00Su\xa0" + bytes([len(body)]) + body)
    return Message(_body(i), message_id=f"m{i}", application_properties={"i": i}, subject=f"s{i % 5}")


async def _open(path: Path, clock: ManualClock, cache_bytes: int) -> tuple[SqliteStore, Namespace]:
    store = SqliteStore(path)
    ns = await Namespace.open(store, clock)
    ns._contents.max_bytes = cache_bytes
    return store, ns


@pytest.mark.parametrize("cache_bytes", [0, DEFAULT_CACHE_BYTES], ids=["store-reads", "cache"])
def test_a_restart_with_a_backlog_delivers_every_message_exactly_once(tmp_path: Path, cache_bytes: int) -> None:
    path = tmp_path / "oncebus.db"
    clock = ManualClock(T0)
    completed: dict[str, bytes] = {}
    completed_per_subscription: dict[str, list[str]] = {"a": [], "b": []}

    def settle_once(received: list[object], into: dict[str, bytes]) -> None:
        for m in received:
            assert m.message_id not in into, f"{m.message_id} delivered again after it was completed"  # type: ignore[attr-defined]
            into[m.message_id] = m.body  # type: ignore[attr-defined]

    async def before() -> None:
        store, ns = await _open(path, clock, cache_bytes)
        await ns.create_queue("q", requires_duplicate_detection=True, max_delivery_count=3)
        await ns.create_topic("t")
        for name in ("a", "b"):
            await ns.create_subscription("t", name)
        for start in range(0, COUNT, 250):
            batch = [_message(i) for i in range(start, start + 250)]
            await ns.send("q", batch)
            await ns.send("t", batch)
        got = await ns.receive("q", 400)
        assert [m.message_id for m in got] == [f"m{i}" for i in range(400)]
        assert all(m.body == _body(i) for i, m in enumerate(got))
        for m in got[:200]:  # completed: never again
            await ns.complete("q", m.lock_token)
        settle_once(got[:200], completed)
        for m in got[200:250]:  # abandoned: back, delivery count 1
            await ns.abandon("q", m.lock_token, {"abandoned": True})
        for m in got[250:260]:  # deferred: only by sequence number
            await ns.defer("q", m.lock_token)
        for m in got[260:270]:
            await ns.dead_letter("q", m.lock_token, reason="bad", error_description="very")
        # got[270:400] stay locked: the restart loses their locks and they come back
        sub = await ns.receive("t/Subscriptions/a", 100, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE)
        completed_per_subscription["a"] += [m.message_id for m in sub]
        await ns.close()
        store.close()

    async def after() -> None:
        clock.advance(1)
        store, ns = await _open(path, clock, cache_bytes)
        deferred = {m.sequence_number for m in ns.peek_messages("q", COUNT) if m.state.name == "DEFERRED"}
        assert len(deferred) == 10
        for m in await ns.receive_deferred_messages("q", sorted(deferred)):
            assert m.body == completed.get(m.message_id, m.body)
            await ns.complete("q", m.lock_token)
            settle_once([m], completed)
        while got := await ns.receive("q", 300):
            for m in got:
                i = int(m.message_id[1:])
                assert m.body == _body(i)
                if i % 3 != 0:
                    assert m.application_properties["i"] == i and m.subject == f"s{i % 5}"
                if 200 <= i < 250:
                    assert m.delivery_count == 2 and m.application_properties["abandoned"] is True
                await ns.complete("q", m.lock_token)
            settle_once(got, completed)
        dead = await ns.receive("q/$DeadLetterQueue", 100)
        assert sorted(int(m.message_id[1:]) for m in dead) == list(range(260, 270))
        assert all(m.dead_letter_reason == "bad" and m.body == _body(int(m.message_id[1:])) for m in dead)
        for m in dead:
            await ns.complete("q/$DeadLetterQueue", m.lock_token)
        for name in ("a", "b"):
            while got := await ns.receive(f"t/Subscriptions/{name}", 500):
                for m in got:
                    assert m.body == _body(int(m.message_id[1:]))
                    await ns.complete(f"t/Subscriptions/{name}", m.lock_token)
                completed_per_subscription[name] += [m.message_id for m in got]
        assert (await ns.send("q", _message(5)))[0].duplicate  # the dedup history survived too
        await ns.close()
        store.close()

    asyncio.run(before())
    asyncio.run(after())
    assert sorted(completed) == sorted(f"m{i}" for i in range(COUNT) if not 260 <= i < 270)
    for name, ids in completed_per_subscription.items():
        assert sorted(ids) == sorted(f"m{i}" for i in range(COUNT)), name
        assert len(ids) == len(set(ids)), name
    reopened = SqliteStore(path)
    assert reopened._db.execute("SELECT count(*) FROM message").fetchone()[0] == 0
    assert reopened._db.execute("SELECT count(*) FROM content").fetchone()[0] == 0  # no content left behind
    reopened.close()


def test_a_message_dead_lettered_in_the_background_reads_back_before_the_move_is_committed(tmp_path: Path) -> None:
    """Lock expiry past max_delivery_count dead-letters in a background write: a receiver of the dead-letter
    queue may ask for the message before that write lands; it gets it, with its reason, from where it was."""

    async def go() -> None:
        clock = ManualClock(T0)
        store, ns = await _open(tmp_path / "oncebus.db", clock, 0)
        await ns.create_queue("q", max_delivery_count=1, lock_duration="PT5S")
        await ns.send("q", Message(b"payload", message_id="x"))
        assert len(await ns.receive("q")) == 1
        clock.advance(6)
        ns.tick()  # the lock expires: dead-lettered, the move submitted, not awaited
        (dead,) = await ns.receive("q/$DeadLetterQueue", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE)
        assert (dead.body, dead.dead_letter_reason) == (b"payload", "MaxDeliveryCountExceeded")
        await ns.close()
        store.close()

    asyncio.run(go())


def test_a_dead_letter_move_committed_between_the_two_reads_is_still_found(tmp_path: Path) -> None:
    """The race behind a rare failure of the test above: the reader misses the message at its new place (the
    move is not committed yet), the move commits, then the reader misses it at the old place too. The writer is
    held so the commit lands exactly between the two reads; the message must still be delivered, never dropped."""

    async def go() -> None:
        clock = ManualClock(T0)
        store, ns = await _open(tmp_path / "oncebus.db", clock, 0)
        await ns.create_queue("q", max_delivery_count=1, lock_duration="PT5S")
        await ns.send("q", Message(b"payload", message_id="x"))
        assert len(await ns.receive("q")) == 1
        read = store.read_messages
        reads: list[str] = []
        held = [False]  # whether this test holds the writer's lock (once released, the writer may hold it)

        def read_with_the_commit_in_between(path: str, sequence_numbers: Sequence[int]) -> dict[int, Any]:
            reads.append(path)
            if path == "q" and held[0]:  # the old place: let the move commit first, then read
                held[0] = False
                store._lock.release()
                store.submit([]).result(timeout=10)  # the writer has committed everything before it
            return read(path, sequence_numbers)

        store.read_messages = read_with_the_commit_in_between  # type: ignore[method-assign]
        store._lock.acquire()  # the writer cannot commit the move until the reader has missed the new place
        held[0] = True
        try:
            clock.advance(6)
            ns.tick()  # the lock expires: dead-lettered, the move submitted, not committed
            got = await ns.receive("q/$DeadLetterQueue", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE)
        finally:
            if held[0]:
                store._lock.release()
        assert reads[:2] == ["q/$deadletterqueue", "q"]
        assert [(m.body, m.dead_letter_reason) for m in got] == [(b"payload", "MaxDeliveryCountExceeded")]
        await ns.close()
        store.close()

    asyncio.run(go())


def test_available_order_survives_out_of_order_arrivals_and_a_sequence_number_added_again() -> None:
    """Entries arriving out of (enqueued time, sequence number) order wait in a heap beside the in-order run;
    one added again under the same key (a reload of the same message) never compares entries."""
    from oncebus.broker.receivable import Entry, Receivable, ReceivableSettings
    from oncebus.core.messages import MessageState

    receivable = Receivable("q", ReceivableSettings(5_000_000, 10, False, False, 1 << 30))
    for seq, enqueued in [(1, 10), (2, 20), (3, 15), (4, 15), (5, 30)]:
        receivable.add(Entry(seq, MessageState.ACTIVE, enqueued, None, 1, None), 0)
    receivable.add(Entry(3, MessageState.ACTIVE, 15, None, 1, None), 0)  # the same again: replaces it
    order = []
    while (entry := receivable.take()) is not None:
        order.append(entry.sequence_number)
    assert order == [1, 3, 4, 2, 5]
    assert receivable.size_bytes == 5 and receivable.counts()["active"] == 5


def test_a_backlog_restored_in_the_background_is_delivered_in_order_exactly_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``serve`` opens with the stored messages restored on the loop after ``open`` returns: sends are judged
    exactly at once (the dedup keys are loaded first), receives wait for the backlog, and the messages sent
    meanwhile come after it, each once."""
    from oncebus.broker import recovery
    from oncebus.core.errors import ServerBusyError

    monkeypatch.setattr(recovery, "RESTORE_STEP", 100)  # many steps, so sends and receives come between them
    path = tmp_path / "oncebus.db"
    clock = ManualClock(T0)
    stored = 2_000

    async def before() -> None:
        store, ns = await _open(path, clock, DEFAULT_CACHE_BYTES)
        await ns.create_queue("q", requires_duplicate_detection=True)
        await ns.create_queue("s", requires_session=True)
        await ns.create_topic("t")
        await ns.create_subscription("t", "a")
        for start in range(0, stored, 250):
            await ns.send("q", [_message(i) for i in range(start, start + 250)])
            await ns.send("t", [_message(i) for i in range(start, start + 250)])
            clock.advance(1)
        await ns.send("s", [Message(b"x", message_id=f"s{i}", session_id=f"k{i % 3}") for i in range(300)])
        (deferred,) = await ns.receive("q")  # m0, deferred: kept aside, by sequence number only
        await ns.defer("q", deferred.lock_token)
        await ns.close()
        store.close()

    async def after() -> None:
        clock.advance(1)
        store = SqliteStore(path)
        ns = await Namespace.open(store, clock, backlog_in_background=True)
        assert not ns._backlog_loaded.is_set()
        with pytest.raises(ServerBusyError, match="loading the stored messages"):
            ns.peek_messages("q")
        first = asyncio.ensure_future(ns.receive("q", 1))  # waits for the backlog
        outcomes = await ns.send("q", [_message(1), _message(stored - 1), Message(b"n", message_id="new0")])
        assert [o.duplicate for o in outcomes] == [True, True, False]
        for i in range(1, 50):
            await ns.send("q", Message(b"n", message_id=f"new{i}"))
            await ns.send("t", Message(b"n", message_id=f"new{i}"))
        (head,) = await first
        assert ns._backlog_loaded.is_set() and head.message_id == "m1"
        await ns.complete("q", head.lock_token)
        ids = ["m1"]
        while got := await ns.receive("q", 300):
            for m in got:
                await ns.complete("q", m.lock_token)
            ids += [m.message_id for m in got]
        assert ids == [f"m{i}" for i in range(1, stored)] + [f"new{i}" for i in range(50)]
        assert len(ns.peek_messages("q", 10)) == 1  # m0, deferred
        sub = []
        while got := await ns.receive("t/Subscriptions/a", 500, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE):
            sub += [m.message_id for m in got]
        assert sub == [f"m{i}" for i in range(stored)] + [f"new{i}" for i in range(1, 50)]
        for key in ("k0", "k1", "k2"):
            session = await ns.accept_session("s", key)
            got = await ns.receive("s", 300, session=session, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE)
            assert [m.message_id for m in got] == [f"s{i}" for i in range(300) if i % 3 == int(key[1])]
            await ns.close_session(session)
        await ns.close()
        store.close()

    asyncio.run(before())
    asyncio.run(after())


def test_a_backlog_restored_in_steps_goes_before_what_arrived_meanwhile() -> None:
    """``begin_restore``/``end_restore``: stored rows come in steps while new messages are added; the stored
    ones (usual or not) are delivered first, in (enqueued time, sequence number) order, and counted once."""
    from oncebus.broker.receivable import Receivable, ReceivableSettings
    from oncebus.core.messages import MessageState, StoredMessage

    def row(
        seq: int, enqueued: int, expires: int | None = None
    ) -> tuple[str, int, int, int, int, int | None, int, None]:
        return ("q", seq, int(MessageState.ACTIVE), 0, enqueued, expires, 1, None)

    def record(seq: int, enqueued: int) -> StoredMessage:
        return StoredMessage("q", seq, f"m{seq}", b"x", enqueued, None)

    receivable = Receivable("q", ReceivableSettings(5_000_000, 10, False, False, 1 << 30))
    receivable.begin_restore()
    receivable.restore([row(1, 10), row(2, 11)], 0)
    receivable.add_records([record(100, 50), record(101, 51)], 0)  # sent while the backlog loads
    receivable.restore([row(3, 12, expires=10**9), row(4, 13), row(5, 9)], 0)  # 5: out of order, 3: expires
    receivable.add_records([record(102, 52)], 0)
    receivable.end_restore()
    receivable.add_records([record(103, 53)], 0)
    assert receivable.counts()["active"] == 9 and receivable.size_bytes == 9
    order = []
    while (entry := receivable.take()) is not None:
        order.append(entry.sequence_number)
    assert order == [5, 1, 2, 3, 4, 100, 101, 102, 103]
