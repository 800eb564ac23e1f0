"""``Namespace.transactions`` at the broker: a commit is one durable store unit; a failed commit leaves nothing; the
bounds oncebus puts on what open transactions hold in memory."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import Future

import pytest

from oncebus.broker import ManualClock, Message, Namespace, PendingSettlement
from oncebus.core.errors import QuotaExceededError, ServerBusyError, StoreWriteError
from oncebus.store.base import Op
from oncebus.store.memory import MemoryStore

OWNER = object()  # the connection that declares


class _CountingStore(MemoryStore):
    """A memory store that keeps every unit submitted (and fails them on demand)."""

    def __init__(self) -> None:
        super().__init__()
        self.units: list[tuple[list[Op], bool]] = []
        self.fail = False

    def submit(self, unit: Sequence[Op], *, durable: bool = True) -> Future[None]:
        self.units.append((list(unit), durable))
        if self.fail and unit:
            future: Future[None] = Future()
            future.set_exception(OSError("disk full"))
            return future
        return super().submit(unit, durable=durable)


async def _prepared(store: _CountingStore) -> tuple[Namespace, bytes]:
    """``q`` holds three messages, received; a transaction completes one, dead-letters one, abandons one, and
    sends two (one of them twice)."""
    ns = await Namespace.open(store, ManualClock())
    await ns.create_queue("q", requires_duplicate_detection=True)
    await ns.send("q", [Message(f"in{i}".encode(), message_id=f"in{i}") for i in range(3)])
    got = await ns.receive("q", 3)
    txn = ns.transactions.declare(OWNER)
    for message, outcome in zip(got, ("complete", "dead_letter", "abandon"), strict=True):
        assert message.lock_token is not None
        ns.transactions.settle(txn, OWNER, PendingSettlement("q", message.lock_token, outcome))  # type: ignore[arg-type]
    ns.transactions.send(txn, OWNER, "q", "q", [Message(b"out", message_id="out")])
    ns.transactions.send(txn, OWNER, "q", "q", [Message(b"again", message_id="out"), Message(b"x", message_id="x")])
    return ns, txn


def test_a_commit_is_one_durable_unit() -> None:
    async def go() -> None:
        store = _CountingStore()
        ns, txn = await _prepared(store)
        store.units.clear()
        assert await ns.transactions.discharge(txn, OWNER, fail=False) == "q"
        assert len(store.units) == 1 and store.units[0][1]  # one unit, durable (fsynced) before the answer
        stats = ns.stats("q")
        assert (stats.active_message_count, stats.dead_letter_message_count) == (3, 1)  # in2, out, x; in1
        bodies = sorted(bytes(m.body) for m in ns.peek_messages("q", 10))
        assert bodies == [b"in2", b"out", b"x"]

    asyncio.run(go())


def test_a_commit_the_store_fails_leaves_nothing_of_the_transaction() -> None:
    async def go() -> None:
        store = _CountingStore()
        ns, txn = await _prepared(store)
        store.fail = True
        with pytest.raises(StoreWriteError):
            await ns.transactions.discharge(txn, OWNER, fail=False)
        store.fail = False
        for _ in range(200):  # the namespace reloads what the store holds, as after any failed write
            if ns.reloads:
                break
            await asyncio.sleep(0.01)
        assert ns.reloads == 1
        assert sorted(bytes(m.body) for m in ns.peek_messages("q", 10)) == [b"in0", b"in1", b"in2"]
        assert ns.stats("q").dead_letter_message_count == 0
        await ns.send("q", Message(b"out", message_id="out"))  # its key was never kept: a new message
        assert ns.stats("q").active_message_count == 4

    asyncio.run(go())


def test_open_transactions_are_bounded_per_connection_and_in_bytes() -> None:
    async def go() -> None:
        ns = await Namespace.open(MemoryStore(), ManualClock())
        await ns.create_queue("q")
        transactions = ns.transactions
        transactions.max_open_per_connection = 3
        for _ in range(3):
            transactions.declare(OWNER)
        with pytest.raises(QuotaExceededError, match="3 open transactions"):
            transactions.declare(OWNER)
        other = transactions.declare(object())  # another connection's are its own
        transactions.max_held_bytes = 1000
        transactions.send(other, transactions.open[other].owner, "q", "q", [Message(b"x" * 600)])
        with pytest.raises(ServerBusyError, match="bound of 1000 bytes"):
            transactions.send(other, transactions.open[other].owner, "q", "q", [Message(b"y" * 600)])
        owner = transactions.open[other].owner
        await transactions.discharge(other, owner, fail=True)
        assert transactions.held_bytes == 0  # released with the rollback
        ns.clock.advance(121)  # type: ignore[attr-defined]
        fresh = transactions.declare(OWNER)  # the three timed out: swept at the next declare
        assert list(transactions.open) == [fresh]

    asyncio.run(go())
