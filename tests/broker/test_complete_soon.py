"""``Namespace.complete_soon``: the receive link's completion, without a coroutine, batched per loop iteration."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path

import pytest

from oncebus.broker import ManualClock, Message, Namespace
from oncebus.core.errors import MessageLockLostError, StoreWriteError
from oncebus.store.base import DeleteMessage, Op
from oncebus.store.memory import MemoryStore
from oncebus.store.sqlite import SqliteStore


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


def test_completions_commit_on_the_loop_thread_with_sqlite(tmp_path: Path) -> None:
    async def go() -> None:
        store = SqliteStore(tmp_path / "oncebus.db")
        ns = await Namespace.open(store, ManualClock())
        await ns.create_queue("q")
        await ns.send("q", [Message(f"{i}".encode(), message_id=f"m{i}") for i in range(20)])
        for _ in range(4):
            got = await ns.receive("q", 5)
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
