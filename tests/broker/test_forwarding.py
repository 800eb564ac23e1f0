"""Auto-forwarding in the broker engine: chains, the destination's duplicate detection, the 4-hop limit,
loops refused, dead-lettered messages forwarded, scheduled messages forwarded when due. Time is a ManualClock."""

from __future__ import annotations

from datetime import timedelta

import pytest

from oncebus.broker import ManualClock, Message, Namespace
from oncebus.core.errors import EntityNotFoundError, InvalidArgumentError
from oncebus.core.rules import RuleProperties, SqlRuleFilter
from oncebus.core.timeutil import us_to_datetime
from tests.broker.conftest import StoreFactory, run

START = 1_800_000_000_000_000
SECOND = 1_000_000


async def ids(ns: Namespace, path: str) -> list[str]:
    got = await ns.receive(path, 100)
    for m in got:
        await ns.complete(path, m.lock_token)  # type: ignore[arg-type]
    return [str(m.message_id) for m in got]


def test_a_chain_through_queues_a_topic_and_its_rules(stores: StoreFactory) -> None:
    async def go() -> None:
        clock = ManualClock(START)
        ns = await Namespace.open(stores.open(), clock)
        await ns.create_queue("end")
        await ns.create_topic("t")
        await ns.create_subscription("t", "all")
        await ns.create_subscription("t", "red", forward_to="end")
        await ns.set_rules("t", "red", [RuleProperties("red", SqlRuleFilter("color = 'red'"))])
        await ns.create_queue("second", forward_to="t")
        await ns.create_queue("first", forward_to="second")
        sent = await ns.send(
            "first",
            [
                Message(b"1", message_id="r", application_properties={"color": "red"}),
                Message(b"2", message_id="b", application_properties={"color": "blue"}),
            ],
        )
        assert [o.sequence_number for o in sent] == [1, 2]
        assert ns.peek_messages("first") == [] and ns.peek_messages("second") == []
        await ns.close()
        ns = await Namespace.open(stores.open(), clock)  # what was forwarded is stored where it arrived
        assert await ids(ns, "t/Subscriptions/all") == ["r", "b"]
        assert await ids(ns, "end") == ["r"]  # kept its message id through three hops
        assert await ids(ns, "t/Subscriptions/red") == []
        assert [ns.stats(name).accepted for name in ("first", "second", "t", "end")] == [2, 2, 2, 1]

    run(go())


def test_the_destination_judges_a_forwarded_message_as_a_send(stores: StoreFactory) -> None:
    async def go() -> None:
        clock = ManualClock(START)
        ns = await Namespace.open(stores.open(), clock)
        await ns.create_queue("dest", requires_duplicate_detection=True, duplicate_detection_history_time_window="PT1M")
        await ns.create_queue("src", requires_duplicate_detection=True, duplicate_detection_history_time_window="PT20S")
        await ns.create_queue("plain", forward_to="dest")
        await ns.send("src", Message(b"", message_id="a"))  # src keeps it (src does not forward)
        await ns.update_queue("src", forward_to="dest")
        ns.tick()  # what sat in src moves on
        assert await ids(ns, "dest") == ["a"]
        clock.advance(30)  # past src's window (20 s), inside dest's (1 min)
        outcome = await ns.send("src", Message(b"", message_id="a"))
        assert outcome[0].duplicate is False  # src accepts it: its own window has passed ...
        assert await ids(ns, "dest") == []  # ... and dest drops it: within dest's window, as a send would be
        await ns.send("plain", Message(b"", message_id="a"))
        assert await ids(ns, "dest") == []
        assert ns.stats("dest").duplicates_dropped == 2
        clock.advance(31)  # dest's window has passed since the first
        await ns.send("plain", Message(b"", message_id="a"))
        assert await ids(ns, "dest") == ["a"]

    run(go())


def test_a_message_is_forwarded_four_times_at_most(stores: StoreFactory) -> None:
    async def go() -> None:
        ns = await Namespace.open(stores.open(), ManualClock(START))
        await ns.create_queue("q6")
        for i in range(5, 0, -1):
            await ns.create_queue(f"q{i}", forward_to=f"q{i + 1}")
        await ns.send("q2", Message(b"", message_id="four"))  # q2 -> q3 -> q4 -> q5 -> q6: four hops
        assert await ids(ns, "q6") == ["four"]
        await ns.send("q1", Message(b"", message_id="five"))  # a fifth hop is one too many
        assert await ids(ns, "q6") == []
        dead = await ns.receive("q5/$DeadLetterQueue", 10)
        assert [(m.message_id, m.dead_letter_reason) for m in dead] == [("five", "MaxTransferHopCountExceeded")]

    run(go())


def test_loops_and_missing_destinations_are_refused(stores: StoreFactory) -> None:
    async def go() -> None:
        ns = await Namespace.open(stores.open(), ManualClock(START))
        with pytest.raises(EntityNotFoundError, match="no queue or topic named 'nowhere'"):
            await ns.create_queue("q", forward_to="nowhere")
        await ns.create_queue("a")
        await ns.create_queue("b", forward_to="a")
        with pytest.raises(InvalidArgumentError, match=r"forwarding loop \(a -> b -> a\)"):
            await ns.update_queue("a", forward_to="b")
        await ns.create_topic("t")
        await ns.create_subscription("t", "out", forward_to="b")
        with pytest.raises(InvalidArgumentError, match=r"\(a -> t -> b -> a\)"):
            await ns.update_queue("a", forward_to="t")
        assert ns.get_queue("a").forward_to is None
        await ns.create_queue("dlq-self", forward_dead_lettered_messages_to="a")  # dead letters only: no loop

    run(go())


def test_dead_lettered_messages_are_forwarded(stores: StoreFactory) -> None:
    async def go() -> None:
        clock = ManualClock(START)
        ns = await Namespace.open(stores.open(), clock)
        await ns.create_queue("parking")
        await ns.create_queue(
            "work", forward_dead_lettered_messages_to="parking", dead_lettering_on_message_expiration=True
        )
        old = Message(b"", message_id="old", time_to_live=timedelta(seconds=10))
        await ns.send("work", [Message(b"", message_id="bad"), old])
        (bad,) = await ns.receive("work", 1)
        await ns.dead_letter("work", bad.lock_token, reason="poison", error_description="cannot parse")  # type: ignore[arg-type]
        got = await ns.receive("parking", 10)
        assert [(m.message_id, m.dead_letter_reason) for m in got] == [("bad", "poison")]
        clock.advance(11)
        ns.tick()  # "old" expires, is dead-lettered, and moves on
        assert [m.message_id for m in await ns.receive("parking", 10)] == ["old"]
        assert await ns.receive("work/$DeadLetterQueue", 10) == []

    run(go())


def test_a_scheduled_message_is_forwarded_when_due(stores: StoreFactory) -> None:
    async def go() -> None:
        clock = ManualClock(START)
        ns = await Namespace.open(stores.open(), clock)
        await ns.create_queue("dest")
        await ns.create_queue("src", forward_to="dest")
        await ns.schedule_messages("src", Message(b"", message_id="later"), us_to_datetime(START + 5 * SECOND))
        ns.tick()
        assert await ids(ns, "dest") == []
        clock.advance(6)
        ns.tick()
        assert await ids(ns, "dest") == ["later"]

    run(go())


async def fill(ns: Namespace, path: str, body: int = 100_000) -> int:
    """Send to ``path`` until its size quota refuses; how many were stored."""
    from oncebus.core.errors import QuotaExceededError

    count = 0
    while True:
        try:
            await ns.send(path, Message(b"x" * body, message_id=f"fill-{count}"))
        except QuotaExceededError:
            return count
        count += 1


def test_a_forward_into_a_full_destination_is_dead_lettered_at_the_source(stores: StoreFactory) -> None:
    """Service Bus (auto-forwarding doc): a destination over its quota makes the source dead-letter the message."""

    async def go() -> None:
        ns = await Namespace.open(stores.open(), ManualClock(START))
        await ns.create_queue("dest", max_size_in_megabytes=1, requires_duplicate_detection=True)
        await ns.create_queue("src", forward_to="dest")
        held = await fill(ns, "dest")
        await ns.send("src", Message(b"y" * 100_000, message_id="late"))
        assert len(ns.peek_messages("dest", max_message_count=100)) == held  # the destination stays within its size
        (dead,) = await ns.receive("src/$DeadLetterQueue", 10)
        assert dead.message_id == "late" and dead.dead_letter_reason == "QuotaExceeded"
        assert "dest" in (dead.dead_letter_error_description or "")
        # nothing of it was recorded at the destination: once there is room, the same id is accepted there
        for m in await ns.receive("dest", 5):
            await ns.complete("dest", m.lock_token)  # type: ignore[arg-type]
        outcome = await ns.send("src", Message(b"y", message_id="late"))
        assert outcome[0].duplicate is False
        assert "late" in [str(m.message_id) for m in ns.peek_messages("dest", max_message_count=100)]

    run(go())


def test_dead_letters_forwarded_to_a_full_destination_wait_in_the_dead_letter_queue(stores: StoreFactory) -> None:
    """A dead-letter queue that forwards keeps what its destination has no room for, and forwards it once it has."""

    async def go() -> None:
        ns = await Namespace.open(stores.open(), ManualClock(START))
        await ns.create_queue("parking", max_size_in_megabytes=1)
        await ns.create_queue("work", forward_dead_lettered_messages_to="parking")
        held = await fill(ns, "parking")
        await ns.send("work", Message(b"z" * 100_000, message_id="bad"))
        (bad,) = await ns.receive("work", 1)
        await ns.dead_letter("work", bad.lock_token, reason="poison")  # type: ignore[arg-type]
        ns.tick()
        assert len(ns.peek_messages("parking", max_message_count=100)) == held
        (waiting,) = ns.peek_messages("work/$DeadLetterQueue", max_message_count=10)
        assert waiting.message_id == "bad" and waiting.dead_letter_reason == "poison"
        for m in await ns.receive("parking", 5):
            await ns.complete("parking", m.lock_token)  # type: ignore[arg-type]
        ns.tick()  # room again: it moves on
        assert ns.peek_messages("work/$DeadLetterQueue", max_message_count=10) == []
        assert "bad" in [str(m.message_id) for m in ns.peek_messages("parking", max_message_count=100)]

    run(go())


def test_a_forward_into_a_send_disabled_destination_still_arrives(stores: StoreFactory) -> None:
    """As Service Bus does (its team in Azure/azure-service-bus#666 and #743): a destination's status refuses
    clients' sends, not forwarding into it."""

    async def go() -> None:
        ns = await Namespace.open(stores.open(), ManualClock(START))
        await ns.create_queue("dest")
        await ns.create_queue("src", forward_to="dest")
        await ns.update_queue("dest", status="SendDisabled")
        await ns.send("src", Message(b"", message_id="m"))
        assert [str(m.message_id) for m in ns.peek_messages("dest", max_message_count=10)] == ["m"]

    run(go())


def test_dead_letters_whose_destination_was_deleted_stay_and_the_tick_returns(stores: StoreFactory) -> None:
    """A dead-letter queue forwarding to a queue deleted since keeps its messages; the timer does not spin on them."""

    async def go() -> None:
        ns = await Namespace.open(stores.open(), ManualClock(START))
        await ns.create_queue("parking")
        await ns.create_queue("work", forward_dead_lettered_messages_to="parking")
        await ns.delete_queue("parking")
        await ns.send("work", Message(b"", message_id="bad"))
        (bad,) = await ns.receive("work", 1)
        await ns.dead_letter("work", bad.lock_token, reason="poison")  # type: ignore[arg-type]
        ns.tick()
        ns.tick()
        (waiting,) = ns.peek_messages("work/$DeadLetterQueue", max_message_count=10)
        assert waiting.message_id == "bad"

    run(go())


def test_a_message_keeps_its_hop_count_while_it_waits_and_across_a_restart(stores: StoreFactory) -> None:
    """The four-transfer limit is the message's: two hops taken before it waited (and a restart) count later."""

    async def go() -> None:
        clock = ManualClock(START)
        ns = await Namespace.open(stores.open(), clock)
        for name in ("x3", "y3", "y2", "y1"):
            await ns.create_queue(name, forward_to={"y2": "y3", "y1": "y2"}.get(name))
        await ns.create_queue("x2", forward_to="x3")
        await ns.create_queue("x1", forward_to="x2")
        await ns.send("x1", Message(b"", message_id="m"))  # x1 -> x2 -> x3: two hops; x3 keeps it
        await ns.close()
        ns = await Namespace.open(stores.open(), clock)
        await ns.update_queue("x3", forward_to="y1")
        ns.tick()  # x3 -> y1 -> y2 are the third and fourth hops; y2 -> y3 would be a fifth
        assert ns.peek_messages("y3", max_message_count=10) == []
        (dead,) = ns.peek_messages("y2/$DeadLetterQueue", max_message_count=10)
        assert dead.message_id == "m" and dead.dead_letter_reason == "MaxTransferHopCountExceeded"

    run(go())


def test_a_subscription_may_forward_to_its_own_topic_and_the_hop_limit_ends_the_round(stores: StoreFactory) -> None:
    """Service Bus accepts a subscription forwarding to its own topic (the SDK's recorded
    test_mgmt_subscription_update_success: 200); a message that would go round more than four times is
    dead-lettered with MaxTransferHopCountExceeded, so nothing circles for ever."""

    async def go() -> None:
        ns = await Namespace.open(stores.open(), ManualClock(START))
        await ns.create_topic("t")
        await ns.create_subscription("t", "back", forward_to="t")
        await ns.send("t", Message(b"", message_id="round"))
        dead = await ns.receive("t/Subscriptions/back/$DeadLetterQueue", 10)
        assert [m.message_id for m in dead] == ["round"]
        assert dead[0].dead_letter_reason == "MaxTransferHopCountExceeded"
        assert await ns.receive("t/Subscriptions/back", 10) == []

    run(go())


def test_a_queue_may_forward_to_itself_and_the_hop_limit_ends_the_round(stores: StoreFactory) -> None:
    """Service Bus stores a queue forwarding to itself, its dead letters too (the SDK's recorded
    test_mgmt_queue_update_success: 200, ForwardTo read back); failed before: refused as a loop. A message goes
    round four times and is dead-lettered with MaxTransferHopCountExceeded; forwarded from the dead-letter queue
    to the queue it would be a fifth transfer, so it stays there, and the timer leaves it as it is."""

    async def go() -> None:
        ns = await Namespace.open(stores.open(), ManualClock(START))
        await ns.create_queue("self", forward_to="self")
        await ns.create_queue("round")
        await ns.update_queue("round", forward_to="round", forward_dead_lettered_messages_to="round")
        assert ns.get_queue("round").forward_to == "round"
        await ns.send("round", Message(b"", message_id="m"))
        await ns.send("self", Message(b"", message_id="s"))
        for _ in range(3):
            ns.tick()
        (dead,) = ns.peek_messages("round/$DeadLetterQueue", max_message_count=10)
        assert (dead.message_id, dead.dead_letter_reason) == ("m", "MaxTransferHopCountExceeded")
        ns.tick()
        (still,) = ns.peek_messages("round/$DeadLetterQueue", max_message_count=10)
        assert still.sequence_number == dead.sequence_number
        assert ns.peek_messages("round", max_message_count=10) == []
        (other,) = ns.peek_messages("self/$DeadLetterQueue", max_message_count=10)
        assert other.message_id == "s"
        a = await ns.create_queue("a")
        assert a.forward_to is None
        await ns.create_queue("b", forward_to="a")
        with pytest.raises(InvalidArgumentError, match=r"forwarding loop \(a -> b -> a\)"):
            await ns.update_queue("a", forward_to="b")  # a loop through another queue is still refused

    run(go())
