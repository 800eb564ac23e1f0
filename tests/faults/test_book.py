"""The fault book alone (``oncebus.broker.FaultBook``): scope, counts, ``after``, ``delay``, durations on the
broker's clock (a ManualClock: no sleeping), disarming, the refusal."""

from __future__ import annotations

import pytest

from oncebus.broker import FaultBook, FaultsDisabledError, FaultSpec, ManualClock
from oncebus.core.errors import InvalidArgumentError


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def book(clock: ManualClock) -> FaultBook:
    return FaultBook(clock.now_us)


def test_a_counted_fault_fires_on_the_next_operations_of_its_entity_after_letting_some_through(book: FaultBook) -> None:
    fault = book.arm({"kind": "lost-ack", "entity": "Orders", "after": 1, "count": 2})
    assert book.fire("lost-ack", "audit") is None  # another entity
    assert book.fire("server-busy", "orders") is None  # another kind
    assert book.fire("lost-ack", "orders") is None  # let through (after=1)
    assert book.fire("lost-ack", "ORDERS") is fault
    assert book.fire("lost-ack", "orders") is fault
    assert book.fire("lost-ack", "orders") is None and not book.armed  # spent: gone
    assert fault.fired == 2 and book.fired[("lost-ack", "orders")] == 2


def test_a_topic_fault_covers_its_subscriptions_and_an_unscoped_one_every_entity(book: FaultBook) -> None:
    book.arm({"kind": "lock-lost", "entity": "events"})
    book.arm({"kind": "lock-lost", "count": 5})
    assert book.fire("lock-lost", "events/subscriptions/audit") is not None
    assert book.fire("lock-lost", "eventsx") is not None  # the unscoped one, not the events one
    assert [f.remaining for f in book.list()] == [4]


def test_a_timed_fault_fires_on_everything_until_its_duration_passes_on_the_broker_clock(
    book: FaultBook, clock: ManualClock
) -> None:
    fault = book.arm(FaultSpec("server-busy", duration=10, delay=5))
    assert book.fire("server-busy", "q") is None  # not live yet
    clock.advance(5)
    assert all(book.fire("server-busy", "q") is fault for _ in range(100))
    clock.advance(9.999)
    assert book.fire("server-busy", "q") is fault
    clock.advance(0.001)
    assert book.fire("server-busy", "q") is None and book.list() == []


def test_faults_are_listed_and_disarmed_one_or_all(book: FaultBook) -> None:
    first = book.arm({"kind": "slow-ack", "seconds": 0.5})
    second = book.arm({"kind": "lost-ack", "how": "detach"})
    assert [f.to_dict()["id"] for f in book.list()] == [first.fault_id, second.fault_id]
    assert second.to_dict()["how"] == "detach" and first.to_dict()["seconds"] == 0.5
    assert book.clear(first.fault_id) == 1
    with pytest.raises(InvalidArgumentError, match=f"no fault '{first.fault_id}' is armed"):
        book.clear(first.fault_id)
    assert book.clear() == 1 and not book.armed


@pytest.mark.parametrize(
    "spec",
    [
        {"kind": "lost-ack", "count": True},
        {"kind": "lost-ack", "count": 1.5},
        {"kind": "lost-ack", "duration": float("nan")},
        {"kind": "lost-ack", "after": -1},
        {"kind": "lost-ack", "entity": ""},
        {"kind": "lost-ack", "how": "explode"},
        {"kind": "slow-delivery", "seconds": -1},
        {"kind": "drop-connection", "seconds": 1},
        "lost-ack",
    ],
)
def test_bad_specs_are_refused_and_nothing_is_armed(book: FaultBook, spec: object) -> None:
    with pytest.raises(InvalidArgumentError):
        book.arm(spec)  # type: ignore[arg-type]
    assert not book.armed


def test_a_book_that_refuses_arms_nothing(book: FaultBook) -> None:
    book.refusal = "not here"
    with pytest.raises(FaultsDisabledError, match="not here"):
        book.arm({"kind": "lost-ack"})
    assert not book.armed
