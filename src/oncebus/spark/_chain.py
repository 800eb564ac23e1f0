"""The rule of ``semantics.md`` over rows sorted by key, run on executors.

Input rows arrive sorted by (h1, h2, kind, t, tie-break): ``kind`` 0 is a
*seed* row carrying a key's first-accepted time ``t0`` from earlier batches
(streaming), ``kind`` 1 a send. A send with a negative window bypasses the
rule (no message_id, or duplicate detection disabled): it is kept and records
nothing. Per key, the rule is the core's:

* a send at ``t`` with ``t < t0 + W`` is a duplicate (``t0`` unchanged);
* any other send is kept and sets ``t0 = t``.

The rule is the core's, not a copy: the numpy fast path below calls
``oncebus.core.dedup.is_duplicate`` on whole arrays (it is written with ``<``
and ``+`` only, so it works element-wise), and keys that need the chain walked
call the core's ``judge_key_sends``. ``tests/spark/test_chain.py`` holds the
result to the core's ``DedupIndex``, and ``tests/spark/reference.py`` (the one
reference, used by the tests and ``bench/spark_dedup.py``) feeds rows to the
core's ``DuplicateDetector``.

Most keys are decided with vectorised numpy: sends covered by the seed are
dropped, the first remaining send is kept, later ones within ``W`` of it are
dropped. Only keys whose remaining sends span at least ``W`` (a resend after
the window followed by more copies) walk the chain row by row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pyarrow as pa

from oncebus.core.dedup import is_duplicate, judge_key_sends

H1 = "__oncebus_h1"
H2 = "__oncebus_h2"
T = "__oncebus_t"
W = "__oncebus_w"
KIND = "__oncebus_kind"
KIND_SEED = 0
KIND_SEND = 1
ROLE = "__oncebus_role"
ROLE_KEY = 1  # kept; records its key (a new t0)
ROLE_BYPASS = 2  # kept; records nothing (no message_id, or duplicate detection off)
ROLE_HELD = 3  # not decided: at or above the watermark, passed through untouched


@dataclass
class _Carry:
    """The last key of a record batch, continued in the next one."""

    h1: int
    h2: int
    t0: int | None


def _is_duplicate(t: np.ndarray, first_accepted: np.ndarray, window: np.ndarray) -> np.ndarray:
    """The core's ``is_duplicate`` over arrays (one rule: its ``t < t0 + W``, element-wise)."""
    return cast("np.ndarray", is_duplicate(cast(Any, t), cast(Any, first_accepted), cast(Any, window)))


def keep_mask(
    h1: np.ndarray,
    h2: np.ndarray,
    t: np.ndarray,
    w: np.ndarray,
    seed: np.ndarray,
    carry: _Carry | None = None,
    held: np.ndarray | None = None,
    prior: np.ndarray | None = None,
) -> tuple[np.ndarray, _Carry | None]:
    """Which rows are kept sends, and the state of the last key for the next batch.

    ``held`` rows (not decided yet) take no part: never kept, never a duplicate, no effect on others.
    ``prior`` gives each row its key's first-accepted time from earlier batches (int64 minimum: none),
    as seed rows do."""
    n = len(t)
    keep = np.zeros(n, dtype=bool)
    if n == 0:
        return keep, carry
    new = np.empty(n, dtype=bool)
    new[0] = True
    np.not_equal(h1[1:], h1[:-1], out=new[1:])
    new[1:] |= h2[1:] != h2[:-1]
    gid = np.cumsum(new) - 1
    groups = int(gid[-1]) + 1

    base = np.zeros(groups, dtype=np.int64)
    has = np.zeros(groups, dtype=bool)
    if carry is not None and carry.t0 is not None and carry.h1 == h1[0] and carry.h2 == h2[0]:
        base[0], has[0] = carry.t0, True
    if seed.any():
        seed_gid = gid[seed]
        seed_t0 = np.full(groups, np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(seed_t0, seed_gid, t[seed])
        seeded = np.zeros(groups, dtype=bool)
        seeded[seed_gid] = True
        base = np.where(seeded & has, np.maximum(base, seed_t0), np.where(seeded, seed_t0, base))
        has |= seeded
    if prior is not None:
        prior_t0 = prior[new]  # the same for every row of a key: its first row's
        seeded = prior_t0 != np.iinfo(np.int64).min
        base = np.where(seeded & has, np.maximum(base, prior_t0), np.where(seeded, prior_t0, base))
        has |= seeded

    bypass = w < 0
    waiting = seed if held is None else seed | held
    keep[bypass & ~waiting] = True
    send = ~waiting & ~bypass
    covered = send & has[gid] & _is_duplicate(t, base[gid], w)
    candidate = np.flatnonzero(send & ~covered)
    if len(candidate):
        cand_gid = gid[candidate]
        first = np.empty(len(candidate), dtype=bool)
        first[0] = True
        np.not_equal(cand_gid[1:], cand_gid[:-1], out=first[1:])
        keep[candidate[first]] = True
        first_t = np.zeros(groups, dtype=np.int64)
        first_t[cand_gid[first]] = t[candidate[first]]
        later = candidate[~first]
        beyond = later[~_is_duplicate(t[later], first_t[gid[later]], w[later])]
        if len(beyond):
            _walk_chains(np.unique(gid[beyond]), gid, candidate, t, w, keep)

    last = groups - 1
    kept_last = np.flatnonzero(keep & send & (gid == last))
    if len(kept_last):
        t0_last: int | None = int(t[kept_last[-1]])
    else:
        t0_last = int(base[last]) if has[last] else None
    return keep, _Carry(int(h1[-1]), int(h2[-1]), t0_last)


def _walk_chains(
    hard: np.ndarray, gid: np.ndarray, candidate: np.ndarray, t: np.ndarray, w: np.ndarray, keep: np.ndarray
) -> None:
    """The chain rule row by row for keys with sends spanning more than one window."""
    rows = candidate[np.isin(gid[candidate], hard)]
    groups = gid[rows]
    starts = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]])
    for start, end in zip(starts.tolist(), [*starts[1:].tolist(), len(rows)], strict=True):
        chain = rows[start:end]
        kept, _ = judge_key_sends(None, t[chain].tolist(), int(w[chain[0]]))  # the core's rule, row by row
        keep[chain[np.array(kept)]] = True


def _arrays(batch: pa.RecordBatch) -> tuple[np.ndarray, ...]:
    names = batch.schema.names
    return tuple(batch.column(names.index(c)).to_numpy(zero_copy_only=False) for c in (H1, H2, T, W, KIND))


def apply_rule(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow function: keep the sends the rule keeps (seed rows are never output)."""
    carry: _Carry | None = None
    for batch in batches:
        if batch.num_rows == 0:
            continue
        h1, h2, t, w, kind = _arrays(batch)
        keep, carry = keep_mask(h1, h2, t, w, kind == KIND_SEED, carry)
        if keep.all():
            yield batch
        elif keep.any():
            yield batch.filter(pa.array(keep))


def decider(watermark: int) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """mapInArrow function of a streaming micro-batch: sends below ``watermark`` are judged, the rest
    passed through as held; the output drops KIND and adds ROLE (seeds and duplicates are dropped)."""

    def decide(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        carry: _Carry | None = None
        for batch in batches:
            if batch.num_rows == 0:
                continue
            h1, h2, t, w, kind = _arrays(batch)
            seed = kind == KIND_SEED
            held = ~seed & (t >= watermark)
            keep, carry = keep_mask(h1, h2, t, w, seed, carry, held)
            out = keep | held
            if not out.any():
                continue
            role = np.where(held, ROLE_HELD, np.where(w < 0, ROLE_BYPASS, ROLE_KEY)).astype(np.int8)
            names = batch.schema.names
            columns = [batch.column(i) for i, name in enumerate(names) if name != KIND]
            table = pa.RecordBatch.from_arrays(
                [*columns, pa.array(role, pa.int8())], names=[n for n in names if n != KIND] + [ROLE]
            )
            yield table if out.all() else table.filter(pa.array(out))

    return decide
