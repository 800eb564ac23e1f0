"""One micro-batch of ``deduplicate_stream`` on the bucketed state (layout 3; tasks in ``buckets``).

One Spark job decides the batch, with no first scan: the new rows are spread by
key digest over the state's buckets; each bucket's task merges the rows it held
before, sorts, raises the watermark by what it sees, looks its keys up, applies
the rule and writes keys, held rows and kept rows itself, returning a row of
counts. No join, no cache, no second pass over the result.

Old key folders are merged now and then by a job of one task per bucket
(``CompactBuckets``). The state of an earlier layout (layout 1 ``keys/b=N``,
layout 2 ``b=N/__oncebus_role=1``) is moved into buckets once, by the first batch
that meets it (``WriteBucket``); its held rows are read like this layout's.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from oncebus.spark import _plan
from oncebus.spark.stream import buckets as _buckets
from oncebus.spark.stream import joined as _joined
from oncebus.spark.stream import state as _state
from oncebus.spark.stream.files import local_directory
from oncebus.spark.stream.layout import LAYOUT_BUCKETED, Engine, Seen, any_due, known_empty, next_watermark
from oncebus.spark.stream.manifest import KeyFolder, Manifest

LAYOUT = LAYOUT_BUCKETED
STATS_SCHEMA = T.StructType([T.StructField(name, T.LongType(), True) for name in _buckets.STATS_FIELDS])


def _collect(df: DataFrame) -> list[dict[str, Any]]:
    return [{k: (int(v) if v is not None else None) for k, v in row.asDict().items()} for row in df.collect()]


def _folder_entry(path: str, stats: list[dict[str, int]]) -> KeyFolder | None:
    rows = sum(s["recorded"] for s in stats)
    if not rows:
        return None
    max_t0 = max(s["max_t0"] for s in stats if s["max_t0"] is not None)
    return {"path": path, "rows": rows, "max_t0": max_t0, "layout": LAYOUT}


def _migrate(
    engine: Engine, spark: SparkSession, old: list[KeyFolder], watermark: int | None, buckets: int, batch_id: int
) -> KeyFolder | None:
    """Move the key folders of an earlier layout into buckets (``c=N``), dropping keys past their window."""
    files = engine.files(spark)
    keys = _joined.key_folders(engine, spark, old, with_window=True)
    if keys is None:
        return None
    columns = (_plan.H1, _plan.H2, _plan.T_US, _plan.W_US)
    alive = _state.compact(keys, columns, watermark, engine.max_window_us)
    path = f"c={batch_id}"
    files.delete(path)
    spread = alive.repartition(buckets, F.col(_plan.H1)).sortWithinPartitions(_plan.H1, _plan.H2, _plan.T_US)
    task = _buckets.WriteBucket(root=str(local_directory(files.root)), folder=path)
    return _folder_entry(path, _collect(spread.mapInArrow(task, STATS_SCHEMA)))


def _compact(
    engine: Engine, spark: SparkSession, live: list[KeyFolder], watermark: int | None, buckets: int, batch_id: int
) -> list[KeyFolder]:
    """Merge small old key folders into one (``c=N``), a task per bucket, dropping keys past their window."""
    merge = _state.plan_compaction(live)
    if not merge:
        return live
    files = engine.files(spark)
    path = f"c={batch_id}"
    files.delete(path)
    task = _buckets.CompactBuckets(
        root=str(local_directory(files.root)),
        folders=tuple(f["path"] for f in merge),
        folder=path,
        watermark=watermark,
    )
    stats = _collect(spark.range(0, buckets, 1, buckets).mapInArrow(task, STATS_SCHEMA))
    merged = _folder_entry(path, stats)
    rest = [f for f in live if f not in merge]
    return [merged, *rest] if merged else rest


def _held_alone(
    spark: SparkSession, task: _buckets.BatchTask, buckets: int, holding: Iterable[int]
) -> list[dict[str, Any]]:
    """Decide the held rows of the buckets ``holding`` with no new row: one task per bucket over
    ``spark.range(buckets)``, the others return at once; no job when no bucket holds rows."""
    only = frozenset(holding)
    if not only:
        return []
    alone = dataclasses.replace(task, only_buckets=only)
    return _collect(spark.range(0, buckets, 1, buckets).mapInArrow(alone, STATS_SCHEMA))


class BucketedLayout:
    """Layout 3 (the ``StateLayout`` of a local path or a shared mount)."""

    number = LAYOUT

    def decide(
        self, engine: Engine, batch: DataFrame, previous: Manifest, batch_id: int, flush: bool, started: float
    ) -> tuple[Seen, Manifest] | None:
        return decide(engine, batch, previous, batch_id, flush, started)


def decide(
    engine: Engine,
    batch: DataFrame,
    previous: Manifest,
    batch_id: int,
    flush: bool,
    started: float,
    *,
    quiet: bool | None = None,
    now_us: int | None = None,
) -> tuple[Seen, Manifest] | None:
    """Decide micro-batch ``batch_id``: (what was seen, the manifest to write), or None for an idle tick.

    Whether the batch is quiet (no new row; idle release may then decide more) is known without a job
    when its plan has no partition. Else, while an arrival is due for release, the batch is decided as a
    busy one (the common case: a backlog) and, if it brought no row after all, decided again as a quiet
    one (``quiet``), as a replay would: no job runs just to ask whether the batch is empty."""
    spark = batch.sparkSession
    now_us = engine.clock() if now_us is None else now_us
    files = engine.files(spark)
    root = local_directory(files.root)
    assert root is not None
    previous_wm = previous["watermark_us"]
    buckets = int(previous.get("buckets") or spark.conf.get("spark.sql.shuffle.partitions") or 2)
    held_before = engine.held_before(previous)
    # the lowest watermark, from what earlier batches saw; each bucket's task raises it by what it sees
    earlier = previous.get("arrivals", [])
    empty = known_empty(batch)
    due = engine.idle_release and any_due(earlier, now_us, engine.bound_us)
    assumed_busy = quiet is None and due and not empty  # decided as busy; again as quiet if no row came

    def watermark_if(quiet: bool) -> tuple[int | None, list[list[int]]]:
        return next_watermark(
            previous_us=previous_wm,
            max_time_us=previous["max_time_us"],
            bound_us=engine.bound_us,
            ordered=engine.ordered,
            idle_release=engine.idle_release,
            arrivals=earlier,
            now_us=now_us,
            quiet=quiet,
        )

    floor, arrivals = watermark_if(not due or empty if quiet is None else quiet)
    arrivals = [a for a in arrivals if a[0] != now_us]  # this batch's arrival is added once its newest time is known
    if not flush and empty and engine.idle(previous, floor, flush):
        return None  # an idle trigger: no new rows and no held row due; no job runs
    decide_all = flush or engine.ordered  # an ordered input is decided as it comes: nothing is held
    prepared = engine.prepare(batch)
    timings: dict[str, float] = {}
    seen = Seen(
        prepared=prepared,
        rows=0,
        late=0,
        max_time=previous["max_time_us"],
        watermark=None,
        arrivals=arrivals,
        held_before=held_before,
        timings=timings,
        clock=[started],
    )

    seen.lap("plan")  # the driver so far: manifest, watermark, the batch's plan
    # the live key folders: whole folders past their window dropped; an earlier layout's moved into buckets;
    # small ones merged
    live: list[KeyFolder] = [
        f for f in previous["key_folders"] if previous_wm is None or f["max_t0"] + engine.max_window_us > previous_wm
    ]
    older_layout = [f for f in live if f.get("layout") != LAYOUT]
    if older_layout:
        moved = _migrate(engine, spark, older_layout, previous_wm, buckets, batch_id)
        live = [f for f in live if f.get("layout") == LAYOUT] + ([moved] if moved else [])
    else:
        live = _compact(engine, spark, live, previous_wm, buckets, batch_id)
    seen.lap("compact")

    # the tasks merge the rows held before and sort when the previous batch held rows in buckets and Arrow
    # sorts the order columns as Spark does; else Spark brings the held rows and sorts
    in_task = (previous.get("layout") == LAYOUT or not held_before) and _sorts_like_spark(engine)
    pool = prepared
    if held_before and not in_task:
        if engine.prepared_schema is None:
            engine.prepared_schema = prepared.schema
        assert previous["held"] is not None  # rows were held
        held = spark.read.schema(engine.prepared_schema).parquet(files.path(previous["held"]))
        pool = pool.unionByName(held)
    folder = f"b={batch_id}"
    files.delete(folder)  # a replay starts clean
    if engine.output_path is not None:
        output = local_directory(engine.output_path)
        assert output is not None
        output_folder = output / f"batch_id={batch_id}"
    else:
        output_folder = root / folder / "out"
    _clear(output_folder)
    held_folder = None if engine.ordered else f"{folder}/held"
    task = _buckets.BatchTask(
        root=str(root),
        batch_id=batch_id,
        buckets=buckets,
        watermark=_buckets.DECIDE_ALL if decide_all else (floor if floor is not None else -_buckets.DECIDE_ALL),
        bound_us=engine.bound_us,
        previous_watermark=previous_wm,
        key_folders=tuple(f["path"] for f in live),
        keys_folder=folder,
        held_folder=held_folder,
        output_folder=str(output_folder),
        user_columns=tuple(engine.columns.user),
        held_input=previous["held"] if held_before and in_task else None,
        sort_keys=(_plan.H1, _plan.H2, _plan.T_US, *engine.columns.order) if in_task else (),
    )
    if empty and in_task:  # no new row (a flush, an idle trigger releasing rows): only the held rows, no shuffle
        holding = previous.get("held_buckets", range(buckets)) if held_before else []
        reported = _held_alone(spark, task, buckets, holding)
    else:
        bucket = F.pmod(F.hash(F.col(_plan.H1)), F.lit(buckets))  # Spark's partition of repartition(buckets, H1)
        spread = pool.select(F.col("*"), bucket.alias(_buckets.BUCKET)).repartition(buckets, F.col(_plan.H1))
        if not in_task:
            spread = spread.sortWithinPartitions(_plan.H1, _plan.H2, _plan.T_US, *engine.columns.order)
        reported = _collect(spread.mapInArrow(task, STATS_SCHEMA))
        # Spark ran no task for buckets that got no new row (a shuffle of nothing): their held rows alone
        missing = set(previous.get("held_buckets", [])) - {s["bucket"] for s in reported} if in_task else set()
        reported += _held_alone(spark, task, buckets, missing)
    stats = [s for s in reported if s["rows"]]
    seen.lap("decide")

    seen.rows = sum(s["rows"] for s in stats) - held_before
    if assumed_busy and seen.rows == 0 and watermark_if(True)[0] != floor:  # quiet after all: release what is due
        return decide(engine, batch, previous, batch_id, flush, started, quiet=True, now_us=now_us)
    seen.late = sum(s["late"] for s in stats)
    newest = [s["max_t"] for s in stats if s["max_t"] is not None]
    seen.max_time = max([t for t in (previous["max_time_us"], *newest) if t is not None], default=None)
    if flush:
        watermark: int | None = _buckets.DECIDE_ALL
        seen.arrivals = []
    elif engine.ordered:
        watermark = max([w for w in (floor, None if seen.max_time is None else seen.max_time + 1) if w is not None])
    else:  # every row below the lowest of the buckets' watermarks has been decided
        watermark = min([s["watermark"] for s in stats], default=floor)
        if not engine.ordered and newest and (watermark is None or max(newest) >= watermark):
            seen.arrivals.append([now_us, max(newest)])
    if seen.rows == 0 and engine.idle(previous, watermark, flush):
        _clear(output_folder)
        output_folder.rmdir()
        files.delete(folder)
        return None
    seen.watermark = watermark
    (output_folder / "_SUCCESS").touch()
    if engine.foreach_batch is not None:
        engine.foreach_batch(spark.read.schema(engine.user_schema).parquet(str(output_folder)), batch_id)
    seen.lap("output")

    held_rows = sum(s["held"] for s in stats)
    folders = list(live)
    entry = _folder_entry(folder, stats)
    if entry:
        folders.append(entry)
    counts = {"held": held_rows, "kept": sum(s["kept"] for s in stats), "recorded": entry["rows"] if entry else 0}
    manifest = engine.manifest(seen, batch_id, folders, held_folder if held_rows else None, counts, LAYOUT)
    manifest["buckets"] = buckets
    manifest["held_buckets"] = sorted(s["bucket"] for s in stats if s["held"])
    manifest["held_min_t_us"] = min([s["min_held_t"] for s in stats if s["min_held_t"] is not None], default=None)
    return seen, manifest


_ARROW_SORTS_LIKE_SPARK = (
    T.ByteType,
    T.ShortType,
    T.IntegerType,
    T.LongType,
    T.StringType,
    T.BinaryType,
    T.BooleanType,
    T.DateType,
    T.TimestampType,
    T.TimestampNTZType,
)


def _sorts_like_spark(engine: Engine) -> bool:
    """Whether Arrow orders the order columns as Spark does (not floats: NaN and -0.0; not nested types)."""
    types = {f.name: f.dataType for f in engine.user_schema.fields}
    return all(isinstance(types[name], _ARROW_SORTS_LIKE_SPARK) for name in engine.columns.order)


def _clear(folder: Path) -> None:
    """An empty folder (a replay of the batch starts clean)."""
    if folder.exists():
        for child in folder.iterdir():
            if child.is_dir():
                import shutil

                shutil.rmtree(child, ignore_errors=True)
            else:
                os.unlink(child)
    folder.mkdir(parents=True, exist_ok=True)
