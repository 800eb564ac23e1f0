"""The broker (in-memory store) against the naive reference model, on generated traces with restarts."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from oncebus.broker import ManualClock, Message, Namespace, ServiceBusReceiveMode
from oncebus.store.memory import MemoryStore
from tests.broker.conftest import run
from tests.core.test_dedup_model import ReferenceModel

S = 1_000_000
ids = st.sampled_from(["a", "b", "c", "d"])
pks = st.sampled_from([None, "1", "2"])
op = st.one_of(
    st.tuples(st.just("send"), st.lists(st.tuples(ids, pks), min_size=1, max_size=4)),
    st.tuples(st.just("advance"), st.sampled_from([0.001, 1, 5, 19.999, 20, 21, 30, 600])),
    st.tuples(st.just("window"), st.sampled_from(["PT20S", "PT30S", "PT10M"])),
    st.tuples(st.just("restart"), st.none()),
    st.tuples(st.just("drain"), st.none()),
)


@settings(max_examples=150, deadline=None)
@given(st.booleans(), st.lists(op, max_size=40))
def test_broker_matches_reference(partitioned: bool, ops: list[tuple[str, object]]) -> None:
    async def go() -> None:
        clock = ManualClock(10 * S)
        store = MemoryStore()
        ns = await Namespace.open(store, clock)
        await ns.create_queue(
            "q",
            requires_duplicate_detection=True,
            enable_partitioning=partitioned,
            duplicate_detection_history_time_window="PT20S",
        )
        model = ReferenceModel(20 * S)
        expected: Counter[tuple[str, str | None]] = Counter()
        delivered: Counter[tuple[str, str | None]] = Counter()

        async def drain() -> None:
            for m in await ns.receive("q", 1000, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE):
                delivered[(m.message_id, m.partition_key)] += 1

        for kind, arg in ops:
            if kind == "send":
                batch = [Message(b"x", message_id=i, partition_key=pk) for i, pk in arg]  # type: ignore[attr-defined]
                outcomes = await ns.send("q", batch)
                for (i, pk), outcome in zip(arg, outcomes, strict=True):  # type: ignore[call-overload]
                    key = f"{pk or i}|{i}" if partitioned else i
                    verdict = model.judge(key, clock.now_us())
                    assert outcome.duplicate == verdict.duplicate
                    assert outcome.late_resend_delay_us == verdict.late_resend_delay_us
                    if not verdict.duplicate:
                        expected[(i, pk)] += 1
            elif kind == "advance":
                clock.advance(float(arg))  # type: ignore[arg-type]
            elif kind == "window":
                props = await ns.update_queue("q", duplicate_detection_history_time_window=arg)
                model.set_window(int(props.duplicate_detection_history_time_window.total_seconds() * S), clock.now_us())
            elif kind == "restart":
                model._expire(clock.now_us())  # the broker reloads only keys still in their window
                await ns.close()
                ns = await Namespace.open(store, clock)
                model.expired.clear()  # the recently-expired table is memory only
            else:
                await drain()
        await drain()
        assert delivered == expected
        assert ns.stats("q").keys_held == len(
            [k for k, t0 in model.held.items() if t0 + model.window_us > clock.now_us()]
        )

    run(go())


def test_held_messages_of_one_size_share_its_int() -> None:
    """Each held message's size was an int object of its own (32 bytes a message in a backlog of equal sizes). Measured
    as memory, so it holds both ways: the Python Entry shares one int a size, a compiled one keeps none."""
    import tracemalloc

    from oncebus.broker.receivable import Entry
    from oncebus.core.messages import MessageState

    count = 4000

    def held_per_entry(text: str) -> float:
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            sizes = [int(text) for _ in range(count)]  # distinct int objects of one value (unless small)
            entries = [Entry(i, MessageState.ACTIVE, 0, None, size, None) for i, size in enumerate(sizes, 1)]
            del sizes  # the ints no entry holds are freed
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert len(entries) == count and entries[-1].size == int(text)
        return held / count

    held_per_entry("1024")  # the size's shared int made once, outside the measurement
    shared = held_per_entry("100")  # a cached small int: one object whatever holds it
    assert held_per_entry("1024") - shared < 16, "each entry holds an int object of its own"
