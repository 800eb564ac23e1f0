"""The messages a receivable holds: plain waiting ones as columns, every other one as an ``Entry`` object.

Checked against a naive model (a dict of every message and a scan for the next one to deliver) with
hypothesis, through the receivable's own operations (add, take, give back, ask by number, remove, peek,
restore in steps); and what a waiting backlog costs a message in memory.
"""

from __future__ import annotations

import gc
import tracemalloc
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from oncebus.broker.entries import HeldMessages
from oncebus.broker.receivable import Entry, Receivable, ReceivableSettings
from oncebus.core.messages import MessageState, StoredMessage

ACTIVE = MessageState.ACTIVE


def _settings() -> ReceivableSettings:
    return ReceivableSettings(5_000_000, 10, False, False, 1 << 30)


@dataclass
class Model:
    """Every message by sequence number: (enqueued, size, session id, available)."""

    held: dict[int, tuple[int, int, str | None]] = field(default_factory=dict)
    available: set[int] = field(default_factory=set)

    def next(self) -> int | None:
        waiting = [(self.held[s][0], s) for s in self.available]
        return min(waiting)[1] if waiting else None


operation = st.one_of(
    st.tuples(st.just("send"), st.integers(1, 4), st.integers(-3, 5), st.booleans(), st.booleans()),
    st.tuples(st.just("take"), st.integers(1, 3), st.booleans()),
    st.tuples(st.just("ask"), st.integers(0, 60)),
    st.tuples(st.just("remove"), st.integers(0, 60)),
    st.tuples(st.just("peek"), st.integers(0, 60), st.integers(0, 5)),
)


@settings(max_examples=300, deadline=None)
@given(
    restored=st.lists(st.tuples(st.integers(-2, 5), st.booleans()), max_size=12),
    during=st.lists(st.integers(1, 3), max_size=3),
    ops=st.lists(operation, max_size=40),
)
def test_a_receivable_holds_and_delivers_as_the_naive_model_does(
    restored: list[tuple[int, bool]], during: list[int], ops: list[tuple[object, ...]]
) -> None:
    receivable = Receivable("q", _settings())
    model = Model()
    clock = 100
    seq = 0

    def send(count: int, step: int, session: bool, expires: bool) -> list[StoredMessage]:
        nonlocal clock, seq
        records = []
        for _ in range(count):
            seq += 1
            clock = max(0, clock + step)
            record = StoredMessage(
                "q",
                seq,
                f"m{seq}",
                b"x" * (seq % 3),
                clock,
                10**15 if expires else None,
                session_id="s" if session else None,
            )
            records.append(record)
            model.held[seq] = (clock, seq % 3, record.session_id)
            model.available.add(seq)
        return records

    # a stored backlog restored in steps while new messages arrive, then joined before them
    receivable.begin_restore()
    rows = []
    for step, odd in restored:
        seq += 1
        clock = max(0, clock + step)
        rows.append(("q", seq, int(ACTIVE), 0, clock, None, seq % 3, "s" if odd and seq % 2 else None))
        model.held[seq] = (clock, seq % 3, rows[-1][7])
        model.available.add(seq)
    seq += 1000  # sends come after every stored sequence number
    half = len(rows) // 2
    receivable.restore(rows[:half], 0)
    for count in during:
        receivable.add_records(send(count, 1, False, False), 0)
    receivable.restore(rows[half:], 0)
    receivable.end_restore()

    for op in ops:
        kind = op[0]
        if kind == "send":
            _, count, step, session, expires = op
            receivable.add_records(send(int(count), int(step), bool(session), bool(expires)), 0)  # type: ignore[call-overload]
        elif kind == "take":
            _, count, settle = op
            for _ in range(int(count)):  # type: ignore[call-overload]
                expected = model.next()
                entry = receivable.take()
                assert (entry.sequence_number if entry is not None else None) == expected
                if entry is None:
                    break
                assert (entry.enqueued_time_us, entry.size, entry.session_id) == model.held[expected]
                model.available.discard(expected)
                if settle:
                    receivable.remove(entry)
                    del model.held[expected]
                else:
                    receivable.give_back(entry)
                    model.available.add(expected)
        elif kind == "ask":
            wanted = int(op[1])  # type: ignore[call-overload]
            entry = receivable.messages.get(wanted)
            assert (entry is not None) == (wanted in model.held) == (wanted in receivable.messages)
            if entry is not None:
                assert entry.sequence_number == wanted and entry.available == (wanted in model.available)
                assert (entry.enqueued_time_us, entry.size, entry.session_id) == model.held[wanted]
                assert receivable.messages.get(wanted) is entry  # asked again: the same object
        elif kind == "remove":
            wanted = int(op[1])  # type: ignore[call-overload]
            if wanted in model.held and wanted in model.available:
                receivable.remove(receivable.messages[wanted])
                del model.held[wanted]
                model.available.discard(wanted)
        else:
            _, start, count = op
            got = [e.sequence_number for e in receivable.messages.first_from(int(start), int(count), None)]  # type: ignore[call-overload]
            assert got == sorted(s for s in model.held if s >= int(start))[: int(count)]  # type: ignore[call-overload]
        assert len(receivable.messages) == len(model.held)
        assert sorted(receivable.messages.keys()) == sorted(model.held)
        assert receivable.size_bytes == sum(size for _, size, _ in model.held.values())
        assert receivable.counts()["active"] == len(model.held)
    order = []
    while (entry := receivable.take()) is not None:
        order.append(entry.sequence_number)
    assert order == sorted(model.available, key=lambda s: (model.held[s][0], s))


def test_an_entry_asked_for_while_waiting_keeps_its_place() -> None:
    """Asking for a plain waiting message by number (a peek's pick, a receive of deferred messages by number)
    makes it an object without moving it: it is delivered in its turn, once."""
    receivable = Receivable("q", _settings())
    receivable.add_records([StoredMessage("q", s, f"m{s}", b"x", 10 + s, None) for s in range(1, 6)], 0)
    asked = receivable.messages[3]
    assert asked.available and receivable.messages[3] is asked
    order = []
    while (entry := receivable.take()) is not None:
        order.append(entry)
    assert [e.sequence_number for e in order] == [1, 2, 3, 4, 5]
    assert order[2] is asked and not asked.available
    assert len(receivable.messages) == 5  # taken, not settled: still held, as objects now
    assert all(receivable.messages.holds(e) for e in order)


def test_a_waiting_backlog_costs_a_few_dozen_bytes_a_message() -> None:
    """A restored backlog of plain messages is held as columns: under 48 bytes a message (an ``Entry`` per
    message, with its dict slot and int objects, cost about 200)."""
    count = 50_000
    receivable = Receivable("q", _settings())
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        receivable.restore(
            (
                ("q", s, int(ACTIVE), 0, 1_700_000_000_000_000 + s, None, 1024 + s % 7, None)
                for s in range(1, count + 1)
            ),
            0,
        )
        gc.collect()
        per_message = (tracemalloc.get_traced_memory()[0] - before) / count
    finally:
        tracemalloc.stop()
    assert len(receivable.messages) == count and receivable.counts()["active"] == count
    assert per_message < 48, f"{per_message:.0f} bytes a waiting message"
    assert receivable.take() is not None


def test_the_columns_let_go_of_what_was_taken() -> None:
    """Taking messages from the head shifts the columns now and then: a queue that is drained and filled
    again does not keep the slots of what it delivered."""
    held = HeldMessages(ACTIVE)
    seq = 0
    for _ in range(5):
        for _ in range(10_000):
            seq += 1
            assert held.append(seq, seq, 1, 0)
        while held.take_head() is not None:
            pass
        for s in list(held.entries):
            held.pop(s)
    assert len(held) == 0 and len(held.run.seqs) == 0
    for s in range(seq + 1, seq + 10_001):
        held.append(s, s, 1, 0)
    for _ in range(9_000):
        entry = held.take_head()
        assert entry is not None
        held.pop(entry.sequence_number)
    assert len(held) == 1_000 and len(held.run.seqs) <= 1_000 + 4_096  # not the 10,000 slots it was given


def test_an_entry_class_is_still_what_other_holders_use() -> None:
    """Messages that are not plain (a session id, an expiry, scheduled) are held as objects."""
    receivable = Receivable("q", _settings())
    receivable.add(Entry(1, MessageState.SCHEDULED, 50, None, 1, None), 0)
    receivable.add_records([StoredMessage("q", 2, "m2", b"x", 10, 20)], 0)
    receivable.add_records([StoredMessage("q", 3, "m3", b"x", 11, None, session_id="k")], 0)
    assert set(dict(receivable.messages.objects())) == {1, 2, 3} and len(receivable.messages.run.seqs) == 0
