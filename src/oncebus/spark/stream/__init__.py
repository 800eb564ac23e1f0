"""``deduplicate_stream``: the exact rule on a streaming DataFrame (the package ``oncebus.spark.stream``).

One ``foreachBatch`` call per micro-batch, batch N:

1. Out-of-order buffer. The watermark (``next_watermark``) is the highest of
   the previous one, the newest time seen minus ``max_out_of_order``, the
   newest time seen ``max_out_of_order`` ago in processing time (idle
   release) and, when the source vouches for order, just past the newest
   time seen. Rows below it are decided now; the rest are held and decided by
   a later batch, so two copies of a key that arrive out of order, within the
   bound, are still judged in time order.
2. State, on a local path or a shared mount (layout 3, ``bucketed`` and
   ``buckets``): the rows are spread over a fixed number of buckets by key
   digest, and the task of each bucket keeps that bucket's state itself: the
   keys each batch recorded (``b=N/keys-<bucket>.arrow``, merged into
   ``c=N`` as they pile up) and the rows it still holds (``b=N/held``). One
   Spark job decides a micro-batch: each task raises the watermark by what its
   bucket saw (rows below the newest row there minus the bound are safe to
   decide, whatever other buckets hold), looks its keys up by binary search in
   its memory-mapped key files (only the rows each file's membership filter,
   ``keys-<bucket>.bits``, lets through), applies the rule and writes keys, held rows
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

The package: ``options`` (``StreamOptions``, the keyword arguments in one object), ``manifest``
(the typed manifest), ``layout`` (the watermark and the ``StateLayout`` protocol), ``engine`` (one
micro-batch: manifests in and out, cleaning), ``bucketed``/``buckets`` (layout 3: the driver's part
and the executor tasks), ``joined`` (layout 2), ``state`` (compaction, ``state_report``), ``files``,
``ticks`` and ``interrupt`` (a quiet ``query.stop()``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from oncebus.core.entities import DEFAULT_DUPLICATE_WINDOW
from oncebus.core.errors import InvalidArgumentError
from oncebus.spark import _plan
from oncebus.spark.stream import manifest
from oncebus.spark.stream.engine import Engine
from oncebus.spark.stream.files import state_files
from oncebus.spark.stream.interrupt import interruptible
from oncebus.spark.stream.layout import LAYOUT_BUCKETED, LAYOUT_JOINED, next_watermark
from oncebus.spark.stream.manifest import Manifest
from oncebus.spark.stream.options import DEFAULT_MAX_OUT_OF_ORDER, ForeachBatch, StreamOptions
from oncebus.spark.stream.ticks import TICKS, TickDataSource

LAYOUT = LAYOUT_BUCKETED  # the layout this release writes on a local or shared path (LAYOUT_JOINED elsewhere)

__all__ = [
    "DEFAULT_MAX_OUT_OF_ORDER",
    "LAYOUT",
    "LAYOUT_JOINED",
    "Engine",
    "Manifest",
    "StreamOptions",
    "deduplicate_stream",
    "flush_stream",
    "next_watermark",
    "start_stream",
]


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
    once it has waited the bound in processing time and a micro-batch brings
    no new row, as a watermark with an idle timeout would (a backlog read
    faster than real time is decided by event time alone, so it stays exact):
    a quiet stream still produces all its output within about the bound plus
    a trigger interval. (For that, the query also reads
    ``oncebus-ticks``, a stream with no rows whose offset advances every
    second, so micro-batches run while the input is quiet; not under a
    finite trigger, ``availableNow`` or ``once``, which stops once the
    backlog is read.) A row later than that is
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
    options = StreamOptions(
        state_path=state_path,
        window=window,
        partitioned=partitioned,
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
    return start_stream(df, options, checkpoint_location=checkpoint_location, trigger=trigger, query_name=query_name)


def start_stream(
    df: DataFrame,
    options: StreamOptions,
    *,
    checkpoint_location: str | None = None,
    trigger: Mapping[str, Any] | None = None,
    query_name: str | None = None,
) -> StreamingQuery:
    """:func:`deduplicate_stream` with its options in one object."""
    engine = Engine(df, options)
    if not df.isStreaming:
        raise InvalidArgumentError("deduplicate_stream needs a streaming DataFrame; use deduplicate for a batch one")

    @interruptible  # query.stop() in the middle of a batch stops it quietly (interrupt.py)
    def each_batch(batch: DataFrame, batch_id: int) -> None:
        engine.process(batch, batch_id)

    source = df
    if options.idle_release and not engine.ordered and not finite(trigger):
        source = df.unionByName(_ticks(df))
    writer = source.writeStream.foreachBatch(each_batch).option(
        "checkpointLocation", checkpoint_location or f"{options.state_path.rstrip('/')}/_checkpoint"
    )
    if query_name:
        writer = writer.queryName(query_name)
    if trigger:
        writer = writer.trigger(**trigger)
    return writer.start()


def finite(trigger: Mapping[str, Any] | None) -> bool:
    """Whether the trigger reads a finite backlog and stops (``availableNow``, ``once``): such a query needs no
    ticks source, since no micro-batch runs once the backlog is read (held rows wait for the next run or
    :func:`flush_stream`)."""
    return trigger is not None and any(bool(trigger.get(name)) for name in ("availableNow", "once"))


def _ticks(df: DataFrame) -> DataFrame:
    """A stream of no rows with ``df``'s columns whose offset advances every second: unioned with a
    quiet input, it makes micro-batches run so held rows are released (``ticks.py``)."""
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
) -> Manifest:
    """Decide the rows a stopped :func:`deduplicate_stream` still holds, as if its input had ended.

    Call it with the same arguments (``df`` gives the schema) after the query
    has stopped, only when no more input will come: the held rows are judged
    and written as one more batch (``batch_id`` = last + 1). Returns that
    batch's manifest.
    """
    options = StreamOptions(
        state_path=state_path,
        window=window,
        partitioned=partitioned,
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
    engine = Engine(df, options)
    spark = df.sparkSession
    ids = manifest.batch_ids(state_files(spark, state_path))
    if not ids:
        raise InvalidArgumentError(f"no batches under {state_path}: nothing to flush")
    empty = spark.createDataFrame([], df.schema).limit(0)  # empty to Spark's optimizer: no job finds that out
    return engine.process(empty, max(ids) + 1, flush=True)
