"""The content cache in front of the store, as sends fill it: a backlog keeps its head cached (what its receivers
read first) instead of evicting it for its tail; a send a receiver waits for is cached, evicting the least
recently used. Either way every delivery carries the message sent (misses read the store)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from oncebus.broker import ManualClock, Message, Namespace
from oncebus.broker.contents import _OVERHEAD
from oncebus.store.sqlite import SqliteStore

T0 = 1_700_000_000_000_000
BODY = 100
HELD = 10  # records the cache has room for


def _message(i: int) -> Message:
    return Message(b"%03d" % i * (BODY // 3) + b"x", message_id=f"m{i}")


async def _open(path: Path) -> tuple[SqliteStore, Namespace]:
    store = SqliteStore(path)
    ns = await Namespace.open(store, ManualClock(T0))
    ns._contents.max_bytes = HELD * (BODY + _OVERHEAD)
    await ns.create_queue("q")
    return store, ns


def test_a_backlog_keeps_its_head_cached_and_reads_its_tail_from_the_store(tmp_path: Path) -> None:
    async def run() -> None:
        store, ns = await _open(tmp_path / "oncebus.db")
        try:
            for i in range(3 * HELD):  # one send each, nobody receiving
                await ns.send("q", [_message(i)])
            cache = ns._contents
            assert cache.bytes <= cache.max_bytes
            head = await ns.receive("q", HELD)
            assert [m.message_id for m in head] == [f"m{i}" for i in range(HELD)]
            assert (cache.hits, cache.misses) == (HELD, 0)  # the first sent, kept: read first
            tail = await ns.receive("q", 2 * HELD)
            assert [m.message_id for m in tail] == [f"m{i}" for i in range(HELD, 3 * HELD)]
            assert [m.body for m in head + tail] == [_message(i).body for i in range(3 * HELD)]
            assert (cache.hits, cache.misses) == (HELD, 2 * HELD)
        finally:
            await ns.close()
            store.close()

    asyncio.run(run())


def test_a_send_a_receiver_waits_for_is_cached_in_a_full_cache(tmp_path: Path) -> None:
    async def run() -> None:
        store, ns = await _open(tmp_path / "oncebus.db")
        try:
            await ns.create_queue("backlog")
            for i in range(2 * HELD):  # fills the cache with another queue's backlog
                await ns.send("backlog", [_message(i)])
            cache = ns._contents
            waiting = asyncio.ensure_future(ns.receive("q", 1, max_wait_time=None))
            changes = ns._registry.entity("q").receivable.changes
            while not changes.waiting:
                await asyncio.sleep(0)
            await ns.send("q", [_message(99)])
            (got,) = await waiting
            assert got.message_id == "m99" and got.body == _message(99).body
            assert (cache.hits, cache.misses) == (1, 0)  # cached for its receiver, evicting the backlog's oldest
            assert cache.bytes <= cache.max_bytes
        finally:
            await ns.close()
            store.close()

    asyncio.run(run())


def test_an_idle_backlog_gives_its_room_to_a_newer_one_and_keeps_its_head(tmp_path: Path) -> None:
    """Another queue's backlog, nobody receiving from it, filled the cache first: a queue filled after it is cached
    all the same (the idle one loses its newest records, keeping its head), and its receivers read no store."""

    async def run() -> None:
        store, ns = await _open(tmp_path / "oncebus.db")
        try:
            await ns.create_queue("idle")
            for i in range(2 * HELD):
                await ns.send("idle", [_message(i)])
            cache = ns._contents
            for i in range(HELD // 2):
                await ns.send("q", [_message(100 + i)])
            assert cache.bytes <= cache.max_bytes
            got = await ns.receive("q", HELD)
            assert [m.body for m in got] == [_message(100 + i).body for i in range(HELD // 2)]
            assert (cache.hits, cache.misses) == (HELD // 2, 0)
            head = await ns.receive("idle", HELD // 2)  # what the idle queue kept: its first messages
            assert [m.message_id for m in head] == [f"m{i}" for i in range(HELD // 2)]
            assert (cache.hits, cache.misses) == (HELD, 0)
            rest = await ns.receive("idle", 2 * HELD)
            assert [m.body for m in rest] == [_message(i).body for i in range(HELD // 2, 2 * HELD)]
            assert cache.misses == len(rest)  # the tail it gave up (and what never fitted) read from the store
        finally:
            await ns.close()
            store.close()

    asyncio.run(run())


def test_a_backlog_being_received_keeps_its_room_against_an_idle_one(tmp_path: Path) -> None:
    """A queue whose receivers read from the cache keeps its records while another queue, nobody receiving from
    it, grows: the idle queue's sends go to the store instead."""

    async def run() -> None:
        store, ns = await _open(tmp_path / "oncebus.db")
        try:
            await ns.create_queue("idle")
            for i in range(HELD):
                await ns.send("q", [_message(i)])
            cache = ns._contents
            first = await ns.receive("q", 2)
            await ns.complete("q", first[0].lock_token)
            await ns.complete("q", first[1].lock_token)
            for i in range(2 * HELD):
                await ns.send("idle", [_message(100 + i)])
            rest = await ns.receive("q", HELD)
            assert [m.message_id for m in rest] == [f"m{i}" for i in range(2, HELD)]
            assert (cache.hits, cache.misses) == (HELD, 0)
            idle = await ns.receive("idle", 2 * HELD)
            assert [m.body for m in idle] == [_message(100 + i).body for i in range(2 * HELD)]
        finally:
            await ns.close()
            store.close()

    asyncio.run(run())
