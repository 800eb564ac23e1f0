"""Layout 2 of the ``deduplicate_stream`` state, for state paths Python tasks cannot reach (HDFS, S3A...).

A first scan of each micro-batch finds its row count and newest time (the
watermark); then the rows, the rows held before and the prior ``t0`` of their
keys (the live key folders ``b=N/__oncebus_role=1``, semi-joined against the
broadcast digests of the pool when they are many) are shuffled by digest,
sorted and run through the rule (``_chain.decider``); that result is cached and
written three ways: keys, held rows (``b=N/__oncebus_role=3``), output. Small
key folders are merged into ``c=N`` as they pile up.
"""

from __future__ import annotations

import time
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from oncebus.spark import _chain, _plan
from oncebus.spark.stream import state as _state
from oncebus.spark.stream.layout import LAYOUT_BUCKETED, LAYOUT_JOINED, Engine, Seen, known_empty, next_watermark
from oncebus.spark.stream.manifest import KeyFolder, Manifest

KEY_SCHEMA = T.StructType(
    [
        T.StructField("h1", T.LongType(), False),
        T.StructField("h2", T.LongType(), False),
        T.StructField("t0", T.LongType(), False),
    ]
)
# (H1, H2, T_US) read from the role=1 folders of this layout; the layout before issue 12 kept keys/b=N
# with KEY_SCHEMA and held/b=N, and is still read (then cleaned up as its folders expire)
STATE_KEY_SCHEMA = T.StructType(
    [T.StructField(name, T.LongType(), False) for name in ("__oncebus_h1", "__oncebus_h2", "__oncebus_t")]
)
# up to this many live keys per row to decide, the keys are sorted with the rows instead of being
# probed by a broadcast semi-join first (which costs one more scan of the input)
SHUFFLE_KEYS_UP_TO = 0.25


def key_folders(
    engine: Engine, spark: SparkSession, folders: list[KeyFolder], *, with_window: bool = False
) -> DataFrame | None:
    """(H1, H2, T_US[, W_US]) of the keys recorded in ``folders`` (this layout's and the first one's;
    the first layout kept no window: null there)."""
    files = engine.files(spark)
    current = [files.path(f["path"]) for f in folders if f.get("layout") == LAYOUT_JOINED]
    first = [files.path(f["path"]) for f in folders if f.get("layout") not in (LAYOUT_JOINED, LAYOUT_BUCKETED)]
    parts: list[DataFrame] = []
    names = [*STATE_KEY_SCHEMA.names, _plan.W_US] if with_window else STATE_KEY_SCHEMA.names
    if current:
        schema = T.StructType([*STATE_KEY_SCHEMA.fields, T.StructField(_plan.W_US, T.LongType())])
        schema = schema if with_window else STATE_KEY_SCHEMA
        parts.append(spark.read.schema(schema).parquet(*current).select(*names))
    if first:  # keys/b=N folders of the layout before issue 12: (h1, h2, t0)
        old = spark.read.schema(KEY_SCHEMA).parquet(*first)
        renamed = [F.col("h1").alias(_plan.H1), F.col("h2").alias(_plan.H2), F.col("t0").alias(_plan.T_US)]
        if with_window:
            renamed.append(F.lit(None).cast("long").alias(_plan.W_US))
        parts.append(old.select(*renamed))
    if not parts:
        return None
    keys = parts[0]
    for part in parts[1:]:
        keys = keys.unionByName(part)
    return keys


def compact(
    engine: Engine, spark: SparkSession, live: list[KeyFolder], watermark: int | None, batch_id: int
) -> list[KeyFolder]:
    """Merge old key folders into one (``_state``), dropping keys whose window has passed."""
    merge = _state.plan_compaction(live)
    if not merge:
        return live
    files = engine.files(spark)
    keys = key_folders(engine, spark, merge, with_window=True)
    assert keys is not None
    path = f"c={batch_id}"
    columns = (_plan.H1, _plan.H2, _plan.T_US, _plan.W_US)
    _state.compact(keys, columns, watermark, engine.max_window_us).write.mode("overwrite").parquet(files.path(path))
    written = spark.read.schema(STATE_KEY_SCHEMA).parquet(files.path(path))
    stats = written.agg(F.count(F.lit(1)).alias("rows"), F.max(_plan.T_US).alias("max_t0")).first()
    assert stats is not None
    rest = [f for f in live if f not in merge]
    if not stats["rows"]:
        return rest
    merged: KeyFolder = {
        "path": path,
        "rows": int(stats["rows"]),
        "max_t0": int(stats["max_t0"]),
        "layout": LAYOUT_JOINED,
    }
    return [merged, *rest]


def observe(
    engine: Engine, batch: DataFrame, batch_id: int, previous: Manifest, flush: bool, started: float
) -> Seen | None:
    """What arrived (row count, newest time, late rows: one scan) and the batch's watermark; None for
    an idle tick."""
    now_us = engine.clock()
    timings: dict[str, float] = {}
    prepared_new = engine.prepare(batch)
    engine.prepared_schema = prepared_new.schema
    previous_wm = previous["watermark_us"]
    late = F.col(_plan.T_US) < F.lit(previous_wm) if previous_wm is not None else F.lit(False)
    stats: Any = {"rows": 0, "max_t": None, "late": 0}  # an idle trigger's: no job to find it
    if not known_empty(batch):
        stats = prepared_new.agg(
            F.count(F.lit(1)).alias("rows"),
            F.max(_plan.T_US).alias("max_t"),
            F.sum(late.cast("long")).alias("late"),
        ).first()
        assert stats is not None
    batch_rows = int(stats["rows"])
    max_time = max([v for v in (previous["max_time_us"], stats["max_t"]) if v is not None], default=None)
    watermark, arrivals = next_watermark(
        previous_us=previous_wm,
        max_time_us=max_time,
        bound_us=engine.bound_us,
        ordered=engine.ordered,
        idle_release=engine.idle_release,
        arrivals=previous.get("arrivals", []),
        now_us=now_us,
        quiet=batch_rows == 0,
    )
    if flush:
        watermark, arrivals = 2**62, []
    assert watermark is not None or batch_rows == 0
    held_before = engine.held_before(previous)
    if batch_rows == 0 and engine.idle(previous, watermark, flush):
        return None
    timings["read"] = round(time.perf_counter() - started, 3)
    return Seen(
        prepared=prepared_new,
        rows=batch_rows,
        late=int(stats["late"] or 0),
        max_time=max_time,
        watermark=watermark if watermark is not None else (previous_wm if previous_wm is not None else -(2**62)),
        arrivals=arrivals,
        held_before=held_before,
        timings=timings,
        clock=[time.perf_counter()],
    )


class JoinedLayout:
    """Layout 2 (the ``StateLayout`` of a path only Spark reaches): a first scan, then a join."""

    number = LAYOUT_JOINED

    def decide(
        self, engine: Engine, batch: DataFrame, previous: Manifest, batch_id: int, flush: bool, started: float
    ) -> tuple[Seen, Manifest] | None:
        seen = observe(engine, batch, batch_id, previous, flush, started)
        return None if seen is None else (seen, decide(engine, batch.sparkSession, previous, seen, batch_id))


def decide(engine: Engine, spark: SparkSession, previous: Manifest, seen: Seen, batch_id: int) -> Manifest:
    """Layout 2, for state paths Spark reaches only through Hadoop (HDFS, S3A...): the state's keys
    are joined as DataFrames and the result is written three ways."""
    files = engine.files(spark)
    prepared_new, watermark, previous_wm = seen.prepared, seen.watermark, previous["watermark_us"]
    lap = seen.lap
    pool = prepared_new
    if seen.held_before:
        assert previous["held"] is not None  # rows were held
        held_schema = T.StructType([f for f in prepared_new.schema.fields])
        pool = pool.unionByName(spark.read.schema(held_schema).parquet(files.path(previous["held"])))
    live = [
        f for f in previous["key_folders"] if previous_wm is None or f["max_t0"] + engine.max_window_us > previous_wm
    ]
    live = compact(engine, spark, live, previous_wm, batch_id)
    lap("compact")
    seeds = key_folders(engine, spark, live)
    pool_rows = seen.rows + seen.held_before
    keys_live = sum(int(f["rows"]) for f in live)
    if seeds is not None and keys_live > engine.shuffle_keys_up_to * pool_rows:
        # many keys held: scan them against the broadcast digests of the pool (one more scan of the
        # pool, but only the keys the pool has go through the sort); few: sort them all with the pool
        probe = pool.where(F.col(_plan.W_US) >= 0).select(F.col(_plan.H1).alias("p1"), F.col(_plan.H2).alias("p2"))
        seeds = seeds.join(
            F.broadcast(probe),
            on=(seeds[_plan.H1] == probe["p1"]) & F.coalesce(seeds[_plan.H2] == probe["p2"], F.lit(False)),
            how="left_semi",
        )

    # one pass decides every key: kept rows (recording their key or not) and rows still held
    assert watermark is not None  # observe() gives a decided batch a watermark
    result = _plan.decide(pool, engine.columns, seeds, watermark)
    result = result.persist(StorageLevel.MEMORY_AND_DISK)
    role = F.col(_plan.ROLE)
    folder = f"b={batch_id}"
    keys_path = f"{folder}/{_plan.ROLE}={_chain.ROLE_KEY}"
    held_path = f"{folder}/{_plan.ROLE}={_chain.ROLE_HELD}"
    files.delete(folder)  # a replay starts clean
    key_columns = [F.col(c) for c in (*STATE_KEY_SCHEMA.names, _plan.W_US)]
    result.where(role == _chain.ROLE_KEY).select(*key_columns).write.mode("overwrite").parquet(files.path(keys_path))
    if not engine.ordered:  # an ordered input holds nothing
        held_columns = [F.col(f.name) for f in prepared_new.schema.fields]
        result.where(role == _chain.ROLE_HELD).select(*held_columns).write.mode("overwrite").parquet(
            files.path(held_path)
        )
    lap("decide")
    output = result.where(role != _chain.ROLE_HELD).select(*engine.columns.user)
    if engine.output_path is not None:
        output.write.mode("overwrite").parquet(f"{engine.output_path}/batch_id={batch_id}")
    if engine.foreach_batch is not None:
        engine.foreach_batch(output, batch_id)
    lap("output")
    counts = result.agg(
        F.sum((role == _chain.ROLE_KEY).cast("long")).alias("recorded"),
        F.max(F.when(role == _chain.ROLE_KEY, F.col(_plan.T_US))).alias("max_t0"),
        F.sum((role == _chain.ROLE_HELD).cast("long")).alias("held"),
        F.sum((role != _chain.ROLE_HELD).cast("long")).alias("kept"),
        F.min(F.when(role == _chain.ROLE_HELD, F.col(_plan.T_US))).alias("min_held_t"),
    ).first()
    assert counts is not None
    result.unpersist()
    recorded, held_rows = int(counts["recorded"] or 0), int(counts["held"] or 0)

    # the manifest names what the next batch reads; then what no batch will read again goes
    folders = list(live)
    if recorded:
        folders.append({"path": keys_path, "rows": recorded, "max_t0": int(counts["max_t0"]), "layout": LAYOUT_JOINED})
    manifest = engine.manifest(
        seen,
        batch_id,
        folders,
        held_path if held_rows else None,
        {"held": held_rows, "kept": int(counts["kept"] or 0), "recorded": recorded},
        LAYOUT_JOINED,
    )
    manifest["held_min_t_us"] = None if counts["min_held_t"] is None else int(counts["min_held_t"])
    return manifest
