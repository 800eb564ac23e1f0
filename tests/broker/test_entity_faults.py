"""Issue 7 at the broker API, on both stores and through a restart: entity deletion, far times, sizes, errors."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from oncebus.broker import ManualClock, Message, Namespace, ServiceBusReceiveMode
from oncebus.broker.receivable import QUOTA_BYTES_PER_MESSAGE
from oncebus.core.errors import (
    ArgumentOutOfRangeError,
    EntityNotFoundError,
    InvalidArgumentError,
    QuotaExceededError,
)
from oncebus.core.timeutil import MAX_DATETIME, datetime_to_us, timestamp_ms_to_datetime, us_to_datetime
from oncebus.store.memory import MemoryStore
from tests.broker.conftest import StoreFactory, run

RAD = ServiceBusReceiveMode.RECEIVE_AND_DELETE


async def _ns(stores: StoreFactory, clock: ManualClock | None = None) -> Namespace:
    return await Namespace.open(stores.open(), clock or ManualClock())


# ---------------------------------------------------------------------------------- item 1: deletion by prefix
def test_deleting_a_queue_keeps_the_queues_named_under_it(stores: StoreFactory) -> None:
    async def go() -> None:
        clock = ManualClock()
        ns = await _ns(stores, clock)
        await ns.create_queue("orders", requires_duplicate_detection=True)
        await ns.create_queue("orders/eu", requires_duplicate_detection=True)
        await ns.create_queue("orders_x")  # LIKE's '_' wildcard would match 'orders/' here
        await ns.send("orders", Message(b"o", message_id="o-1"))
        await ns.send("orders/eu", [Message(b"eu", message_id="eu-1"), Message(b"eu2", message_id="eu-2")])
        await ns.send("orders_x", Message(b"x", message_id="x-1"))
        got = await ns.receive("orders/eu", 1)
        await ns.dead_letter("orders/eu", got[0].lock_token)  # type: ignore[arg-type]
        await ns.delete_queue("orders")
        await ns.close()

        ns = await _ns(stores, clock)  # restart
        assert sorted(q.name for q in ns.list_queues()) == ["orders/eu", "orders_x"]
        assert [m.message_id for m in ns.peek_messages("orders/eu", 5)] == ["eu-2"]
        assert [m.message_id for m in ns.peek_messages("orders/eu/$DeadLetterQueue", 5)] == ["eu-1"]
        assert [m.message_id for m in ns.peek_messages("orders_x", 5)] == ["x-1"]
        assert ns.stats("orders/eu").accepted == 2 and ns.stats("orders/eu").keys_held == 2
        assert (await ns.send("orders/eu", Message(b"eu", message_id="eu-1")))[0].duplicate
        with pytest.raises(EntityNotFoundError):
            ns.get_queue("orders")
        await ns.create_queue("orders", requires_duplicate_detection=True)  # the old one left nothing behind
        assert ns.peek_messages("orders", 5) == []
        assert not (await ns.send("orders", Message(b"o", message_id="o-1")))[0].duplicate

    run(go())


def test_deleting_a_topic_deletes_its_subscriptions_only(stores: StoreFactory) -> None:
    async def go() -> None:
        clock = ManualClock()
        ns = await _ns(stores, clock)
        await ns.create_topic("events", requires_duplicate_detection=True)
        await ns.create_subscription("events", "audit")
        await ns.create_queue("events/audit", requires_duplicate_detection=True)
        await ns.create_topic("events/eu")
        await ns.create_subscription("events/eu", "all")
        await ns.send("events", Message(b"e", message_id="e-1"))
        got = await ns.receive("events/subscriptions/audit")
        await ns.dead_letter("events/subscriptions/audit", got[0].lock_token)  # type: ignore[arg-type]
        await ns.send("events", Message(b"e", message_id="e-2"))
        await ns.send("events/audit", Message(b"q", message_id="q-1"))
        await ns.send("events/eu", Message(b"eu", message_id="eu-1"))
        await ns.delete_topic("events")
        await ns.close()

        ns = await _ns(stores, clock)
        assert [q.name for q in ns.list_queues()] == ["events/audit"]
        assert [t.name for t in ns.list_topics()] == ["events/eu"]
        assert [m.message_id for m in ns.peek_messages("events/audit", 5)] == ["q-1"]
        assert [m.message_id for m in ns.peek_messages("events/eu/subscriptions/all", 5)] == ["eu-1"]
        await ns.create_topic("events")
        await ns.create_subscription("events", "audit")
        assert ns.peek_messages("events/subscriptions/audit", 5) == []
        assert ns.peek_messages("events/subscriptions/audit/$deadletterqueue", 5) == []

    run(go())


# ---------------------------------------------------------------------------------- item 2: far times
NEVER_TEXT = "P10675199D"  # what Service Bus reports for "never", without TimeSpan.MaxValue's hours


def test_a_time_to_live_past_year_9999_means_never(stores: StoreFactory) -> None:
    async def go() -> None:
        clock = ManualClock()
        ns = await _ns(stores, clock)
        await ns.create_queue("q", default_message_time_to_live=NEVER_TEXT)
        await ns.create_topic("t", default_message_time_to_live=NEVER_TEXT)
        await ns.create_subscription("t", "s", default_message_time_to_live=NEVER_TEXT)
        await ns.send("q", Message(b"1", message_id="1"))
        await ns.send("q", Message(b"2", message_id="2", time_to_live=timedelta(days=10_000_000)))
        await ns.send("t", Message(b"3", message_id="3"))
        later = datetime(9999, 12, 31, tzinfo=UTC)
        await ns.schedule_messages("q", Message(b"4", message_id="4", time_to_live=timedelta(days=1)), later)

        peeked = ns.peek_messages("q", 10)
        assert [m.message_id for m in peeked] == ["1", "2", "4"]
        assert [m.expires_at_utc for m in peeked] == [None, None, None]  # never (4: past the end once enqueued)
        assert peeked[0].time_to_live == timedelta(days=10675199)
        assert ns.stats("q").active_message_count == 2 and ns.stats("q").scheduled_message_count == 1
        got = await ns.receive("q", 10)
        assert [m.message_id for m in got] == ["1", "2"] and got[0].expires_at_utc is None
        for m in got:
            await ns.complete("q", m.lock_token)  # type: ignore[arg-type]
        assert ns.stats("q").active_message_count == 0
        assert [m.message_id for m in ns.peek_messages("t/subscriptions/s", 5)] == ["3"]
        clock.advance(86_400 * 365 * 100)  # a century: nothing expires
        ns.tick()
        await ns.close()

        ns = await _ns(stores, clock)
        assert [m.message_id for m in await ns.receive("t/subscriptions/s", 5, receive_mode=RAD)] == ["3"]
        assert [m.message_id for m in ns.peek_messages("q", 5)] == ["4"]

    run(go())


def test_locks_and_expiries_near_year_9999_are_capped(stores: StoreFactory) -> None:
    async def go() -> None:
        end = datetime_to_us(MAX_DATETIME)
        clock = ManualClock(end - 60_000_000)  # one minute before the end of year 9999
        ns = await _ns(stores, clock)
        await ns.create_queue("q", lock_duration="PT5M", default_message_time_to_live="PT10M")
        await ns.send("q", Message(b"x", message_id="x"))
        got = (await ns.receive("q"))[0]
        assert got.locked_until_utc == MAX_DATETIME and got.expires_at_utc is None
        assert await ns.renew_lock("q", got.lock_token) == MAX_DATETIME  # type: ignore[arg-type]
        await ns.abandon("q", got.lock_token)  # type: ignore[arg-type]
        assert [m.message_id for m in ns.peek_messages("q")] == ["x"]

    run(go())


def test_a_stored_expiry_past_year_9999_from_an_earlier_release_reads_as_never(stores: StoreFactory) -> None:
    async def go() -> None:
        from oncebus.core.messages import StoredMessage
        from oncebus.store.base import PutMessage

        ns = await _ns(stores)
        await ns.create_queue("q")
        await ns.close()
        far = datetime_to_us(MAX_DATETIME) + 10**15
        old = StoredMessage(path="q", sequence_number=1, message_id="old", body=b"o", enqueued_time_us=0,
                            expires_at_us=far)  # fmt: skip
        stores.open().submit([PutMessage(old)]).result()
        ns = await _ns(stores)
        assert [(m.message_id, m.expires_at_utc) for m in ns.peek_messages("q")] == [("old", None)]
        assert [m.message_id for m in await ns.receive("q", receive_mode=RAD)] == ["old"]

    run(go())


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (Message(b"x", message_id="a", time_to_live=5), "time_to_live must be a duration"),  # type: ignore[arg-type]
        (Message(b"x", message_id="a", time_to_live=timedelta(0)), "time_to_live must be positive"),
        (
            Message(b"x", message_id="a", scheduled_enqueue_time_utc=253402300800000),  # type: ignore[arg-type]
            "scheduled_enqueue_time_utc must be a UTC time",
        ),
        (Message("text", message_id="a"), "body must be bytes"),  # type: ignore[arg-type]
        (Message(b"x", message_id="a", subject=7), "subject must be text"),  # type: ignore[arg-type]
        (Message(b"x", message_id="a", application_properties={(1, 2): 3}), "application_properties keys must be text"),
    ],
)
def test_a_bad_message_field_is_refused_for_that_message_only(message: Message, error: str) -> None:
    async def go() -> None:
        ns = await Namespace.open(MemoryStore(), ManualClock())
        await ns.create_queue("q", requires_duplicate_detection=True)
        with pytest.raises(InvalidArgumentError, match=f"message 2 of 2: {error}"):
            await ns.send("q", [Message(b"ok", message_id="ok"), message])
        assert ns.stats("q").accepted == 0 and ns.stats("q").keys_held == 0
        await ns.send("q", Message(b"ok", message_id="ok"))  # the connection and the entity go on
        assert ns.stats("q").active_message_count == 1

    run(go())


def test_a_scheduled_time_past_year_9999_is_refused_with_a_clear_error() -> None:
    ms = datetime_to_us(MAX_DATETIME) // 1000 + 1
    with pytest.raises(ArgumentOutOfRangeError, match=r"x-opt-scheduled-enqueue-time.*between year 1 and year 9999"):
        timestamp_ms_to_datetime(ms, name="x-opt-scheduled-enqueue-time")
    with pytest.raises(InvalidArgumentError, match="must be a timestamp"):
        timestamp_ms_to_datetime("soon", name="x-opt-scheduled-enqueue-time")
    with pytest.raises(ArgumentOutOfRangeError):
        us_to_datetime(ms * 1000)
    assert timestamp_ms_to_datetime(ms - 1, name="t") == MAX_DATETIME.replace(microsecond=999_000)


# ---------------------------------------------------------------------------------- item 10: the missing entity
def test_sending_to_a_missing_entity_names_queue_or_topic() -> None:
    async def go() -> None:
        ns = await Namespace.open(MemoryStore(), ManualClock())
        await ns.create_queue("q")
        with pytest.raises(EntityNotFoundError, match="no queue or topic named 'nowhere'"):
            await ns.send("nowhere", Message(b"x"))
        with pytest.raises(EntityNotFoundError, match="no queue or topic named 'nowhere'"):
            ns.get_topic("nowhere")  # how a front end looks a send link's target up
        with pytest.raises(EntityNotFoundError, match="'q' is a queue, not a topic"):
            ns.get_topic("q")

    run(go())


# ---------------------------------------------------------------------------------- item 11: entity size
def _wired(n: int, tag: str) -> Message:
    """A message as the AMQP front end hands it over: ``wire`` is its whole encoding, body included."""
    body = b"b" * n
    return Message(body, message_id=tag, wire=b"\x00\x53\x75\xb0" + len(body).to_bytes(4, "big") + body)


def test_the_entity_size_counts_each_message_once_at_its_wire_size(stores: StoreFactory) -> None:
    async def go() -> None:
        clock = ManualClock()
        ns = await _ns(stores, clock)
        limit = 1024 * 1024
        await ns.create_queue("q", max_size_in_megabytes=1, requires_duplicate_detection=True)
        await ns.create_topic("t", max_size_in_megabytes=1)
        await ns.create_subscription("t", "s")
        for entity, path in (("q", "q"), ("t", "t/subscriptions/s")):
            chunk = 200 * 1024
            for i in range(5):  # 5 x (200 KiB + 8 bytes of framing): ~0.98 MiB
                await ns.send(entity, _wired(chunk, f"{entity}-{i}"))
            used = 5 * (chunk + 8 + QUOTA_BYTES_PER_MESSAGE)  # each message also counts a fixed overhead
            room = limit - used - QUOTA_BYTES_PER_MESSAGE
            with pytest.raises(QuotaExceededError, match="max_size_in_megabytes=1"):
                await ns.send(entity, _wired(room - 8 + 1, "over"))  # one byte over: refused, nothing stored
            assert ns.stats(entity).accepted == 5
            assert len(ns.peek_messages(path, 10)) == 5
            await ns.send(entity, _wired(room - 8, "edge"))  # exactly full: accepted
            with pytest.raises(QuotaExceededError):
                await ns.send(entity, _wired(0, "one-more"))
            assert ns.stats(entity).accepted == 6
        await ns.close()
        ns = await _ns(stores, clock)  # the same after a restart
        with pytest.raises(QuotaExceededError):
            await ns.send("q", _wired(0, "after-restart"))
        await ns.receive("q", receive_mode=RAD)  # room again
        await ns.send("q", _wired(200 * 1024, "after-restart"))

    run(go())
