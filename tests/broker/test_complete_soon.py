"""``Namespace.complete_soon``: the receive link's completion, without a coroutine, batched per loop iteration."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from concurrent.futures import Future
from datetime import timedelta
from pathlib import Path

import pytest

from oncebus.broker import ManualClock, Message, Namespace
from oncebus.core.errors import MessageLockLostError, SessionLockLostError, StoreWriteError
from oncebus.store.base import DeleteMessage, Op
from oncebus.store.memory import MemoryStore
from oncebus.store.sqlite import SqliteStore
from tests.store.writer_support import writer_idle


class _CountingStore(MemoryStore):
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


async def _complete_all(ns: Namespace, tokens: list[object]) -> list[BaseException | None]:
    loop = asyncio.get_running_loop()
    outcomes: list[asyncio.Future[BaseException | None]] = []
    for token in tokens:
        outcome: asyncio.Future[BaseException | None] = loop.create_future()
        ns.complete_soon("q", token, outcome.set_result)  # type: ignore[arg-type]
        outcomes.append(outcome)
    return list(await asyncio.gather(*outcomes))


def test_completions_of_one_loop_iteration_are_one_relaxed_unit() -> None:
    async def go() -> None:
        store = _CountingStore()
        ns = await Namespace.open(store, ManualClock())
        await ns.create_queue("q")
        await ns.send("q", [Message(f"{i}".encode(), message_id=f"m{i}") for i in range(5)])
        got = await ns.receive("q", 5)
        store.units.clear()
        assert await _complete_all(ns, [m.lock_token for m in got]) == [None] * 5
        assert len(store.units) == 1  # one unit for the five, and not waiting for an fsync
        ops, durable = store.units[0]
        assert not durable and [op.sequence_number for op in ops if isinstance(op, DeleteMessage)] == [
            m.sequence_number for m in got
        ]
        assert ns.stats("q").active_message_count == 0 and ns.receivable("q").counters.completed == 5
        with pytest.raises(MessageLockLostError):  # settled already: refused at once, as complete() does
            ns.complete_soon("q", got[0].lock_token, lambda error: None)  # type: ignore[arg-type]

    asyncio.run(go())


def test_a_failed_completion_is_reported_and_the_message_comes_back() -> None:
    async def go() -> None:
        store = _CountingStore()
        ns = await Namespace.open(store, ManualClock())
        await ns.create_queue("q")
        await ns.send("q", Message(b"x", message_id="a"))
        (message,) = await ns.receive("q", 1)
        store.fail = True
        (error,) = await _complete_all(ns, [message.lock_token])
        assert isinstance(error, StoreWriteError) and "disk full" in str(error)
        with pytest.raises(StoreWriteError, match="try again shortly"):  # refused until reloaded
            ns.complete_soon("q", message.lock_token, lambda error: None)  # type: ignore[arg-type]
        store.fail = False
        for _ in range(200):
            if ns._failure is None:
                break
            await asyncio.sleep(0.02)
        assert ns._failure is None
        (again,) = await ns.receive("q", 1)  # the completion was not stored: delivered again
        assert again.message_id == "a"

    asyncio.run(go())


def test_completions_commit_on_the_loop_thread_with_sqlite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SqliteStore, "idle_seconds", None)  # the writer's idle check takes its lock: store_idle

    async def go() -> None:
        store = SqliteStore(tmp_path / "oncebus.db")
        ns = await Namespace.open(store, ManualClock())
        await ns.create_queue("q")
        await ns.send("q", [Message(f"{i}".encode(), message_id=f"m{i}") for i in range(20)])
        for _ in range(4):
            got = await ns.receive("q", 5)
            await store_idle(store)  # else a completion finding the writer busy goes to it (and none is direct)
            assert await _complete_all(ns, [m.lock_token for m in got]) == [None] * 5
        assert store.direct_commits >= 1 and ns.stats("q").active_message_count == 0
        await ns.close()
        store.close()
        reopened = SqliteStore(tmp_path / "oncebus.db")
        try:
            assert list(reopened.load().messages) == []
        finally:
            reopened.close()

    asyncio.run(go())


def test_abandons_dead_letters_and_completions_of_one_iteration_are_one_unit_each_answered_after_it() -> None:
    """Item 4 of issue 34: the settlements arriving together, of whatever kind, are committed as one unit (one
    settlement-log record or transaction), and each call returns only once that unit is committed."""

    async def go() -> None:
        store = _CountingStore()
        ns = await Namespace.open(store, ManualClock(1_700_000_000_000_000))
        await ns.create_queue("q")
        await ns.send("q", [Message(f"m{i}".encode(), f"id-{i}") for i in range(4)])
        got = await ns.receive("q", 4)
        store.units.clear()
        await asyncio.gather(
            ns.abandon("q", got[0].lock_token),  # type: ignore[arg-type]
            ns.dead_letter("q", got[1].lock_token, reason="bad"),  # type: ignore[arg-type]
            ns.defer("q", got[2].lock_token),  # type: ignore[arg-type]
            ns.complete("q", got[3].lock_token),  # type: ignore[arg-type]
        )
        settlements = [(ops, durable) for ops, durable in store.units if ops]
        assert len(settlements) == 1 and settlements[0][1] is False  # one unit, committed before its sync
        kinds = sorted(type(op).__name__ for op in settlements[0][0])
        assert kinds == ["DeleteMessage", "MoveMessage", "UpdateMessage", "UpdateMessage"]
        assert [m.body for m in ns.peek_messages("q/$deadletterqueue", 5)] == [b"m1"]
        assert ns.stats("q").active_message_count == 1
        # a failed unit fails each of them
        got = await ns.receive("q", 1)
        store.fail = True
        results = await asyncio.gather(
            ns.abandon("q", got[0].lock_token),  # type: ignore[arg-type]
            return_exceptions=True,
        )
        assert [type(r).__name__ for r in results] == ["StoreWriteError"]
        await ns.close()

    asyncio.run(go())


def test_settlements_in_a_sqlite_store_of_one_iteration_are_one_settlement_log_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(SqliteStore, "idle_seconds", None)  # the writer's idle check takes its lock: store_idle

    async def go() -> None:
        store = SqliteStore(tmp_path / "oncebus.db")
        ns = await Namespace.open(store, ManualClock(1_700_000_000_000_000))
        await ns.create_queue("q")
        await ns.send("q", [Message(f"m{i}".encode(), f"id-{i}") for i in range(3)])
        got = await ns.receive("q", 3)
        await store_idle(store)
        before = store.logged_settlements
        await asyncio.gather(
            ns.abandon("q", got[0].lock_token),  # type: ignore[arg-type]
            ns.dead_letter("q", got[1].lock_token, reason="bad"),  # type: ignore[arg-type]
            ns.complete("q", got[2].lock_token),  # type: ignore[arg-type]
        )
        assert store.logged_settlements == before + 1
        await ns.close()
        store.close()
        again = SqliteStore(tmp_path / "oncebus.db")
        ns = await Namespace.open(again, ManualClock(1_700_000_000_000_000))
        assert [m.body for m in await ns.receive("q", 5)] == [b"m0"]
        assert [m.body for m in ns.peek_messages("q/$deadletterqueue", 5)] == [b"m1"]
        await ns.close()
        again.close()

    asyncio.run(go())


async def store_idle(store: SqliteStore) -> None:
    """Until the writer has committed everything submitted and let go of its lock, so that the next settlements go
    to the log (``tests/store/writer_support.py``)."""
    await asyncio.to_thread(writer_idle, store)


def test_a_session_message_completes_once_and_not_after_its_session_lock_is_lost() -> None:
    """The completion's one compiled call (``Receivable.complete``) keeps the session's bookkeeping: a completed
    message leaves its session's locked messages, and one whose session lock expired is refused as Service Bus
    refuses it (``SessionLockLostError``), staying in the queue for the session's next receiver."""

    async def go() -> None:
        clock = ManualClock()
        store = _CountingStore()
        ns = await Namespace.open(store, clock)
        await ns.create_queue("q", requires_session=True, lock_duration=timedelta(seconds=10))
        await ns.send("q", [Message(b"1", session_id="s"), Message(b"2", session_id="s")])
        session = await ns.accept_session("q", "s")
        first, second = await ns.receive("q", 2, session=session)
        held = ns.receivable("q").sessions["s"].locked_messages
        assert held == {first.lock_token, second.lock_token}
        assert await _complete_all(ns, [first.lock_token]) == [None]
        assert held == {second.lock_token}
        clock.advance(11)
        ns.tick()
        with pytest.raises(SessionLockLostError):
            ns.complete_soon("q", second.lock_token, lambda error: None)  # type: ignore[arg-type]
        assert ns.stats("q").active_message_count == 1 and ns.receivable("q").counters.completed == 1
        again = await ns.accept_session("q", "s")
        assert [m.body for m in await ns.receive("q", 2, session=again)] == [b"2"]

    asyncio.run(go())


def test_completions_ask_asyncio_for_the_loop_once_and_follow_a_new_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """``asyncio.get_running_loop`` makes a ``getpid`` system call on Python 3.11: the journal remembers the loop
    instead of asking for it at each completion, and still follows the namespace to another loop (a second
    ``asyncio.run``) and refuses a call from a thread without one, as ``asyncio.get_running_loop`` does."""
    real = asyncio.get_running_loop
    asked: list[asyncio.AbstractEventLoop] = []

    def counted() -> asyncio.AbstractEventLoop:
        loop = real()
        asked.append(loop)
        return loop

    store = _CountingStore()
    ns: Namespace | None = None

    async def setup() -> None:
        nonlocal ns
        ns = await Namespace.open(store, ManualClock())
        await ns.create_queue("q")
        await ns.send("q", [Message(f"{i}".encode(), message_id=f"m{i}") for i in range(12)])

    async def complete_in_turns(count: int) -> list[BaseException | None]:
        assert ns is not None
        loop = real()
        got = await ns.receive("q", count)
        outcomes: list[asyncio.Future[BaseException | None]] = []
        with monkeypatch.context() as patched:
            patched.setattr(asyncio, "get_running_loop", counted)
            for message in got:  # one completion a loop iteration: each a unit of its own
                outcome: asyncio.Future[BaseException | None] = loop.create_future()
                assert message.lock_token is not None
                ns.complete_soon("q", message.lock_token, outcome.set_result)
                outcomes.append(outcome)
                await asyncio.sleep(0)
            return list(await asyncio.gather(*outcomes))

    asyncio.run(setup())
    assert asyncio.run(complete_in_turns(5)) == [None] * 5
    assert ns is not None and ns.receivable("q").counters.completed == 5
    assert len(store.units) >= 5 and len(asked) <= 1  # asked once at most, not once a completion
    first = list(asked)
    asked.clear()
    assert asyncio.run(complete_in_turns(5)) == [None] * 5  # a new loop: followed, the completions land
    assert ns.receivable("q").counters.completed == 10
    assert len(asked) == 1 and (not first or asked[0] is not first[0])

    async def receive_one() -> uuid.UUID:
        assert ns is not None
        (message,) = await ns.receive("q", 1)
        assert message.lock_token is not None
        return message.lock_token

    token = asyncio.run(receive_one())
    with pytest.raises(RuntimeError, match="no running event loop"):  # no loop here: refused, as before
        ns.complete_soon("q", token, lambda error: None)
