"""Generated send traces for the exactness tests and the benchmark.

A trace is a pyarrow Table of send attempts in *arrival* order, with event
times out of order by less than ``max_out_of_order``: a row with event time
``t`` arrives at ``t + jitter`` (jitter uniform in ``[0, bound)``), so when it
arrives every row seen before it has an event time below ``t + bound``.

Resends copy an earlier row's ids after a delay drawn from a mixture: most
within a few seconds, many around the window (including exactly ``W`` and
``W - 1 us``), some far beyond it, so late resends and chains (a resend after
the window, then copies of it) occur. Timestamps are whole milliseconds, so
equal times are common; ``seq`` (the arrival position) breaks ties.
A few rows are invalid (partition_key differs from session_id) and a few have
no message_id.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

START_US = 1_795_000_000_000_000  # 2026-11-18, a fixed origin keeps traces reproducible


FILE_TIME_ORIGIN_S = 1_795_000_000  # the modification time of part 0; part i is i seconds newer


def write_parts(trace: pa.Table, folder: Path, rows_per_file: int, first: int = 0, last: int | None = None) -> None:
    """Write ``trace`` as Parquet parts ``part-<i>.parquet`` of ``rows_per_file`` rows (parts ``first`` to
    ``last``, all by default), each part one second newer than the one before.

    Spark's file stream source reads new files in modification-time order, in milliseconds, and files with the
    same time in the order the directory lists them (on ext4, a hash of the name): parts written within the
    same millisecond could be read out of order, which makes some of their rows late for the stream (a test's
    exact comparison with the core then fails one run in a few). Distinct times make the order the parts'."""
    last = -(-len(trace) // rows_per_file) if last is None else last
    for i in range(first, last):
        path = folder / f"part-{i:05d}.parquet"
        pq.write_table(trace.slice(i * rows_per_file, rows_per_file), path)
        os.utime(path, (FILE_TIME_ORIGIN_S + i, FILE_TIME_ORIGIN_S + i))


@dataclass(frozen=True)
class TraceEntity:
    name: str
    window_us: int
    partitioned: bool
    weight: float = 1.0


DEFAULT_ENTITIES = (
    TraceEntity("orders", 20_000_000, False, 2.0),
    TraceEntity("mytopic", 60_000_000, True, 1.0),
)


def generate_trace(
    rows: int,
    *,
    rate: float = 5_000.0,
    resend_share: float = 0.3,
    max_out_of_order_us: int = 2_000_000,
    entities: tuple[TraceEntity, ...] = DEFAULT_ENTITIES,
    invalid_share: float = 0.001,
    seed: int = 7,
) -> pa.Table:
    """Columns: entity, message_id, partition_key, session_id, enqueued_time (UTC, us), seq, body."""
    rng = np.random.default_rng(seed)
    index = np.arange(rows, dtype=np.int64)
    t = START_US + (index * (1_000_000 / rate)).astype(np.int64) // 1000 * 1000
    weights = np.array([e.weight for e in entities], dtype=float)
    entity_of = rng.choice(len(entities), size=rows, p=weights / weights.sum())
    windows = np.array([e.window_us for e in entities], dtype=np.int64)

    resend = rng.random(rows) < resend_share
    kind = rng.choice(4, size=rows, p=[0.55, 0.2, 0.15, 0.1])
    window_of = windows[entity_of]
    delay = np.select(
        [kind == 0, kind == 1, kind == 2],
        [
            rng.integers(0, 5_000_000, rows),
            (window_of * rng.uniform(0.5, 1.5, rows)).astype(np.int64),
            np.where(rng.random(rows) < 0.5, window_of, window_of - 1),
        ],
        (window_of * rng.uniform(1.5, 3.0, rows)).astype(np.int64),
    )
    target = np.searchsorted(t, t - delay, side="left")
    origin = np.where(resend & (t - delay >= t[0]) & (target < index), target, index)
    while True:  # resends of resends copy the first send's ids
        nxt = origin[origin]
        if np.array_equal(nxt, origin):
            break
        origin = nxt
    entity_of = entity_of[origin]
    # a resend lands exactly ``delay`` after the first send, so boundary delays (W, W - 1 us) stay exact
    t = np.where(origin != index, t[origin] + delay, t)

    ids = pc.binary_join_element_wise("m", pc.cast(pa.array(origin), pa.string()), "")
    pk_kind = rng.choice(4, size=rows, p=[0.4, 0.2, 0.2, 0.2])[origin]
    moved = (origin != index) & (rng.random(rows) < 0.1)  # a resend with another partition key
    pk_num = np.where(moved, (origin + 1) % 50, origin % 50)
    pk_text = pc.binary_join_element_wise("p", pc.cast(pa.array(pk_num), pa.string()), "")
    sid_text = pc.binary_join_element_wise("s", pc.cast(pa.array(pk_num), pa.string()), "")
    partition_key = pc.if_else(pa.array(pk_kind == 0), pk_text, pc.if_else(pa.array(pk_kind == 1), sid_text, None))
    session_id = pc.if_else(pa.array((pk_kind == 1) | (pk_kind == 2)), sid_text, None)
    invalid = rng.random(rows) < invalid_share
    partition_key = pc.if_else(pa.array(invalid), pa.scalar("bad-pk"), partition_key)
    session_id = pc.if_else(pa.array(invalid), pa.scalar("bad-session"), session_id)
    no_id = rng.random(rows) < invalid_share
    ids = pc.if_else(pa.array(no_id), pa.scalar(None, pa.string()), ids)

    arrival = t + rng.integers(0, max(max_out_of_order_us, 1), rows)
    order = np.argsort(arrival, kind="stable")
    names = np.array([e.name for e in entities], dtype=object)
    table = pa.table(
        {
            "entity": pa.array(names[entity_of], pa.string()),
            "message_id": ids,
            "partition_key": partition_key,
            "session_id": session_id,
            "enqueued_time": pa.array(t, pa.timestamp("us", tz="UTC")),
            "body": pc.binary_join_element_wise("body-", pc.cast(pa.array(index), pa.string()), ""),
        }
    ).take(pa.array(order))
    return table.append_column("seq", pa.array(np.arange(rows, dtype=np.int64)))
