"""``auto_delete_on_idle`` in the broker engine: what counts as activity, and deletion as an explicit delete
does it (messages, subscriptions, dedup history gone, also from the store). Time is a ManualClock."""

from __future__ import annotations

import asyncio

import pytest

from oncebus.broker import ManualClock, Message, Namespace
from oncebus.core.errors import ArgumentOutOfRangeError, EntityNotFoundError
from tests.broker.conftest import StoreFactory, run

START = 1_800_000_000_000_000
MINUTE = 60.0
SECOND = 1.0


def test_an_idle_queue_is_deleted_with_its_dedup_history(stores: StoreFactory) -> None:
    async def go() -> None:
        clock = ManualClock(START)
        ns = await Namespace.open(stores.open(), clock)
        with pytest.raises(ArgumentOutOfRangeError, match="at least 5 minutes"):
            await ns.create_queue("q", auto_delete_on_idle="PT4M59S")
        await ns.create_queue("q", auto_delete_on_idle="PT5M", requires_duplicate_detection=True)
        await ns.create_queue("keep")
        await ns.send("q", Message(b"", message_id="once"))
        clock.advance(4 * MINUTE)
        ns.tick()
        await ns.send("q", Message(b"", message_id="other"))  # a send: idle time starts again
        clock.advance(4 * MINUTE)
        ns.tick()
        assert [m.message_id for m in ns.peek_messages("q", 10)] == ["once", "other"]  # peeking is activity too
        clock.advance(5 * MINUTE)
        ns.tick()
        with pytest.raises(EntityNotFoundError):
            ns.get_queue("q")
        assert [q.name for q in ns.list_queues()] == ["keep"]
        await ns.close()
        ns = await Namespace.open(stores.open(), clock)  # deleted in the store too
        assert [q.name for q in ns.list_queues()] == ["keep"]
        await ns.create_queue("q", requires_duplicate_detection=True)
        assert (await ns.send("q", Message(b"", message_id="once")))[0].duplicate is False  # its history went too
        assert ns.peek_messages("q", 10)[0].message_id == "once"

    run(go())


def test_receives_and_management_calls_keep_an_entity_alive(stores: StoreFactory) -> None:
    async def go() -> None:
        clock = ManualClock(START)
        ns = await Namespace.open(stores.open(), clock)
        await ns.create_queue("q", auto_delete_on_idle="PT10M")
        for _ in range(3):
            clock.advance(9 * MINUTE)
            await ns.receive("q", 1)  # an empty receive is activity
            ns.tick()
        for _ in range(3):
            clock.advance(9 * MINUTE)
            ns.get_queue("q")  # so is a management call
            ns.tick()
        await ns.update_queue("q", auto_delete_on_idle="PT5M")
        clock.advance(5 * MINUTE)
        ns.tick()
        assert ns.list_queues() == []

    run(go())


def test_an_idle_subscription_goes_alone_an_idle_topic_with_its_subscriptions(stores: StoreFactory) -> None:
    async def go() -> None:
        clock = ManualClock(START)
        ns = await Namespace.open(stores.open(), clock)
        await ns.create_topic("t", requires_duplicate_detection=True)
        await ns.create_subscription("t", "idle", auto_delete_on_idle="PT5M")
        await ns.create_subscription("t", "busy")
        await ns.send("t", Message(b"", message_id="m"))
        clock.advance(6 * MINUTE)
        ns.tick()
        assert [s.name for s in ns.list_subscriptions("t")] == ["busy"]
        await ns.update_topic("t", auto_delete_on_idle="PT5M")
        clock.advance(3 * MINUTE)
        await ns.receive("t/Subscriptions/busy", 1)  # receiving from a subscription keeps its topic too
        clock.advance(3 * MINUTE)
        ns.tick()
        assert [t.name for t in ns.list_topics()] == ["t"]
        clock.advance(6 * MINUTE)
        ns.tick()
        assert ns.list_topics() == []
        await ns.close()
        ns = await Namespace.open(stores.open(), clock)
        assert ns.list_topics() == []
        await ns.create_topic("t", requires_duplicate_detection=True)
        await ns.create_subscription("t", "busy")
        assert (await ns.send("t", Message(b"", message_id="m")))[0].duplicate is False
        assert [r.name for r in ns.list_rules("t", "busy")] == ["$Default"]

    run(go())


def test_idle_time_goes_on_across_a_clean_restart(stores: StoreFactory) -> None:
    """Service Bus keeps an entity's last access across its own restarts: a clean stop stores it."""

    async def go() -> None:
        clock = ManualClock(START)
        ns = await Namespace.open(stores.open(), clock)
        await ns.create_queue("q", auto_delete_on_idle="PT5M")
        await ns.create_queue("used", auto_delete_on_idle="PT5M")
        clock.advance(2 * MINUTE)
        await ns.send("used", Message(b""))
        clock.advance(2 * MINUTE)
        await ns.close()
        ns = await Namespace.open(stores.open(), clock)
        clock.advance(1 * MINUTE + 1)
        ns.tick()
        assert [q.name for q in ns.list_queues()] == ["used"]  # 5 minutes since q's creation; 3 since used's send
        clock.advance(2 * MINUTE)
        ns.tick()
        assert ns.list_queues() == []

    run(go())


def test_idle_time_counts_from_the_start_after_a_crash(stores: StoreFactory) -> None:
    """Without a clean stop the times of last use are not known: idle time counts from the start (never less)."""

    async def go() -> None:
        clock = ManualClock(START)
        ns = await Namespace.open(stores.open(), clock)
        await ns.create_queue("q", auto_delete_on_idle="PT5M")
        clock.advance(1 * MINUTE)
        await ns.close()  # a clean stop stores q's last use (its creation) ...
        ns = await Namespace.open(stores.open(), clock)  # ... which this start takes, and forgets in the store
        clock.advance(3 * MINUTE)
        await ns.send("q", Message(b""))  # used at 4 minutes; then the process dies (no close)
        clock.advance(30 * SECOND)
        ns = await Namespace.open(stores.open(), clock)
        clock.advance(4 * MINUTE)
        ns.tick()
        assert [q.name for q in ns.list_queues()] == ["q"]  # 4.5 minutes since its last use: kept
        clock.advance(1 * MINUTE)
        ns.tick()
        assert ns.list_queues() == []

    run(go())


def test_an_idle_deletion_wakes_the_waiters_and_entity_gone_is_no_activity(stores: StoreFactory) -> None:
    """A link waiting on a queue (an AMQP receiver without credit, a sender) learns at once that the queue was
    deleted for being idle, as from an explicit delete; looking whether it is still there keeps nothing alive."""

    async def go() -> None:
        clock = ManualClock(START)
        ns = await Namespace.open(stores.open(), clock)
        await ns.create_queue("q", auto_delete_on_idle="PT5M")
        await ns.create_topic("t")
        await ns.create_subscription("t", "s", auto_delete_on_idle="PT5M")
        waiters = [
            asyncio.ensure_future(ns.wait_for_change(3600, path="q")),
            asyncio.ensure_future(ns.wait_for_change(3600, path="t/subscriptions/s")),
        ]
        await asyncio.sleep(0)  # (they wait from now)
        for _ in range(4):
            clock.advance(MINUTE)
            assert ns.entity_gone("q") is None
            assert ns.entity_gone("t/subscriptions/s/$deadletterqueue") is None
            ns.tick()
        await asyncio.sleep(0)
        assert not any(w.done() for w in waiters)
        clock.advance(MINUTE)
        ns.tick()
        await asyncio.wait_for(asyncio.gather(*waiters), 5)
        for path, named in [("q", "'q'"), ("t/subscriptions/s", "'t/Subscriptions/s'")]:
            gone = ns.entity_gone(path)
            assert isinstance(gone, EntityNotFoundError)
            assert named in str(gone)
        assert ns.entity_gone("t") is None
        await ns.close()

    run(go())
