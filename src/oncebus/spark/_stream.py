"""``deduplicate_stream``: the exact rule on a streaming DataFrame.

Design (``shared/design/spark-notes.md``, "the fast exact streaming design"),
one ``foreachBatch`` call per micro-batch, batch N:

1. Out-of-order buffer. The watermark is ``max(previous, newest time seen -
   max_out_of_order)``. Rows older than it are decided now; the rest are held
   (Parquet under ``held/``) and decided by a later batch, so two copies of a
   key that arrive out of order, within the bound, are still judged in time
   order.
2. State: one Parquet folder per batch under ``keys/`` holding the 128-bit
   digest and ``t0`` of every key the batch accepted; a folder whose newest
   ``t0`` plus the largest window is below the watermark is deleted whole.
3. Prior ``t0`` of the decided keys: the live folders are scanned once and
   semi-joined on the digest against the broadcast digests of the batch.
4. The rule per key (``_chain``), seeded with the prior ``t0``, on executors.
5. Kept rows go to the sink, new keys to ``keys/b=N``, then a manifest
   ``batches/N.json`` (watermark, live folders, counts, timings) is written
   atomically. Everything batch N writes is named by N and overwritten on a
   replay, and batch N reads only what batch N-1's manifest lists, so a batch
   Spark replays after a failure gives the same result.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming import StreamingQuery

from oncebus.core.durations import parse_duration, to_micros
from oncebus.core.entities import DEFAULT_DUPLICATE_WINDOW
from oncebus.core.errors import InvalidArgumentError
from oncebus.spark import _plan
from oncebus.spark._datasource import ORDERED_BY
from oncebus.spark._files import HadoopFiles
from oncebus.spark._settings import resolve_settings

DEFAULT_MAX_OUT_OF_ORDER = timedelta(seconds=5)
# ORDERED_BY: column metadata a source puts on its time column when it delivers rows in that column's
# order (ties in the order of the column it names): nothing needs holding then. The oncebus source sets it.
KEY_SCHEMA = T.StructType(
    [
        T.StructField("h1", T.LongType(), False),
        T.StructField("h2", T.LongType(), False),
        T.StructField("t0", T.LongType(), False),
    ]
)
_MANIFESTS_KEPT = 100
ForeachBatch = Callable[[DataFrame, int], None]
Clock = Callable[[], int]


def _wall_clock_us() -> int:
    return time.time_ns() // 1000


def next_watermark(
    *,
    previous_us: int | None,
    max_time_us: int | None,
    bound_us: int,
    ordered: bool,
    idle_release: bool,
    arrivals: Sequence[Sequence[int]],
    now_us: int,
) -> tuple[int | None, list[list[int]]]:
    """The watermark of a micro-batch (rows with time below it are decided) and the arrivals to remember.

    ``arrivals`` are ``[processing time, newest event time seen by then]`` of earlier batches. Three
    bounds, the highest wins; the watermark never goes back:

    * event time: ``newest time seen - bound`` (a row is never older than that);
    * idle release (processing time): every row seen at least ``bound`` ago in processing time is
      decided, with every row at or before its time, so a quiet stream still produces its output;
    * ordered input (the source vouches that rows arrive in time order): everything seen is decided.
    """
    candidates = [previous_us]
    if max_time_us is not None:
        candidates.append(max_time_us + 1 if ordered else max_time_us - bound_us)
    if idle_release:
        due = [int(newest) for at, newest in arrivals if at <= now_us - bound_us]
        if due:
            candidates.append(max(due) + 1)
    watermark = max((c for c in candidates if c is not None), default=None)
    remembered = [[int(at), int(newest)] for at, newest in arrivals if at > now_us - bound_us]
    if max_time_us is not None and not ordered:
        if watermark is None or max_time_us >= watermark:  # rows at or above the watermark wait
            remembered.append([now_us, max_time_us])
    return watermark, remembered


def ordering_of(df: DataFrame, time_col: str) -> str | None:
    """The tie-break column when the source vouches that ``time_col`` arrives in order, else None."""
    if time_col not in df.columns:
        return None
    value = df.schema[time_col].metadata.get(ORDERED_BY)
    return str(value) if value and value in df.columns else None


class _Engine:
    """Decides micro-batches; its state lives under ``state_path`` only."""

    def __init__(
        self,
        df: DataFrame,
        *,
        window: Any,
        partitioned: bool,
        state_path: str,
        output_path: str | None,
        foreach_batch: ForeachBatch | None,
        max_out_of_order: Any,
        message_id_col: str,
        partition_key_col: str | None,
        session_id_col: str | None,
        time_col: str,
        entity_col: str | None,
        entity_settings: Mapping[str, Any] | None,
        order_col: str | Sequence[str] | None,
        on_invalid: _plan.OnInvalid,
        idle_release: bool = True,
        clock: Clock = _wall_clock_us,
    ) -> None:
        if output_path is None and foreach_batch is None:
            raise InvalidArgumentError("give output_path, foreach_batch or both: where the kept rows go")
        self.default, self.per_entity = resolve_settings(window, partitioned, entity_settings)
        tie_break = ordering_of(df, time_col)
        self.ordered = tie_break is not None and max_out_of_order is None
        if order_col is None and tie_break is not None:
            order_col = tie_break
        self.columns = _plan.resolve_columns(
            df,
            message_id_col=message_id_col,
            partition_key_col=partition_key_col,
            session_id_col=session_id_col,
            time_col=time_col,
            entity_col=entity_col,
            order_col=order_col,
            entity_settings_given=bool(entity_settings),
        )
        if max_out_of_order is None:
            max_out_of_order = timedelta(0) if self.ordered else DEFAULT_MAX_OUT_OF_ORDER
        bound = parse_duration(max_out_of_order, name="max_out_of_order")
        if bound < timedelta(0):
            raise InvalidArgumentError("max_out_of_order must not be negative")
        self.bound_us = to_micros(bound)
        self.max_window_us = max([self.default.window_us, *(s.window_us for s in self.per_entity.values())])
        self.state_path = state_path
        self.output_path = output_path.rstrip("/") if output_path else None
        self.foreach_batch = foreach_batch
        self.on_invalid = on_invalid
        self.idle_release = idle_release
        self.clock = clock
        self.user_schema = df.schema
        self._previous: tuple[int, dict[str, Any]] | None = None
        self._files: HadoopFiles | None = None
        self._prepared_schema: T.StructType | None = None

    # -- manifests -----------------------------------------------------------------------------
    def _fs(self, spark: SparkSession) -> HadoopFiles:
        if self._files is None:
            self._files = HadoopFiles(spark, self.state_path)
        return self._files

    def previous_manifest(self, spark: SparkSession, batch_id: int) -> dict[str, Any]:
        """The manifest of the newest batch before ``batch_id`` (an empty one before the first)."""
        if self._previous is not None and self._previous[0] < batch_id:  # this engine wrote the newest one
            return self._previous[1]
        files = self._fs(spark)
        ids = [int(name[:-5]) for name in files.list_names("batches") if name.endswith(".json")]
        earlier = [i for i in ids if i < batch_id]
        if not earlier:
            return {
                "batch_id": None,
                "watermark_us": None,
                "max_time_us": None,
                "key_folders": [],
                "held": None,
                "arrivals": [],
            }
        manifest: dict[str, Any] = json.loads(files.read_text(f"batches/{max(earlier):020d}.json"))
        return manifest

    # -- one micro-batch -----------------------------------------------------------------------
    def process(self, batch: DataFrame, batch_id: int, *, flush: bool = False) -> dict[str, Any]:
        started = time.perf_counter()
        now_us = self.clock()
        spark = batch.sparkSession
        files = self._fs(spark)
        previous = self.previous_manifest(spark, batch_id)
        timings: dict[str, float] = {}

        def lap(name: str, since: list[float] = [started]) -> None:  # noqa: B006 - a running clock
            now = time.perf_counter()
            timings[name] = round(now - since[0], 3)
            since[0] = now

        prepared_new = _plan.prepare(batch, self.columns, self.default, self.per_entity, self.on_invalid)
        prepared_new = prepared_new.persist(StorageLevel.MEMORY_AND_DISK)
        self._prepared_schema = prepared_new.schema
        previous_wm = previous["watermark_us"]
        late = F.col(_plan.T_US) < F.lit(previous_wm) if previous_wm is not None else F.lit(False)
        stats = prepared_new.agg(
            F.count(F.lit(1)).alias("rows"),
            F.max(_plan.T_US).alias("max_t"),
            F.sum(late.cast("long")).alias("late"),
        ).first()
        assert stats is not None
        rows_in = batch_rows = int(stats["rows"])
        max_time = max([v for v in (previous["max_time_us"], stats["max_t"]) if v is not None], default=None)
        watermark, arrivals = next_watermark(
            previous_us=previous_wm,
            max_time_us=max_time,
            bound_us=self.bound_us,
            ordered=self.ordered,
            idle_release=self.idle_release,
            arrivals=previous.get("arrivals", []),
            now_us=now_us,
        )
        if flush:
            watermark, arrivals = 2**62, []
        lap("read")
        nothing_held = not previous["held"] or not previous.get("counts", {}).get("held", 0)
        replay_possible = self._previous is None  # the first batch of a run may replay one that wrote output
        if batch_rows == 0 and not flush and not replay_possible and (watermark == previous_wm or nothing_held):
            # nothing arrived and nothing is due (an idle tick): no state to change, no manifest
            prepared_new.unpersist()
            return previous

        pool = prepared_new
        if previous["held"]:
            held_before = spark.read.schema(prepared_new.schema).parquet(files.path(previous["held"]))
            pool = pool.unionByName(held_before)
            rows_in += int(previous.get("counts", {}).get("held", 0))
        if watermark is None:
            decided = pool.limit(0)
            held = pool
        else:
            decided = pool.where(F.col(_plan.T_US) < F.lit(watermark))
            held = pool.where(F.col(_plan.T_US) >= F.lit(watermark))
        held_name = f"held/b={batch_id}"
        held.write.mode("overwrite").parquet(files.path(held_name))
        held_rows = spark.read.parquet(files.path(held_name)).count()
        lap("hold")

        live = [
            f for f in previous["key_folders"] if previous_wm is None or f["max_t0"] + self.max_window_us > previous_wm
        ]
        expired = [f for f in previous["key_folders"] if f not in live]
        seeds = None
        if live:
            state = spark.read.schema(KEY_SCHEMA).parquet(*[files.path(f["path"]) for f in live])
            probe = decided.where(F.col(_plan.W_US) >= 0).select(
                F.col(_plan.H1).alias("p1"), F.col(_plan.H2).alias("p2")
            )
            seeds = state.join(
                F.broadcast(probe),
                on=(state["h1"] == probe["p1"]) & F.coalesce(state["h2"] == probe["p2"], F.lit(False)),
                how="left_semi",
            ).select(F.col("h1").alias(_plan.H1), F.col("h2").alias(_plan.H2), F.col("t0").alias(_plan.T_US))
            # materialised on its own: the scan of the held keys is the cost that grows with rate x window
            seeds = seeds.persist(StorageLevel.MEMORY_AND_DISK)
            keys_found = seeds.count()
        else:
            keys_found = 0
        lap("lookup")
        kept = _plan.apply_rule(decided, self.columns, seeds).persist(StorageLevel.MEMORY_AND_DISK)
        key_name = f"keys/b={batch_id}"
        recorded = kept.where(F.col(_plan.W_US) >= 0)
        new_keys = recorded.select(
            F.col(_plan.H1).alias("h1"), F.col(_plan.H2).alias("h2"), F.col(_plan.T_US).alias("t0")
        )
        new_keys.write.mode("overwrite").parquet(files.path(key_name))
        key_stats = recorded.agg(F.count(F.lit(1)).alias("rows"), F.max(_plan.T_US).alias("max_t0")).first()
        assert key_stats is not None
        lap("decide")

        output = kept.select(*self.columns.user)
        if self.output_path is not None:
            output.write.mode("overwrite").parquet(f"{self.output_path}/batch_id={batch_id}")
        if self.foreach_batch is not None:
            self.foreach_batch(output, batch_id)
        lap("output")

        folders = list(live)
        if key_stats["rows"]:
            folders.append({"path": key_name, "rows": int(key_stats["rows"]), "max_t0": int(key_stats["max_t0"])})
        kept_rows = int(key_stats["rows"])
        manifest = {
            "batch_id": batch_id,
            "watermark_us": watermark,
            "max_time_us": max_time,
            "max_out_of_order_us": self.bound_us,
            "key_folders": folders,
            "keys_held": sum(f["rows"] for f in folders),
            "held": held_name,
            "arrivals": arrivals,
            "ordered": self.ordered,
            "flushed": flush,
            "counts": {
                "batch_rows": batch_rows,
                "late": int(stats["late"] or 0),
                "decided": rows_in - held_rows,
                "held": held_rows,
                "kept_recorded": kept_rows,
                "held_keys_found": keys_found,
            },
            "seconds": timings,
        }
        timings["total"] = round(time.perf_counter() - started, 3)
        files.write_text(f"batches/{batch_id:020d}.json", json.dumps(manifest, indent=1))
        self._previous = (batch_id, manifest)
        prepared_new.unpersist()
        kept.unpersist()
        if seeds is not None:
            seeds.unpersist()
        for folder in expired:
            files.delete(folder["path"])
        keep_from = previous["batch_id"] if previous["batch_id"] is not None else batch_id
        for name in files.list_names("held"):  # a replay of this batch reads the previous batch's folder
            if name.startswith("b=") and int(name[2:]) < keep_from:
                files.delete(f"held/{name}")
        manifests = [n for n in files.list_names("batches") if n.endswith(".json")]
        for name in manifests[:-_MANIFESTS_KEPT]:
            files.delete(f"batches/{name}")
        return manifest


def _engine(df: DataFrame, window: Any, partitioned: bool, **options: Any) -> _Engine:
    return _Engine(df, window=window, partitioned=partitioned, **options)


def deduplicate_stream(
    df: DataFrame,
    window: timedelta | str = DEFAULT_DUPLICATE_WINDOW,
    partitioned: bool = False,
    *,
    state_path: str,
    output_path: str | None = None,
    foreach_batch: ForeachBatch | None = None,
    checkpoint_location: str | None = None,
    max_out_of_order: timedelta | str | None = None,
    idle_release: bool = True,
    trigger: Mapping[str, Any] | None = None,
    query_name: str | None = None,
    message_id_col: str = "message_id",
    partition_key_col: str | None = "partition_key",
    session_id_col: str | None = "session_id",
    time_col: str = "enqueued_time",
    entity_col: str | None = None,
    entity_settings: Mapping[str, Any] | None = None,
    order_col: str | Sequence[str] | None = None,
    on_invalid: _plan.OnInvalid = "drop",
) -> StreamingQuery:
    """Start a streaming query that applies the exact rule of :func:`deduplicate` to ``df``.

    Returns the started ``StreamingQuery``. The kept rows (the input's columns)
    of micro-batch N go to ``output_path/batch_id=N`` as Parquet (overwritten
    if Spark replays batch N, so the output is exactly-once; read the folder as
    one table with a ``batch_id`` column) and/or to ``foreach_batch(df, N)``
    (your sink; make it idempotent per N, as for any foreachBatch sink).

    State (held keys as 128-bit digest + first-accepted time, the out-of-order
    buffer, one JSON manifest per batch with counts and timings) lives under
    ``state_path``, any Hadoop path (local, HDFS, S3A, ABFS); the Spark
    checkpoint defaults to ``state_path/_checkpoint``. Keep both together:
    restarting on the same paths continues exactly where the query stopped.

    ``max_out_of_order`` is the bound on out-of-order arrival: when a row
    arrives, no row seen before it may be newer than its time plus the bound.
    Within the bound the result equals the core's verdicts for the rows sorted
    by (time, ``order_col``). Each row is decided once the newest time seen
    passes its own time plus the bound, or (``idle_release``, on by default)
    once it has waited the bound in processing time, as a watermark with an
    idle timeout would: a quiet stream still produces all its output within
    about the bound plus a trigger interval. (For that, the query also reads
    a one-row-per-second ``rate`` stream whose rows are all filtered out, so
    micro-batches run while the input is quiet.) A row later than that is
    decided in the batch it arrives in, against the keys held then (counted as
    ``late`` in the manifest). The default bound is 5 s, or 0 with nothing
    held when the source vouches for the order of ``time_col`` (the
    ``oncebus`` source does: the broker assigns enqueued times in sequence
    order per entity, and ``sequence_number`` breaks ties). Rows still held
    when the query stops are decided by the next batch, or by
    :func:`flush_stream` when the input has ended for good.

    The per-batch cost is a scan of the held keys (about rate x window keys;
    at 50,000 sends/s and a 10-minute window, 30 million) plus the batch's
    rows, so larger micro-batches (a trigger of 10-30 s) carry more rows per
    scan. ``trigger`` takes the keyword arguments of
    ``DataStreamWriter.trigger``, e.g. ``{"processingTime": "20 seconds"}`` or
    ``{"availableNow": True}``.
    """
    engine = _engine(
        df,
        window,
        partitioned,
        state_path=state_path,
        output_path=output_path,
        foreach_batch=foreach_batch,
        max_out_of_order=max_out_of_order,
        idle_release=idle_release,
        message_id_col=message_id_col,
        partition_key_col=partition_key_col,
        session_id_col=session_id_col,
        time_col=time_col,
        entity_col=entity_col,
        entity_settings=entity_settings,
        order_col=order_col,
        on_invalid=on_invalid,
    )
    if not df.isStreaming:
        raise InvalidArgumentError("deduplicate_stream needs a streaming DataFrame; use deduplicate for a batch one")

    def each_batch(batch: DataFrame, batch_id: int) -> None:
        engine.process(batch, batch_id)

    source = df
    if idle_release and not engine.ordered:
        source = df.unionByName(_ticks(df))
    writer = source.writeStream.foreachBatch(each_batch).option(
        "checkpointLocation", checkpoint_location or f"{state_path.rstrip('/')}/_checkpoint"
    )
    if query_name:
        writer = writer.queryName(query_name)
    if trigger:
        writer = writer.trigger(**trigger)
    return writer.start()


def _ticks(df: DataFrame) -> DataFrame:
    """A stream of no rows with ``df``'s columns whose offsets advance every second (a ``rate`` source,
    filtered out): unioned with a quiet input, it makes micro-batches run so held rows are released."""
    rate = df.sparkSession.readStream.format("rate").option("rowsPerSecond", 1).option("numPartitions", 1).load()
    return rate.where(F.col("value") < 0).select(
        *[F.lit(None).cast(field.dataType).alias(field.name) for field in df.schema.fields]
    )


def flush_stream(
    df: DataFrame,
    window: timedelta | str = DEFAULT_DUPLICATE_WINDOW,
    partitioned: bool = False,
    *,
    state_path: str,
    output_path: str | None = None,
    foreach_batch: ForeachBatch | None = None,
    message_id_col: str = "message_id",
    partition_key_col: str | None = "partition_key",
    session_id_col: str | None = "session_id",
    time_col: str = "enqueued_time",
    entity_col: str | None = None,
    entity_settings: Mapping[str, Any] | None = None,
    order_col: str | Sequence[str] | None = None,
    on_invalid: _plan.OnInvalid = "drop",
) -> dict[str, Any]:
    """Decide the rows a stopped :func:`deduplicate_stream` still holds, as if its input had ended.

    Call it with the same arguments (``df`` gives the schema) after the query
    has stopped, only when no more input will come: the held rows are judged
    and written as one more batch (``batch_id`` = last + 1). Returns that
    batch's manifest.
    """
    engine = _engine(
        df,
        window,
        partitioned,
        state_path=state_path,
        output_path=output_path,
        foreach_batch=foreach_batch,
        max_out_of_order=timedelta(0),
        message_id_col=message_id_col,
        partition_key_col=partition_key_col,
        session_id_col=session_id_col,
        time_col=time_col,
        entity_col=entity_col,
        entity_settings=entity_settings,
        order_col=order_col,
        on_invalid=on_invalid,
    )
    spark = df.sparkSession
    files = HadoopFiles(spark, state_path)
    ids = [int(name[:-5]) for name in files.list_names("batches") if name.endswith(".json")]
    if not ids:
        raise InvalidArgumentError(f"no batches under {state_path}: nothing to flush")
    empty = spark.createDataFrame([], df.schema)
    return engine.process(empty, max(ids) + 1, flush=True)
