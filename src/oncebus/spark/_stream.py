"""``deduplicate_stream``: the exact rule on a streaming DataFrame.

One ``foreachBatch`` call per micro-batch, batch N:

1. Out-of-order buffer. The watermark (``next_watermark``) is the highest of
   the previous one, the newest time seen minus ``max_out_of_order``, the
   newest time seen ``max_out_of_order`` ago in processing time (idle
   release) and, when the source vouches for order, just past the newest
   time seen. Rows below it are decided now; the rest are held and decided by
   a later batch, so two copies of a key that arrive out of order, within the
   bound, are still judged in time order.
2. State, on a local path or a shared mount (layout 3, ``_bucketed`` and
   ``_buckets``): the rows are spread over a fixed number of buckets by key
   digest, and the task of each bucket keeps that bucket's state itself: the
   keys each batch recorded (``b=N/keys-<bucket>.arrow``, merged into
   ``c=N`` as they pile up) and the rows it still holds (``b=N/held``). One
   Spark job decides a micro-batch: each task raises the watermark by what its
   bucket saw (rows below the newest row there minus the bound are safe to
   decide, whatever other buckets hold), looks its keys up by binary search in
   its memory-mapped key files, applies the rule and writes keys, held rows
   and kept rows; the manifest keeps the lowest watermark of the buckets.
   On any other file system (HDFS, S3A...: Spark reaches it, Python tasks do
   not) the state is layout 2: per batch ``b=N/__oncebus_role=1`` (keys) and
   ``=3`` (held rows), joined as DataFrames after a first scan of the batch.
   A key folder whose newest ``t0`` plus the largest window is below the
   watermark is deleted whole.
3. Then a manifest ``batches/N.json`` (watermark, live folders, counts,
   timings) is written atomically. Everything batch N writes is named by N
   (and bucket) and overwritten on a replay, and batch N reads only what
   batch N-1's manifest lists, so a batch Spark replays after a failure (or a
   task it retries) gives the same result. The layouts before (1:
   ``keys/b=N``, ``held/b=N``; 2 on a local path) are moved into buckets by
   the first batch that meets them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming import StreamingQuery

from oncebus.core.durations import parse_duration, to_micros
from oncebus.core.entities import DEFAULT_DUPLICATE_WINDOW
from oncebus.core.errors import InvalidArgumentError
from oncebus.spark import _joined, _plan
from oncebus.spark._datasource import ORDERED_BY
from oncebus.spark._files import StateFiles, local_directory, state_files
from oncebus.spark._interrupt import interruptible
from oncebus.spark._joined import SHUFFLE_KEYS_UP_TO
from oncebus.spark._settings import resolve_settings
from oncebus.spark._ticks import TICKS, TickDataSource

DEFAULT_MAX_OUT_OF_ORDER = timedelta(seconds=5)
# ORDERED_BY: column metadata a source puts on its time column when it delivers rows in that column's
# order (ties in the order of the column it names): nothing needs holding then. The oncebus source sets it.
LAYOUT = _joined.LAYOUT_BUCKETED  # the layout this release writes on a local or shared path
LAYOUT_JOINED = _joined.LAYOUT_JOINED  # ... and on a path only Spark reaches (HDFS, S3A...)
_MANIFESTS_KEPT = 100
ForeachBatch = Callable[[DataFrame, int], None]
Clock = Callable[[], int]


@dataclass
class Seen:
    """What the first scan of a micro-batch found, and the per-phase clock of the batch."""

    prepared: DataFrame
    rows: int
    late: int
    max_time: int | None
    watermark: int | None
    arrivals: list[list[int]]
    held_before: int
    timings: dict[str, float]
    clock: list[float]

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.timings[name] = round(now - self.clock[0], 3)
        self.clock[0] = now


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


def known_empty(batch: DataFrame) -> bool:
    """Whether ``batch`` has no rows, found without running a Spark job (False when it cannot tell).

    ``foreachBatch`` hands over a micro-batch as a ``LogicalRDD``; with no new input (an idle trigger:
    only the ticks source advanced) its RDD has no partition at all."""
    try:
        plan = batch._jdf.queryExecution().analyzed()
        if plan.getClass().getSimpleName() != "LogicalRDD":
            return False
        return int(plan.rdd().getNumPartitions()) == 0
    except Exception:  # Spark Connect (no JVM handle here) or another plan: cannot tell cheaply
        return False


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
        self._files: StateFiles | None = None
        self.shuffle_keys_up_to = SHUFFLE_KEYS_UP_TO
        self._prepared_schema: T.StructType | None = None
        self._prepare_plan: _plan.PreparePlan | None = None
        # a state path (and output path) of plain files: tasks keep the state themselves (layout 3)
        self.bucketed = local_directory(state_path) is not None and (
            output_path is None or local_directory(output_path) is not None
        )

    def prepare(self, batch: DataFrame) -> DataFrame:
        """``_plan.prepare`` with its expressions built once per query."""
        if self._prepare_plan is None:
            timestamp = isinstance(self.user_schema[self.columns.time].dataType, T.TimestampType)
            self._prepare_plan = _plan.prepare_plan(
                self.columns, self.default, self.per_entity, self.on_invalid, timestamp
            )
        return self._prepare_plan.apply(batch)

    # -- manifests -----------------------------------------------------------------------------
    def _fs(self, spark: SparkSession) -> StateFiles:
        if self._files is None:
            self._files = state_files(spark, self.state_path)
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
        spark = batch.sparkSession
        previous = self.previous_manifest(spark, batch_id)
        if self.bucketed:
            from oncebus.spark import _bucketed

            decided = _bucketed.decide(self, batch, previous, batch_id, flush, started)
        else:
            seen = _joined.observe(self, batch, batch_id, previous, flush, started)
            decided = None if seen is None else (seen, _joined.decide(self, spark, previous, seen, batch_id))
        if decided is None:
            return previous  # an idle tick: nothing arrived and nothing is due; no state to change
        seen, manifest = decided
        manifest["flushed"] = flush
        seen.timings["total"] = round(time.perf_counter() - started, 3)
        self._fs(spark).write_text(f"batches/{batch_id:020d}.json", json.dumps(manifest, indent=1))
        self._previous = (batch_id, manifest)
        self._clean(self._fs(spark), previous, manifest, batch_id)
        return manifest

    @staticmethod
    def held_before(previous: dict[str, Any]) -> int:
        return int(previous.get("counts", {}).get("held", 0)) if previous["held"] else 0

    def idle(self, previous: dict[str, Any], watermark: int | None, flush: bool) -> bool:
        """Whether a batch without new rows changes nothing (an idle tick): no held row became due (the
        oldest held row, which the manifest records, is still at or above the watermark)."""
        replay_possible = self._previous is None  # the first batch of a run may replay one that wrote output
        held = self.held_before(previous)
        oldest_held = previous.get("held_min_t_us")
        none_due = watermark == previous["watermark_us"] or (
            oldest_held is not None and watermark is not None and watermark <= oldest_held
        )
        return not flush and not replay_possible and (none_due or not held)

    def _manifest(
        self,
        previous: dict[str, Any],
        seen: Seen,
        batch_id: int,
        folders: list[dict[str, Any]],
        held: str | None,
        counts: dict[str, int],
        layout: int,
        **extra: Any,
    ) -> dict[str, Any]:
        return {
            "layout": layout,
            "batch_id": batch_id,
            "watermark_us": seen.watermark,
            "max_time_us": seen.max_time,
            "max_out_of_order_us": self.bound_us,
            "key_folders": folders,
            "keys_held": sum(f["rows"] for f in folders),
            "held": held,
            "arrivals": seen.arrivals,
            "ordered": self.ordered,
            **extra,
            "counts": {
                "batch_rows": seen.rows,
                "late": seen.late,
                "decided": seen.rows + seen.held_before - counts["held"],
                "held": counts["held"],
                "kept": counts["kept"],
                "kept_recorded": counts["recorded"],
            },
            "seconds": seen.timings,
        }

    def _clean(self, files: StateFiles, previous: dict[str, Any], manifest: dict[str, Any], batch_id: int) -> None:
        """Delete the folders neither this manifest nor the previous one lists (a replay of this batch
        reads what the previous one lists), and all but the newest manifests."""
        listed = {f["path"] for m in (previous, manifest) for f in m["key_folders"]}
        listed |= {m["held"] for m in (previous, manifest) if m.get("held")}
        for name in files.list_names(""):
            if name.startswith("c=") and name not in listed:
                files.delete(name)
            elif name.startswith("b=") and int(name[2:]) < batch_id:
                if name in listed:  # layout 3: the batch's key files are listed, its held rows maybe not
                    for part in ("held", "out"):
                        if f"{name}/{part}" not in listed:
                            files.delete(f"{name}/{part}")
                    continue
                parts = files.list_names(name)
                inside = [f"{name}/{part}" for part in parts if part.startswith(_plan.ROLE) or part in ("held", "out")]
                if not any(path in listed for path in inside):
                    files.delete(name)
                else:
                    for path in inside:
                        if path not in listed:
                            files.delete(path)
        for old in ("keys", "held"):  # the layout before issue 12
            for name in files.list_names(old):
                if f"{old}/{name}" not in listed:
                    files.delete(f"{old}/{name}")
        manifests = [n for n in files.list_names("batches") if n.endswith(".json")]
        for name in manifests[:-_MANIFESTS_KEPT]:
            files.delete(f"batches/{name}")


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
    ``oncebus-ticks``, a stream with no rows whose offset advances every
    second, so micro-batches run while the input is quiet.) A row later than that is
    decided in the batch it arrives in, against the keys held then (counted as
    ``late`` in the manifest). The default bound is 5 s, or 0 with nothing
    held when the source vouches for the order of ``time_col`` (the
    ``oncebus`` source does: the broker assigns enqueued times in sequence
    order per entity, and ``sequence_number`` breaks ties). Rows still held
    when the query stops are decided by the next batch, or by
    :func:`flush_stream` when the input has ended for good.

    On a local or shared path each micro-batch is one Spark job: the held
    keys (about rate x window; at 50,000 sends/s and a 10-minute window, 30
    million) are looked up by binary search in memory-mapped files, not
    scanned. On HDFS, S3A and the like the held keys are scanned every batch,
    so larger micro-batches (a trigger of 10-30 s) carry more rows per scan
    there. ``trigger`` takes the keyword arguments of
    ``DataStreamWriter.trigger``, e.g. ``{"processingTime": "20 seconds"}`` or
    ``{"availableNow": True}``. Small key folders are merged as they pile up
    (keys past their window dropped); :func:`oncebus.spark.state_report`
    tells the state's size and age.

    On a cluster, ``state_path`` and ``output_path`` must be reachable from
    the driver and every executor; under Spark Connect (``foreachBatch`` runs
    on the Connect server) ``state_path`` must be a local path or a shared
    mount of the server's host.
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

    @interruptible  # query.stop() in the middle of a batch stops it quietly (_interrupt.py)
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
    """A stream of no rows with ``df``'s columns whose offset advances every second: unioned with a
    quiet input, it makes micro-batches run so held rows are released (``_ticks.py``)."""
    spark = df.sparkSession
    spark.dataSource.register(TickDataSource)
    ticks = spark.readStream.format(TICKS).load()
    return ticks.select(*[F.lit(None).cast(field.dataType).alias(field.name) for field in df.schema.fields])


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
    files = state_files(spark, state_path)
    ids = [int(name[:-5]) for name in files.list_names("batches") if name.endswith(".json")]
    if not ids:
        raise InvalidArgumentError(f"no batches under {state_path}: nothing to flush")
    empty = spark.createDataFrame([], df.schema)
    return engine.process(empty, max(ids) + 1, flush=True)
