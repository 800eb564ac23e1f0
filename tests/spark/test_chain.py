"""The executor-side rule (numpy) against the core's index, with record-batch splits and seeds."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from oncebus.core.dedup import DedupIndex
from oncebus.spark._chain import H1, H2, KIND, ROLE, ROLE_HELD, ROLE_KEY, T, W, decider, keep_mask

S = 1_000_000


def _core_kept(rows: list[tuple[int, int, int]], window_us: int, seeds: dict[int, int]) -> list[bool]:
    """rows (key, t, order) -> kept flags, judged by the core in (t, order) order."""
    index = DedupIndex(timedelta(microseconds=window_us), recently_expired_capacity=0)
    for key, t0 in sorted(seeds.items(), key=lambda kv: kv[1]):
        index.restore(f"k{key}", t0)
    kept = [False] * len(rows)
    start = min([t for _, t, _ in rows] + list(seeds.values()), default=0)
    for i in sorted(range(len(rows)), key=lambda i: (rows[i][1], rows[i][2])):
        key, t, _ = rows[i]
        kept[i] = not index.judge(f"k{key}", max(t, start)).duplicate
    return kept


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[tuple[int, int, int]], int, dict[int, int], list[int]]:
    window = draw(st.sampled_from([20 * S, 30 * S, 600 * S]))
    n = draw(st.integers(1, 120))
    times = sorted(draw(st.lists(st.integers(0, 3 * window), min_size=n, max_size=n)))
    edges = [window - 1, window, window + 1]
    rows = []
    for i, t in enumerate(times):
        if i and draw(st.booleans()):  # a copy exactly at or around a window edge of an earlier row
            t = max(t, rows[draw(st.integers(0, i - 1))][1] + draw(st.sampled_from(edges)))
        rows.append((draw(st.integers(0, 6)), t, i))
    seeds = draw(st.dictionaries(st.integers(0, 6), st.integers(0, window), max_size=4))
    splits = draw(st.lists(st.integers(1, 40), max_size=5))
    return rows, window, seeds, splits


@settings(max_examples=300, deadline=None)
@given(cases())
def test_keep_mask_matches_core(case: tuple[list[tuple[int, int, int]], int, dict[int, int], list[int]]) -> None:
    rows, window, seeds, splits = case
    seed_start = min(seeds.values(), default=0)
    # the core needs non-decreasing time: seeds are earlier than every send here
    rows = [(k, t + seed_start + window, o) for k, t, o in rows]
    expected = _core_kept(rows, window, seeds)

    # executor input: seeds (kind 0) then sends, sorted by (key, kind, t, order)
    items = [(k, 0, t0, -1, -1) for k, t0 in seeds.items()]
    items += [(k, 1, t, o, i) for i, (k, t, o) in enumerate(rows)]
    items.sort(key=lambda r: (r[0], r[1], r[2], r[3]))
    h1 = np.array([r[0] * 7919 for r in items], dtype=np.int64)
    h2 = np.array([r[0] * 31 for r in items], dtype=np.int64)
    t = np.array([r[2] for r in items], dtype=np.int64)
    w = np.full(len(items), window, dtype=np.int64)
    seed = np.array([r[1] == 0 for r in items])
    got = [False] * len(rows)
    carry = None
    start = 0
    for size in [*splits, len(items)]:
        end = min(start + size, len(items))
        keep, carry = keep_mask(h1[start:end], h2[start:end], t[start:end], w[start:end], seed[start:end], carry)
        for j in np.flatnonzero(keep):
            got[items[start + j][4]] = True
        start = end
        if start == len(items):
            break
    assert got == expected


def test_bypassed_rows_are_kept_and_do_not_set_t0() -> None:
    h = np.array([5, 5, 5], dtype=np.int64)
    t = np.array([0, 1, 2], dtype=np.int64)
    w = np.array([-1, 20 * S, 20 * S], dtype=np.int64)
    keep, _ = keep_mask(h, h, t, w, np.zeros(3, dtype=bool))
    assert keep.tolist() == [True, True, False]


@settings(max_examples=200, deadline=None)
@given(cases(), st.integers(0, 3))
def test_decider_judges_rows_below_the_watermark_and_passes_the_rest(
    case: tuple[list[tuple[int, int, int]], int, dict[int, int], list[int]], cut: int
) -> None:
    """The streaming pass: rows at or above the watermark come out as held, untouched, and change nothing."""
    rows, window, seeds, _ = case
    rows = [(k, t + window, o) for k, t, o in rows]
    times = sorted({t for _, t, _ in rows})
    watermark = times[min(cut * len(times) // 4, len(times) - 1)]
    below = [r for r in rows if r[1] < watermark]
    expected_kept = {r[2] for r, kept in zip(below, _core_kept(below, window, seeds), strict=True) if kept}
    expected_held = {o for _, t, o in rows if t >= watermark}

    items = [(k, 0, t0, -1) for k, t0 in seeds.items()] + [(k, 1, t, o) for k, t, o in rows]
    items.sort()
    batch = pa.RecordBatch.from_pydict(
        {
            "order": [r[3] for r in items],
            H1: [r[0] * 7919 for r in items],
            H2: [r[0] * 31 for r in items],
            T: [r[2] for r in items],
            W: [window] * len(items),
            KIND: [r[1] for r in items],
        }
    )
    out = pa.Table.from_batches(list(decider(watermark)(iter([batch.slice(0, 7), batch.slice(7)]))))
    assert KIND not in out.column_names
    roles = dict(zip(out["order"].to_pylist(), out[ROLE].to_pylist(), strict=True))
    assert {o for o, r in roles.items() if r == ROLE_KEY} == expected_kept
    assert {o for o, r in roles.items() if r == ROLE_HELD} == expected_held
    assert len(roles) == out.num_rows
