"""The executor side of the bucketed streaming state (``_buckets``): key files and the prior-t0 lookup."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from oncebus.spark import _chain
from oncebus.spark.stream.buckets import (
    NONE,
    Lookup,
    build_filter,
    filter_file,
    key_file,
    might_hold,
    read_filter,
    sort_order,
    write_keys,
)

INT64 = st.integers(-(2**63), 2**63 - 1)


def _key_folder(
    root: Path, number: int, h1: np.ndarray, h2: np.ndarray, t: np.ndarray, truth: dict[tuple[int, int], int]
) -> str:
    """Write folder ``b=<number>``'s key file of bucket 0 (sorted by (h1, h2, t)) and record each key's newest t0
    in ``truth``; returns the folder's name."""
    order = np.lexsort((t, h2, h1))
    h1, h2, t = h1[order], h2[order], t[order]
    write_keys(root / key_file(f"b={number}", 0), h1, h2, t, np.full(len(h1), 5))
    for a, b, c in zip(h1.tolist(), h2.tolist(), t.tolist(), strict=True):
        truth[(a, b)] = max(truth.get((a, b), NONE), c)
    return f"b={number}"


def test_lookup_gives_the_newest_t0_of_each_key_across_files(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    truth: dict[tuple[int, int], int] = {}
    folders = []
    for number in range(3):
        n = 5_000
        h1 = rng.integers(0, 50, n)  # few h1 values: many keys share one, and keys recur (recorded twice)
        h2 = rng.integers(0, 40, n)
        t = rng.integers(0, 10**6, n)
        folders.append(_key_folder(tmp_path, number, h1, h2, t, truth))
    q1 = np.sort(rng.integers(-5, 60, 20_000))
    q2 = rng.integers(0, 45, 20_000)
    got = Lookup(tmp_path, [*folders, "b=9"], 0).prior(q1, q2)  # b=9 has no file: no keys there
    expected = np.array([truth.get((a, b), NONE) for a, b in zip(q1.tolist(), q2.tolist(), strict=True)])
    assert (got == expected).all()
    assert 0 < (got != NONE).sum() < len(got)


def test_prior_times_act_as_seed_rows() -> None:
    rng = np.random.default_rng(2)
    n = 2_000
    h1 = np.sort(rng.integers(0, 300, n))
    h2 = np.zeros(n, dtype=np.int64)
    t = rng.integers(0, 1_000, n)
    order = np.lexsort((t, h1))
    h1, t = h1[order], t[order]
    w = np.full(n, 100, dtype=np.int64)
    seeded_keys = np.unique(h1)[::3]
    seed_t0 = {int(k): int(k) * 3 for k in seeded_keys}
    prior = np.array([seed_t0.get(int(k), NONE) for k in h1], dtype=np.int64)
    got, _ = _chain.keep_mask(h1, h2, t, w, np.zeros(n, dtype=bool), prior=prior)
    # the same with seed rows put in front of each seeded key's sends
    s1 = np.concatenate([seeded_keys, h1])
    st = np.concatenate([[seed_t0[int(k)] for k in seeded_keys], t])
    kind = np.concatenate([np.zeros(len(seeded_keys)), np.ones(n)])
    order = np.lexsort((st, kind, s1))
    seed = (kind == 0)[order]
    expected, _ = _chain.keep_mask(s1[order], np.zeros(len(s1), dtype=np.int64), st[order], np.full(len(s1), 100), seed)
    assert (got == expected[~seed]).all()
    assert 0 < got.sum() < n


def _digests(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64, endpoint=True)


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(INT64, max_size=300), others=st.lists(INT64, max_size=50))
def test_a_key_files_filter_never_misses_one_of_its_keys(keys: list[int], others: list[int]) -> None:
    h1 = np.array(sorted(keys), dtype=np.int64)
    raw = build_filter(h1)
    bits = np.frombuffer(raw[16:], dtype=np.uint8)
    assert len(bits) * 8 >= 16 * len(h1) and len(bits) & (len(bits) - 1) == 0
    assert might_hold(bits, h1).all()
    probe = np.array(others + keys, dtype=np.int64)
    assert might_hold(bits, probe)[len(others) :].all()


def test_a_filter_lets_few_absent_keys_through() -> None:
    rng = np.random.default_rng(3)
    h1 = np.sort(_digests(rng, 200_000))
    bits = np.frombuffer(build_filter(h1)[16:], dtype=np.uint8)
    assert might_hold(bits, _digests(rng, 200_000)).mean() < 0.07


def test_lookup_with_filters_answers_as_without_and_as_a_state_written_before_them(tmp_path: Path) -> None:
    """Filters only skip binary searches: the answers are those of a full search; a key file with no filter (a
    state written by an earlier release) or with one that belongs to another key file is searched in full."""
    rng = np.random.default_rng(4)
    folders = []
    truth: dict[tuple[int, int], int] = {}
    for number in range(4):
        n = 20_000
        h1 = _digests(rng, n)
        h1[: n // 10] = h1[n // 10 : n // 5]  # keys that share a digest's h1 (and keys recorded twice)
        h2 = rng.integers(0, 3, n)
        t = rng.integers(0, 10**9, n)
        folders.append(_key_folder(tmp_path, number, h1, h2, t, truth))
    known = np.array(list(truth), dtype=np.int64)
    picked = known[rng.integers(0, len(known), 5_000)]
    q1 = np.concatenate([picked[:, 0], _digests(rng, 5_000)])
    q2 = np.concatenate([picked[:, 1], rng.integers(0, 3, 5_000)])
    order = np.argsort(q1, kind="stable")
    q1, q2 = q1[order], q2[order]
    expected = np.array([truth.get((a, b), NONE) for a, b in zip(q1.tolist(), q2.tolist(), strict=True)])
    filtered = Lookup(tmp_path, folders, 0)
    assert all(bits is not None for *_, bits in filtered.files)
    assert (filtered.prior(q1, q2) == expected).all()
    assert (Lookup(tmp_path, folders, 0, filters=False).prior(q1, q2) == expected).all()
    filter_file(tmp_path / key_file("b=0", 0)).unlink()  # as a state written before filters
    other = filter_file(tmp_path / key_file("b=2", 0))
    other.write_bytes(build_filter(_digests(rng, 10)))  # a filter of another key file: refused
    assert read_filter(tmp_path / key_file("b=2", 0), 20_000) is None
    for broken in (b"", build_filter(_digests(rng, 10))[:12]):  # empty, cut short: refused as well
        filter_file(tmp_path / key_file("b=3", 0)).write_bytes(broken)
        assert read_filter(tmp_path / key_file("b=3", 0), 20_000) is None
    assert (Lookup(tmp_path, folders, 0).prior(q1, q2) == expected).all()


ROW = st.tuples(
    st.integers(-3, 3),  # h1: few values, so rows share them
    st.integers(0, 2),
    st.integers(0, 3),
    st.one_of(st.none(), st.integers(-2, 2)),
    st.one_of(st.none(), st.sampled_from(["a", "b", ""])),
)


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(ROW, max_size=40), spread=st.booleans())
def test_the_tasks_sort_order_is_arrows(rows: list[tuple[int, int, int, int | None, str | None]], spread: bool) -> None:
    """``sort_order`` (numpy on the digests, Arrow for the ties) gives what ``pc.sort_indices`` gives, stable,
    nulls of the order columns first."""
    scale = 2**60 if spread else 1
    table = pa.table(
        {
            "h1": pa.array([r[0] * scale for r in rows], pa.int64()),
            "h2": pa.array([r[1] for r in rows], pa.int64()),
            "t": pa.array([r[2] for r in rows], pa.int64()),
            "seq": pa.array([r[3] for r in rows], pa.int64()),
            "name": pa.array([r[4] for r in rows], pa.string()),
        }
    )
    keys = ("h1", "h2", "t", "seq", "name")
    expected = pc.sort_indices(table, sort_keys=[(k, "ascending", "at_start") for k in keys]).to_numpy()
    assert sort_order(table, keys).tolist() == expected.tolist()
