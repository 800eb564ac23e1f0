"""The executor side of the bucketed streaming state (``_buckets``): key files and the prior-t0 lookup."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from oncebus.spark import _chain
from oncebus.spark.stream.buckets import NONE, Lookup, key_file, write_keys


def test_lookup_gives_the_newest_t0_of_each_key_across_files(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    truth: dict[tuple[int, int], int] = {}
    folders = []
    for number in range(3):
        n = 5_000
        h1 = rng.integers(0, 50, n)  # few h1 values: many keys share one, and keys recur (recorded twice)
        h2 = rng.integers(0, 40, n)
        t = rng.integers(0, 10**6, n)
        order = np.lexsort((t, h2, h1))
        h1, h2, t = h1[order], h2[order], t[order]
        write_keys(tmp_path / key_file(f"b={number}", 0), h1, h2, t, np.full(n, 5))
        folders.append(f"b={number}")
        for a, b, c in zip(h1.tolist(), h2.tolist(), t.tolist(), strict=True):
            truth[(a, b)] = max(truth.get((a, b), NONE), c)
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
