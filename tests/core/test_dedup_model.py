"""The dedup index against a naive reference model (hypothesis)."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from oncebus.core.dedup import DedupIndex, Verdict, judge_key_sends

S = 1_000_000  # microseconds per second


class ReferenceModel:
    """The rule of semantics.md written as plainly as possible."""

    def __init__(self, window_us: int) -> None:
        self.window_us = window_us
        self.held: dict[str, int] = {}
        self.expired: dict[str, int] = {}

    def _expire(self, now: int) -> None:
        for key, t0 in list(self.held.items()):
            if t0 + self.window_us <= now:
                del self.held[key]
                self.expired[key] = t0
        for key, t0 in list(self.expired.items()):
            if t0 + 2 * self.window_us <= now:
                del self.expired[key]

    def set_window(self, window_us: int, now: int) -> None:
        self._expire(now)  # keys that already left the window stay gone
        self.window_us = window_us

    def judge(self, key: str, now: int) -> Verdict:
        self._expire(now)
        if key in self.held:
            return Verdict(True, self.held[key])
        late = None
        if key in self.expired:
            late = now - self.expired.pop(key)
        self.held[key] = now
        return Verdict(False, None, late)


keys = st.sampled_from([f"k{i}" for i in range(12)])
windows = st.sampled_from([20 * S, 30 * S, 600 * S, 7 * 86_400 * S])


@st.composite
def traces(draw: st.DrawFn) -> tuple[int, list[tuple[str, int, int | None]]]:
    window = draw(windows)
    ops: list[tuple[str, int, int | None]] = []
    now = draw(st.integers(0, 10 * S))
    for _ in range(draw(st.integers(1, 80))):
        step = draw(
            st.one_of(
                st.just(0),
                st.just(1),
                st.integers(0, 3 * S),
                st.sampled_from([window - 1, window, window + 1, 20 * S]),
                st.integers(0, 3 * window),
            )
        )
        now += step
        if draw(st.integers(0, 15)) == 0:
            ops.append(("window", now, draw(windows)))
        else:
            ops.append((draw(keys), now, None))
    return window, ops


@settings(max_examples=400, deadline=None)
@given(traces())
def test_index_matches_reference_model(trace: tuple[int, list[tuple[str, int, int | None]]]) -> None:
    window, ops = trace
    index = DedupIndex(timedelta(microseconds=window))
    model = ReferenceModel(window)
    for key, now, new_window in ops:
        if new_window is not None:
            index.set_window(timedelta(microseconds=new_window), now)
            model.set_window(new_window, now)
            continue
        assert index.judge(key, now) == model.judge(key, now), (key, now)
        assert len(index) == len(model.held)


@settings(max_examples=200, deadline=None)
@given(traces(), st.data())
def test_restore_from_history_continues_identically(
    trace: tuple[int, list[tuple[str, int, int | None]]], data: st.DataObject
) -> None:
    """Rebuilding from the held keys (as the store does at start) gives the same verdicts after."""
    window, ops = trace
    sends = [op for op in ops if op[2] is None]
    cut = data.draw(st.integers(0, len(sends)))
    before, after = sends[:cut], sends[cut:]
    original = DedupIndex(timedelta(microseconds=window))
    history: dict[str, int] = {}
    for key, now, _ in before:
        if not original.judge(key, now).duplicate:
            history[key] = now
    restored = DedupIndex(timedelta(microseconds=window))
    last = before[-1][1] if before else 0
    for key, t0 in sorted(history.items(), key=lambda kv: kv[1]):
        if t0 + window > last:
            restored.restore(key, t0)
    for key, now, _ in after:
        assert original.judge(key, now).duplicate == restored.judge(key, now).duplicate


def test_many_keys_expire_in_time_order_and_memory_is_returned() -> None:
    index = DedupIndex(timedelta(seconds=20), recently_expired_capacity=0)
    n = 300_000
    for i in range(n):
        assert not index.judge(f"m{i}", i * 10).duplicate
    assert len(index) == n
    assert index.judge("m0", n * 10).duplicate
    peak = index.nbytes()
    assert peak / n <= 48
    # everything leaves the window; the table and the log shrink back
    assert not index.judge("m0", n * 10 + 20 * S).duplicate
    assert len(index) == 1
    assert index.nbytes() < peak / 20
    for i in range(1, n, 997):
        assert not index.judge(f"m{i}", n * 10 + 20 * S + i).duplicate


def test_time_going_backwards_is_refused() -> None:
    index = DedupIndex(timedelta(seconds=20))
    index.judge("a", 10 * S)
    try:
        index.judge("b", 9 * S)
    except ValueError as exc:
        assert "backwards" in str(exc)
    else:
        raise AssertionError("expected ValueError")


def test_recently_expired_is_bounded() -> None:
    index = DedupIndex(timedelta(seconds=20), recently_expired_capacity=10)
    for i in range(100):
        index.judge(f"k{i}", i)
    index.judge("x", 20 * S + 100)
    assert index.recently_expired == 10
    assert index.judge("k99", 20 * S + 101).late_resend_delay_us == 20 * S + 2
    assert index.judge("k0", 20 * S + 102).late_resend_delay_us is None


@settings(max_examples=200, deadline=None)
@given(windows, st.lists(st.integers(0, 3 * 600 * S), max_size=30), st.one_of(st.none(), st.integers(0, 10 * S)))
def test_per_key_chain_equals_the_index(window: int, offsets: list[int], prior: int | None) -> None:
    """``judge_key_sends`` (for callers grouping sends by key) gives the index's verdicts."""
    times = sorted(offsets)
    index = DedupIndex(timedelta(microseconds=window), recently_expired_capacity=0)
    start = 0
    if prior is not None:
        index.judge("k", prior)
        start = prior
    expected = [not index.judge("k", start + t).duplicate for t in times]
    kept, _ = judge_key_sends(prior, [start + t for t in times], window)
    assert kept == expected


@settings(max_examples=300, deadline=None)
@given(traces(), st.integers(1, 12))
def test_judging_a_batch_answers_as_judging_each_key(
    trace: tuple[int, list[tuple[str, int, int | None]]], batch_size: int
) -> None:
    """``judge_many`` (one send's keys at one time, the broker's path) gives the reference model's verdicts,
    a second copy of a key inside one batch included (semantics.md rule 7)."""
    window, ops = trace
    index = DedupIndex(timedelta(microseconds=window))
    model = ReferenceModel(window)
    sends = [(key, now) for key, now, new_window in ops if new_window is None]
    i = 0
    while i < len(sends):
        now = sends[i][1]
        batch = [key for key, t in sends[i : i + batch_size] if t == now]
        keys: list[str | None] = [*batch, None]  # a message with no key gets no verdict
        assert index.judge_many(keys, now) == [*(model.judge(key, now) for key in batch), None]
        i += len(batch)
