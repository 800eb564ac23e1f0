"""Broker capabilities beyond the scenarios: locks, settlement, dead-letter, TTL, sessions, scheduling, errors."""

from __future__ import annotations

from datetime import timedelta

import pytest

from oncebus.broker import ManualClock, Message, Namespace, ServiceBusReceiveMode
from oncebus.core.errors import (
    EntityAlreadyExistsError,
    EntityNotFoundError,
    ImmutablePropertyError,
    InvalidArgumentError,
    MessageLockLostError,
    MessageNotFoundError,
    MessageSizeExceededError,
    OperationTimeoutError,
    SessionCannotBeLockedError,
    SessionLockLostError,
)
from oncebus.core.timeutil import us_to_datetime
from tests.broker.conftest import StoreFactory, run

RAD = ServiceBusReceiveMode.RECEIVE_AND_DELETE


async def _ns(stores: StoreFactory, clock: ManualClock | None = None) -> Namespace:
    return await Namespace.open(stores.open(), clock or ManualClock())


def test_peek_lock_complete_abandon_and_delivery_count(stores: StoreFactory) -> None:
    async def go() -> None:
        ns = await _ns(stores)
        await ns.create_queue("q")
        await ns.send("q", [Message(b"1", message_id="1"), Message(b"2", message_id="2")])
        first = await ns.receive("q", 1)
        assert [m.body for m in first] == [b"1"] and first[0].delivery_count == 1
        await ns.abandon("q", first[0].lock_token)  # type: ignore[arg-type]
        again = await ns.receive("q", 5)
        assert [m.message_id for m in again] == ["1", "2"]
        assert again[0].delivery_count == 2
        for m in again:
            await ns.complete("q", m.lock_token)  # type: ignore[arg-type]
        assert await ns.receive("q", 5) == []
        with pytest.raises(MessageLockLostError):
            await ns.complete("q", again[0].lock_token)  # type: ignore[arg-type]

    run(go())


def test_a_peek_shows_the_delivery_count_of_the_next_receive_after_an_abandon_or_a_lock_expiry(
    stores: StoreFactory,
) -> None:
    """Service Bus counts a delivery attempt when its lock is abandoned or expires; a peek (and the admin view of
    it) shows the count the next receive shows, and while the message is locked the count its delivery showed."""

    async def go() -> None:
        clock = ManualClock()
        ns = await _ns(stores, clock)
        await ns.create_queue("q", lock_duration="PT30S")
        await ns.send("q", Message(b"x", message_id="m"))

        def peeked() -> tuple[int, int]:
            (message,) = ns.peek_messages("q", 5)
            return message.delivery_count, message.to_dict()["delivery_count"]

        assert peeked() == (1, 1)  # what the first receive shows
        first = (await ns.receive("q"))[0]
        assert first.delivery_count == 1 and peeked() == (1, 1)
        await ns.abandon("q", first.lock_token)  # type: ignore[arg-type]
        assert peeked() == (2, 2)
        second = (await ns.receive("q"))[0]
        assert second.delivery_count == 2 and peeked() == (2, 2)
        clock.advance(31)
        ns.tick()  # the lock expires: one more attempt counted
        assert peeked() == (3, 3)
        third = (await ns.receive("q"))[0]
        assert third.delivery_count == 3 and peeked() == (3, 3)
        await ns.abandon("q", third.lock_token, failed=False)  # released: no attempt
        assert peeked() == (3, 3)
        assert (await ns.receive("q"))[0].delivery_count == 3

    run(go())


def test_lock_expiry_renew_and_max_delivery_count(stores: StoreFactory) -> None:
    async def go() -> None:
        clock = ManualClock()
        ns = await _ns(stores, clock)
        await ns.create_queue("q", lock_duration="PT30S", max_delivery_count=2)
        await ns.send("q", Message(b"x", message_id="m"))
        got = (await ns.receive("q"))[0]
        clock.advance(20)
        renewed = await ns.renew_lock("q", got.lock_token)  # type: ignore[arg-type]
        assert renewed == us_to_datetime(clock.now_us() + 30_000_000)
        clock.advance(20)
        await ns.complete("q", got.lock_token)  # type: ignore[arg-type] # still locked thanks to the renewal
        await ns.send("q", Message(b"y", message_id="n"))
        got = (await ns.receive("q"))[0]
        clock.advance(31)
        ns.tick()
        with pytest.raises(MessageLockLostError):
            await ns.complete("q", got.lock_token)  # type: ignore[arg-type]
        second = (await ns.receive("q"))[0]
        assert second.delivery_count == 2
        await ns.abandon("q", second.lock_token)  # type: ignore[arg-type]
        assert await ns.receive("q") == []
        dead = await ns.receive("q/$DeadLetterQueue", 5, receive_mode=RAD)
        assert [m.message_id for m in dead] == ["n"]
        assert dead[0].dead_letter_reason == "MaxDeliveryCountExceeded"

    run(go())


def test_defer_and_receive_deferred(stores: StoreFactory) -> None:
    async def go() -> None:
        ns = await _ns(stores)
        await ns.create_queue("q")
        await ns.send("q", Message(b"x", message_id="m"))
        got = (await ns.receive("q"))[0]
        await ns.defer("q", got.lock_token)  # type: ignore[arg-type]
        assert await ns.receive("q") == []
        assert ns.stats("q").deferred_message_count == 1
        with pytest.raises(MessageNotFoundError):
            await ns.receive_deferred_messages("q", [got.sequence_number + 100])
        deferred = await ns.receive_deferred_messages("q", [got.sequence_number])
        await ns.complete("q", deferred[0].lock_token)  # type: ignore[arg-type]
        assert ns.stats("q").deferred_message_count == 0

    run(go())


def test_dead_letter_with_reason_and_peek(stores: StoreFactory) -> None:
    async def go() -> None:
        ns = await _ns(stores)
        await ns.create_queue("q")
        await ns.send("q", [Message(b"a", message_id="a"), Message(b"b", message_id="b")])
        got = (await ns.receive("q"))[0]
        await ns.dead_letter("q", got.lock_token, reason="bad", error_description="broken")  # type: ignore[arg-type]
        dlq = ns.peek_messages("Q/$deadletterqueue", 10)
        assert [(m.message_id, m.dead_letter_reason, m.dead_letter_error_description) for m in dlq] == [
            ("a", "bad", "broken")
        ]
        peeked = ns.peek_messages("q", 10)
        assert [m.message_id for m in peeked] == ["b"]
        assert ns.peek_messages("q", 10, sequence_number=peeked[0].sequence_number + 1) == []

    run(go())


def test_ttl_expiry_drops_or_dead_letters(stores: StoreFactory) -> None:
    async def go() -> None:
        clock = ManualClock()
        ns = await _ns(stores, clock)
        await ns.create_queue("drop", default_message_time_to_live="PT1M")
        await ns.create_queue("keep", dead_lettering_on_message_expiration=True)
        await ns.send("drop", Message(b"x", message_id="a"))
        await ns.send("keep", Message(b"x", message_id="a", time_to_live=timedelta(seconds=10)))
        clock.advance(61)
        ns.tick()
        assert await ns.receive("drop") == []
        assert await ns.receive("keep") == []
        dead = await ns.receive("keep/$DeadLetterQueue", receive_mode=RAD)
        assert dead[0].dead_letter_reason == "TTLExpiredException"

    run(go())


def test_schedule_and_cancel_keeps_the_key(stores: StoreFactory) -> None:
    async def go() -> None:
        clock = ManualClock()
        ns = await _ns(stores, clock)
        await ns.create_queue("q", requires_duplicate_detection=True)
        seqs = await ns.schedule_messages("q", Message(b"x", message_id="a"), us_to_datetime(clock.now_us() + 60e6))
        assert ns.stats("q").scheduled_message_count == 1
        assert await ns.receive("q") == []
        await ns.cancel_scheduled_messages("q", seqs)
        assert ns.stats("q").scheduled_message_count == 0
        await ns.send("q", Message(b"x", message_id="a"))
        clock.advance(120)
        ns.tick()
        assert await ns.receive("q") == []
        with pytest.raises(MessageNotFoundError):
            await ns.cancel_scheduled_messages("q", seqs)

    run(go())


def test_sessions_lock_state_and_next_available(stores: StoreFactory) -> None:
    async def go() -> None:
        clock = ManualClock()
        ns = await _ns(stores, clock)
        await ns.create_queue("s", requires_session=True, lock_duration="PT10S")
        with pytest.raises(InvalidArgumentError, match="SessionId was not set"):
            await ns.send("s", Message(b"x", message_id="nosession"))
        await ns.send(
            "s", [Message(b"1", session_id="b"), Message(b"2", session_id="a"), Message(b"3", session_id="b")]
        )
        with pytest.raises(InvalidArgumentError, match="requires sessions"):
            await ns.receive("s")
        first = await ns.accept_session("s")
        assert first.session_id == "b"
        with pytest.raises(SessionCannotBeLockedError):
            await ns.accept_session("s", "b")
        second = await ns.accept_session("s")
        assert second.session_id == "a"
        with pytest.raises(OperationTimeoutError):
            await ns.accept_session("s", max_wait_time=0.05)
        got = await ns.receive("s", 10, session=first)
        assert [m.body for m in got] == [b"1", b"3"]
        await ns.set_session_state(first, b"state")
        assert await ns.get_session_state(first) == b"state"
        await ns.complete("s", got[0].lock_token)  # type: ignore[arg-type]
        clock.advance(11)
        ns.tick()
        with pytest.raises(SessionLockLostError):
            await ns.complete("s", got[1].lock_token)  # type: ignore[arg-type]
        with pytest.raises(SessionLockLostError):
            await ns.receive("s", session=first)
        again = await ns.accept_session("s", "b")
        assert await ns.get_session_state(again) == b"state"
        await ns.renew_session_lock(again)
        assert [m.body for m in await ns.receive("s", 10, session=again)] == [b"3"]
        assert ns.list_sessions("s") == ["a", "b"]

    run(go())


def test_topic_fans_out_and_checks_once(stores: StoreFactory) -> None:
    async def go() -> None:
        ns = await _ns(stores)
        await ns.create_topic("t", requires_duplicate_detection=True)
        await ns.create_subscription("t", "a")
        await ns.create_subscription("t", "b")
        await ns.send("t", [Message(b"1", message_id="x"), Message(b"1", message_id="x")])
        for sub in ("t/Subscriptions/a", "T/subscriptions/B"):
            assert [m.message_id for m in await ns.receive(sub, 10, receive_mode=RAD)] == ["x"]
        stats = ns.stats("t")
        assert stats.accepted == 1 and stats.duplicates_dropped == 1 and stats.keys_held == 1

    run(go())


def test_bad_input_stores_nothing(stores: StoreFactory) -> None:
    async def go() -> None:
        ns = await _ns(stores)
        await ns.create_queue("q", requires_duplicate_detection=True, max_message_size_in_kilobytes=1)
        with pytest.raises(InvalidArgumentError, match="at most 128"):
            await ns.send("q", [Message(b"ok", message_id="fine"), Message(b"x", message_id="m" * 129)])
        with pytest.raises(InvalidArgumentError, match="differs from session_id"):
            await ns.send("q", Message(b"x", message_id="a", session_id="s", partition_key="t"))
        with pytest.raises(MessageSizeExceededError, match="over the limit of 1024 bytes"):
            await ns.send("q", [Message(b"ok", message_id="fine"), Message(b"x" * 2000, message_id="big")])
        with pytest.raises(EntityNotFoundError, match="nope"):
            await ns.send("nope", Message(b"x"))
        with pytest.raises(ImmutablePropertyError, match="requires_duplicate_detection"):
            await ns.update_queue("q", requires_duplicate_detection=False, lock_duration="PT2M")
        with pytest.raises(InvalidArgumentError, match=r"between 00:00:20 and 7\.00:00:00\."):
            await ns.update_queue("q", duplicate_detection_history_time_window="PT5S")
        with pytest.raises(InvalidArgumentError, match="not a valid duration"):
            await ns.create_queue("r", duplicate_detection_history_time_window="ten minutes")
        with pytest.raises(EntityAlreadyExistsError):
            await ns.create_queue("Q")
        props = ns.get_queue("q")
        assert props.lock_duration == timedelta(minutes=1) and props.requires_duplicate_detection
        stats = ns.stats("q")
        assert stats.accepted == 0 and stats.keys_held == 0 and stats.active_message_count == 0
        # "fine" was in the rejected batches: it is still new
        await ns.send("q", Message(b"ok", message_id="fine"))
        assert ns.stats("q").active_message_count == 1
        await ns.close()
        reopened = await Namespace.open(stores.open(), ns.clock)
        assert reopened.stats("q").active_message_count == 1
        assert reopened.list_queues()[0].name == "q"
        assert [q.name for q in reopened.list_queues()] == ["q"]

    run(go())


def test_late_resends_are_counted_with_their_delay(stores: StoreFactory) -> None:
    async def go() -> None:
        clock = ManualClock()
        ns = await _ns(stores, clock)
        await ns.create_queue("q", requires_duplicate_detection=True, duplicate_detection_history_time_window="PT20S")
        await ns.send("q", Message(b"x", message_id="a"))
        clock.advance(5)
        await ns.send("q", Message(b"x", message_id="a"))
        clock.advance(17)
        outcome = await ns.send("q", Message(b"x", message_id="a"))
        assert not outcome[0].duplicate and outcome[0].late_resend_delay_us == 22_000_000
        stats = ns.stats("q")
        assert stats.late_resends == 1 and stats.late_resend_delay_seconds.max == 22.0
        assert stats.accepted == 2 and stats.duplicates_dropped == 1
        assert stats.oldest_key_age_seconds == 0.0

    run(go())


def test_delete_entities_and_not_found(stores: StoreFactory) -> None:
    async def go() -> None:
        ns = await _ns(stores)
        await ns.create_topic("t")
        await ns.create_subscription("t", "s")
        await ns.send("t", Message(b"x"))
        await ns.delete_subscription("t", "s")
        with pytest.raises(EntityNotFoundError):
            await ns.receive("t/Subscriptions/s")
        await ns.delete_topic("t")
        with pytest.raises(EntityNotFoundError):
            ns.get_topic("t")
        await ns.close()
        assert (await Namespace.open(stores.open(), ns.clock)).list_topics() == []

    run(go())


def test_clock_stepping_back_across_a_restart_keeps_working(stores: StoreFactory) -> None:
    async def go() -> None:
        clock = ManualClock(2_000_000_000_000_000)
        ns = await _ns(stores, clock)
        await ns.create_queue("q", requires_duplicate_detection=True)
        await ns.send("q", Message(b"x", message_id="a"))
        await ns.close()
        earlier = ManualClock(1_999_999_000_000_000)  # the wall clock went back 1000 s
        again = await Namespace.open(stores.open(), earlier)
        assert (await again.send("q", Message(b"x", message_id="a")))[0].duplicate
        assert not (await again.send("q", Message(b"x", message_id="b")))[0].duplicate

    run(go())
