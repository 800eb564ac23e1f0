"""Receivers waiting for messages are woken by what happens to their own entity, never by another's.

Before: one change signal for the whole namespace woke every waiting receive link on every
committed send to any entity and on every timer tick, so idle links on an empty queue cost
CPU in proportion to everyone else's traffic (issue 18, item 5).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from oncebus.broker import ManualClock, Message, Namespace
from oncebus.store.memory import MemoryStore

WAITERS = 200


async def _waiters(ns: Namespace, path: str, count: int) -> list[asyncio.Task[None]]:
    tasks = [asyncio.create_task(ns.wait_for_change(60.0, path=path)) for _ in range(count)]
    await asyncio.sleep(0)  # every waiter is registered
    return tasks


def test_a_send_to_another_queue_and_the_ticks_wake_no_waiter() -> None:
    async def scenario() -> None:
        clock = ManualClock()
        ns = await Namespace.open(MemoryStore(), clock)
        await ns.create_queue("idle")
        await ns.create_queue("busy")
        waiting = await _waiters(ns, "idle", WAITERS)
        for n in range(5):
            await ns.send("busy", Message(b"x", message_id=f"m{n}"))
            clock.advance(1)
            ns.tick()
            await asyncio.sleep(0)
        assert not any(task.done() for task in waiting)
        await ns.send("idle", Message(b"y", message_id="for-idle"))
        await asyncio.wait_for(asyncio.gather(*waiting), 5)
        await ns.close()

    asyncio.run(scenario())


def test_waiters_wake_when_a_message_becomes_available_again_or_is_released() -> None:
    async def scenario() -> None:
        clock = ManualClock()
        ns = await Namespace.open(MemoryStore(), clock)
        await ns.create_queue("q", lock_duration=timedelta(seconds=30))
        await ns.send("q", Message(b"a", message_id="a"))
        [locked] = await ns.receive("q", 1)
        waiting = await _waiters(ns, "q", 3)
        ns.tick()
        await asyncio.sleep(0)
        assert not any(task.done() for task in waiting)
        clock.advance(31)  # the lock expires: the message is available again
        ns.tick()
        await asyncio.wait_for(asyncio.gather(*waiting), 5)
        assert locked.lock_token is not None

        scheduled_at = datetime.fromtimestamp(clock.now_us() / 1e6 + 10, UTC)
        await ns.schedule_messages("q", Message(b"later", message_id="later"), scheduled_at)
        waiting = await _waiters(ns, "q", 3)
        ns.tick()
        await asyncio.sleep(0)
        assert not any(task.done() for task in waiting)
        clock.advance(11)
        ns.tick()  # released at its time
        await asyncio.wait_for(asyncio.gather(*waiting), 5)
        await ns.close()

    asyncio.run(scenario())


def test_a_topic_send_wakes_its_subscriptions_waiters_and_a_delete_wakes_everyone() -> None:
    async def scenario() -> None:
        clock = ManualClock()
        ns = await Namespace.open(MemoryStore(), clock)
        await ns.create_topic("t")
        await ns.create_subscription("t", "s")
        await ns.create_queue("other")
        on_subscription = await _waiters(ns, "t/Subscriptions/s", 3)
        on_other = await _waiters(ns, "other", 3)
        await ns.send("t", Message(b"fan", message_id="fan"))
        await asyncio.wait_for(asyncio.gather(*on_subscription), 5)
        assert not any(task.done() for task in on_other)
        await ns.delete_queue("other")  # its receivers must find out at once
        await asyncio.wait_for(asyncio.gather(*on_other), 5)
        await ns.close()

    asyncio.run(scenario())
