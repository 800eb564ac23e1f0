"""``Namespace.receivable`` keeps what each path string resolved to: a settlement after its queue or subscription
was deleted, or deleted and created again under the same name, or after a reload, must meet the entity there now,
never the one it replaced. Lock tokens: version 4 UUIDs, unique, drawn from a pool (``receivable.LockTokens``)."""

from __future__ import annotations

import asyncio
import os
import uuid
from datetime import timedelta

import pytest

from oncebus.broker import ManualClock, Message, Namespace
from oncebus.broker.receivable import LockTokens
from oncebus.core.errors import EntityNotFoundError, MessageLockLostError
from oncebus.store.memory import MemoryStore


async def _completes(ns: Namespace, path: str, token: uuid.UUID) -> BaseException | None:
    outcome: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
    try:
        ns.complete_soon(path, token, outcome.set_result)
    except Exception as exc:
        return exc
    return await outcome


@pytest.mark.parametrize("spelling", ["q", "Q", "sb://host/q/"])
def test_a_lock_of_a_deleted_and_recreated_queue_is_lost_and_the_new_queue_is_served(spelling: str) -> None:
    async def go() -> None:
        ns = await Namespace.open(MemoryStore(), ManualClock())
        await ns.create_queue("q")
        await ns.send("q", [Message(b"old", message_id="old")])
        (old,) = await ns.receive(spelling, 1)
        assert old.lock_token is not None
        await ns.delete_queue("q")
        with pytest.raises(EntityNotFoundError):
            await ns.complete(spelling, old.lock_token)
        await ns.create_queue("q")
        await ns.send("q", [Message(b"new", message_id="new")])
        assert isinstance(await _completes(ns, spelling, old.lock_token), MessageLockLostError)
        (new,) = await ns.receive(spelling, 1)
        assert new.body == b"new" and new.lock_token is not None
        assert await _completes(ns, spelling, new.lock_token) is None
        assert ns.stats("q").active_message_count == 0 and ns.receivable(spelling).counters.completed == 1

    asyncio.run(go())


def test_a_lock_of_a_deleted_and_recreated_subscription_is_lost() -> None:
    async def go() -> None:
        ns = await Namespace.open(MemoryStore(), ManualClock())
        await ns.create_topic("t")
        await ns.create_subscription("t", "s")
        path = "t/Subscriptions/s"
        await ns.send("t", [Message(b"old", message_id="old")])
        (old,) = await ns.receive(path, 1)
        await ns.delete_subscription("t", "s")
        await ns.create_subscription("t", "s")
        await ns.send("t", [Message(b"new", message_id="new")])
        assert old.lock_token is not None
        assert isinstance(await _completes(ns, path, old.lock_token), MessageLockLostError)
        (new,) = await ns.receive(path, 1)
        assert new.body == b"new" and new.lock_token is not None
        await ns.complete(path, new.lock_token)
        # the dead-letter sub-queue's path resolves to the new subscription's too
        assert ns.receivable(path + "/$DeadLetterQueue") is ns.receivable(path).dead_letter_queue

    asyncio.run(go())


def test_a_deleted_topic_recreated_as_a_queue_is_not_served_as_the_topic() -> None:
    async def go() -> None:
        ns = await Namespace.open(MemoryStore(), ManualClock())
        await ns.create_queue("x")
        assert ns.receivable("x").path == "x"
        await ns.delete_queue("x")
        await ns.create_topic("x")
        with pytest.raises(Exception, match="is a topic"):
            ns.receivable("x")

    asyncio.run(go())


def test_an_expired_lock_is_lost_at_the_injected_clock_to_the_microsecond() -> None:
    async def go() -> None:
        clock = ManualClock()
        ns = await Namespace.open(MemoryStore(), clock)
        await ns.create_queue("q", lock_duration=timedelta(seconds=30))
        await ns.send("q", [Message(b"a", message_id="a"), Message(b"b", message_id="b")])
        first, second = await ns.receive("q", 2)
        assert first.lock_token is not None and second.lock_token is not None
        clock.advance(us=29_999_999)  # one microsecond before the lock expires: still held
        assert await _completes(ns, "q", first.lock_token) is None
        clock.advance(us=1)  # now it has expired: the same path string, resolved before, sees it
        assert isinstance(await _completes(ns, "q", second.lock_token), MessageLockLostError)
        (again,) = await ns.receive("q", 1)
        assert again.body == b"b" and again.delivery_count == 2  # counted at each lock

    asyncio.run(go())


def test_lock_tokens_are_random_version_4_uuids_and_unique() -> None:
    tokens = LockTokens()
    drawn = [tokens.next() for _ in range(3 * LockTokens.POOL_BYTES // 16 + 5)]  # across several pools
    assert len(set(drawn)) == len(drawn)
    for token in drawn:
        assert token.version == 4 and token.variant == uuid.RFC_4122
        assert uuid.UUID(str(token)) == token and hash(uuid.UUID(bytes=token.bytes)) == hash(token)
    assert len({t.int >> 64 for t in drawn}) == len(drawn)  # no half repeats either


def test_a_forked_child_does_not_hand_out_its_parents_tokens() -> None:
    from oncebus.broker.receivable import TOKENS

    TOKENS.next()  # the pool is filled
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (the child)
        os.write(write, TOKENS.next().bytes)
        os._exit(0)
    os.waitpid(child, 0)
    theirs = os.read(read, 16)
    os.close(read)
    os.close(write)
    assert theirs != TOKENS.next().bytes


def test_waiting_for_change_at_a_deleted_queue_suspends_until_woken() -> None:
    """A link without credit whose queue was deleted waits here in a loop: an await that never suspends
    would keep the event loop from everything else (the SDK's delete_queue then hung, see
    tests/amqp/test_recreated_entity_sdk.py)."""

    async def go() -> None:
        ns = await Namespace.open(MemoryStore(), ManualClock())
        await ns.create_queue("q")
        await ns.receive("q", 1, max_wait_time=0)  # resolves (and keeps) the path
        await ns.delete_queue("q")
        wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting = asyncio.create_task(ns.wait_for_change(3600.0, wake, path="q"))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not waiting.done()
        wake.set_result(None)
        await asyncio.wait_for(waiting, 5)
        with pytest.raises(EntityNotFoundError):
            await ns.receive("q", 1, max_wait_time=0)

    asyncio.run(go())
