"""Broker counters: message counts kept incrementally equal a scan; the window suggestion; history; minute log."""

from __future__ import annotations

import logging
from collections import Counter
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncebus.broker import ManualClock, Message, MessageState, Namespace
from oncebus.broker.counters import (
    RESEND_DELAY_BUCKETS_SECONDS,
    ActivityHistory,
    Histogram,
    suggest_window,
)
from oncebus.broker.receivable import Receivable
from oncebus.core.timeutil import us_to_datetime
from oncebus.store.memory import MemoryStore
from tests.broker.conftest import run

S = 1_000_000


def _scan(receivable: Receivable) -> dict[str, int]:
    states = Counter(m.state for m in receivable.messages.values())
    return {
        "active": states[MessageState.ACTIVE],
        "scheduled": states[MessageState.SCHEDULED],
        "deferred": states[MessageState.DEFERRED],
        "dead_lettered": len(receivable.dead_letter_queue.messages) if receivable.dead_letter_queue else 0,
    }


settle = st.lists(st.sampled_from(["complete", "abandon", "defer", "dead_letter", "keep"]), min_size=1, max_size=3)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.integers(0, 3)),
        st.tuples(st.just("schedule"), st.integers(1, 30)),
        st.tuples(st.just("ttl"), st.integers(1, 30)),
        st.tuples(st.just("receive"), settle),
        st.tuples(st.just("receive_deferred"), settle),
        st.tuples(st.just("advance"), st.sampled_from([1, 10, 31, 61])),
        st.tuples(st.just("restart"), st.just(0)),
    ),
    max_size=40,
)
PATHS = ("q", "t/subscriptions/s")


@settings(max_examples=150, deadline=None)
@given(ops)
def test_counts_kept_as_messages_change_equal_a_scan(steps: list[tuple[str, object]]) -> None:
    async def go() -> None:
        clock = ManualClock()
        store = MemoryStore()
        ns = await Namespace.open(store, clock)
        await ns.create_queue(
            "q", lock_duration="PT30S", max_delivery_count=2, dead_lettering_on_message_expiration=True
        )
        await ns.create_topic("t")
        await ns.create_subscription("t", "s", lock_duration="PT30S")
        deferred: list[tuple[str, int]] = []

        async def settle(path: str, messages: list, actions: list[str]) -> None:  # type: ignore[type-arg]
            for message, action in zip(messages, actions, strict=False):
                if action == "defer":
                    deferred.append((path, message.sequence_number))
                if action != "keep":
                    await getattr(ns, action)(path, message.lock_token)

        for n, (kind, arg) in enumerate(steps):
            if kind == "send":
                await ns.send(["q", "t"][arg % 2], Message(b"x", message_id=str(n)))  # type: ignore[operator]
            elif kind == "schedule":
                when = us_to_datetime(clock.now_us() + arg * S)  # type: ignore[operator]
                await ns.schedule_messages("q", Message(b"x", message_id=str(n)), when)
            elif kind == "ttl":
                await ns.send("q", Message(b"x", message_id=str(n), time_to_live=timedelta(seconds=arg)))  # type: ignore[arg-type]
            elif kind == "receive":
                for path in PATHS:
                    await settle(path, await ns.receive(path, len(arg)), arg)  # type: ignore[arg-type]
            elif kind == "receive_deferred" and deferred:
                path, seq = deferred.pop(0)
                message = ns.receivable(path).messages.get(seq)
                if message is not None and message.state == MessageState.DEFERRED and message.lock_token is None:
                    await settle(path, await ns.receive_deferred_messages(path, [seq]), arg)  # type: ignore[arg-type]
            elif kind == "advance":
                clock.advance(arg)  # type: ignore[arg-type]
                ns.tick()
            elif kind == "restart":
                await ns.close()
                ns = await Namespace.open(store, clock)
            for path in PATHS:
                receivable = ns.receivable(path)
                assert receivable.counts() == _scan(receivable)
                assert receivable.dead_letter_queue is not None
                assert receivable.dead_letter_queue.counts() == _scan(receivable.dead_letter_queue)

    run(go())


def test_histogram_buckets_follow_prometheus_le() -> None:
    histogram = Histogram([1.0, 10.0])
    for value in (0.5, 1.0, 1.5, 10.0, 11.0):
        histogram.observe(value)
    assert histogram.cumulative() == [(1.0, 2), (10.0, 4), (float("inf"), 5)]
    assert histogram.count == 5 and histogram.sum == 24.0
    with pytest.raises(ValueError, match="increase strictly"):
        Histogram([10.0, 1.0])


def test_window_suggestion_is_the_smallest_edge_covering_99_percent() -> None:
    histogram = Histogram(RESEND_DELAY_BUCKETS_SECONDS)
    assert suggest_window(histogram)["window_seconds"] is None
    for _ in range(99):
        histogram.observe(100.0)  # bucket (90, 120]
    histogram.observe(5000.0)  # one straggler: (3600, 7200]
    assert suggest_window(histogram) == {
        "window_seconds": 120.0,
        "share": 0.99,
        "resends": 100,
        "covered": 99,
        "beyond_range": False,
    }
    assert suggest_window(histogram, 1.0)["window_seconds"] == 7200.0
    quick = Histogram(RESEND_DELAY_BUCKETS_SECONDS)
    quick.observe(2.0)
    assert suggest_window(quick)["window_seconds"] == 20.0  # never below Service Bus's minimum
    slow = Histogram(RESEND_DELAY_BUCKETS_SECONDS)
    slow.observe(10 * 86400.0)
    assert suggest_window(slow) | {"covered": None} == {
        "window_seconds": 7 * 86400.0,
        "share": 0.99,
        "resends": 1,
        "covered": None,
        "beyond_range": True,
    }
    assert suggest_window(slow)["covered"] == 0


def test_history_keeps_a_sample_only_when_totals_change() -> None:
    history = ActivityHistory(kept_us=10 * S)
    for second, totals in enumerate([(0, 0, 0), (0, 0, 0), (2, 1, 0), (2, 1, 0), (3, 1, 1)]):
        history.sample(second * S, [("q", *totals)])
    assert history.points("q") == [(0, 0, 0, 0), (2 * S, 2, 1, 0), (4 * S, 3, 1, 1)]
    assert history.points("q", since_us=2 * S) == [(4 * S, 3, 1, 1)]
    history.sample(20 * S, [("q", 3, 1, 1)])  # older than 10 s: dropped, but the level before the window stays
    assert history.points("q") == [(4 * S, 3, 1, 1)]
    history.sample(21 * S, [])
    assert history.points("q") == []


def test_one_info_line_per_minute_per_entity_with_duplicates(caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> None:
        clock = ManualClock()
        ns = await Namespace.open(MemoryStore(), clock)
        await ns.create_queue("orders", requires_duplicate_detection=True)
        await ns.create_queue("quiet", requires_duplicate_detection=True)
        ns.tick()  # the first tick sets the baseline
        await ns.send("orders", [Message(b"x", message_id="1"), Message(b"x", message_id="1")])
        await ns.send("orders", Message(b"x", message_id="1"))
        await ns.send("quiet", Message(b"x", message_id="1"))
        clock.advance(59)
        ns.tick()
        assert not caplog.records  # not a minute yet
        clock.advance(1)
        ns.tick()
        clock.advance(60)
        ns.tick()  # nothing new: no line

    with caplog.at_level(logging.INFO, logger="oncebus.duplicates"):
        run(go())
    assert len(caplog.records) == 1
    record = caplog.records[0]
    assert record.levelno == logging.INFO
    assert record.getMessage() == (
        "orders: 1 accepted, 2 duplicates dropped, 0 late resends in the last minute (window PT10M)"
    )
    assert (record.entity, record.accepted, record.duplicates_dropped, record.late_resends) == (  # type: ignore[attr-defined]
        "orders",
        1,
        2,
        0,
    )
