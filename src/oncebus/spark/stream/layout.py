"""What the engine and its state layouts share: the watermark, what a micro-batch saw, the layout protocol.

A state layout decides one micro-batch against the state the previous batch's manifest lists, and
returns what it saw and the manifest to write (or None for an idle trigger, which changes nothing).
Two layouts are written today: 3 (``bucketed``: a local path or a shared mount; executor tasks keep
each bucket's state) and 2 (``joined``: paths only Spark reaches, HDFS, S3A...). Layout 1 and layout 2
on a local path are read, and moved into buckets by the first batch that meets them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from oncebus.spark._datasource import ORDERED_BY
from oncebus.spark._plan import Columns
from oncebus.spark.stream.files import StateFiles
from oncebus.spark.stream.manifest import KeyFolder, Manifest
from oncebus.spark.stream.options import ForeachBatch

LAYOUT_BUCKETED = 3  # key files read and written by executor tasks (buckets.py), on a local or shared path
LAYOUT_JOINED = 2  # key folders joined as DataFrames: state paths reached through Hadoop only


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


class Engine(Protocol):
    """What a layout uses of the engine (``engine.Engine`` is the one): the resolved options, the state's files,
    and the steps every layout shares. Layouts name this, not the engine's module, so nothing imports in a circle."""

    columns: Columns
    ordered: bool
    bound_us: int
    max_window_us: int
    output_path: str | None
    foreach_batch: ForeachBatch | None
    idle_release: bool
    clock: Callable[[], int]
    user_schema: T.StructType
    prepared_schema: T.StructType | None
    shuffle_keys_up_to: float

    def files(self, spark: SparkSession) -> StateFiles: ...

    def prepare(self, batch: DataFrame) -> DataFrame: ...

    def held_before(self, previous: Manifest) -> int: ...

    def idle(self, previous: Manifest, watermark: int | None, flush: bool) -> bool: ...

    def manifest(
        self,
        seen: Seen,
        batch_id: int,
        folders: list[KeyFolder],
        held: str | None,
        counts: dict[str, int],
        layout: int,
    ) -> Manifest: ...


class StateLayout(Protocol):
    """How a micro-batch is decided against one way of keeping the state."""

    number: int  # the manifest's "layout"

    def decide(
        self, engine: Engine, batch: DataFrame, previous: Manifest, batch_id: int, flush: bool, started: float
    ) -> tuple[Seen, Manifest] | None:
        """(What was seen, the manifest to write) for micro-batch ``batch_id``; None for an idle trigger."""
        ...


def next_watermark(
    *,
    previous_us: int | None,
    max_time_us: int | None,
    bound_us: int,
    ordered: bool,
    idle_release: bool,
    arrivals: Sequence[Sequence[int]],
    now_us: int,
    quiet: bool = True,
) -> tuple[int | None, list[list[int]]]:
    """The watermark of a micro-batch (rows with time below it are decided) and the arrivals to remember.

    ``arrivals`` are ``[processing time, newest event time seen by then]`` of earlier batches. Three
    bounds, the highest wins; the watermark never goes back:

    * event time: ``newest time seen - bound`` (a row is never older than that);
    * idle release (processing time): in a ``quiet`` batch (no new row), every row seen at least
      ``bound`` ago in processing time is decided, with every row at or before its time, so a quiet
      stream still produces its output. While rows keep arriving (a backlog read faster than real
      time) event time moves the watermark, and releasing by processing time would make the next
      rows older than the released ones late: the due arrivals wait for a quiet batch;
    * ordered input (the source vouches that rows arrive in time order): everything seen is decided.
    """
    candidates = [previous_us]
    if max_time_us is not None:
        candidates.append(max_time_us + 1 if ordered else max_time_us - bound_us)
    release = idle_release and quiet
    if release:
        due = [int(newest) for at, newest in arrivals if at <= now_us - bound_us]
        if due:
            candidates.append(max(due) + 1)
    watermark = max((c for c in candidates if c is not None), default=None)
    if release or not idle_release:  # released, or never to be: only what is not due yet is kept
        remembered = [[int(at), int(newest)] for at, newest in arrivals if at > now_us - bound_us]
    else:  # due arrivals wait for a quiet batch, unless the watermark has passed them anyway
        remembered = [[int(at), int(newest)] for at, newest in arrivals if watermark is None or newest >= watermark]
    if max_time_us is not None and not ordered:
        if watermark is None or max_time_us >= watermark:  # rows at or above the watermark wait
            remembered.append([now_us, max_time_us])
    return watermark, remembered


def ordering_of(df: DataFrame, time_col: str) -> str | None:
    """The tie-break column when the source vouches that ``time_col`` arrives in order, else None.

    ORDERED_BY is column metadata a source puts on its time column when it delivers rows in that
    column's order (ties in the order of the column it names): nothing needs holding then. The oncebus
    source sets it."""
    if time_col not in df.columns:
        return None
    value = df.schema[time_col].metadata.get(ORDERED_BY)
    return str(value) if value and value in df.columns else None


def any_due(arrivals: Sequence[Sequence[int]], now_us: int, bound_us: int) -> bool:
    """Whether an arrival has waited the bound in processing time (idle release would decide it)."""
    return any(at <= now_us - bound_us for at, _ in arrivals)


def known_empty(batch: DataFrame) -> bool:
    """Whether ``batch`` has no rows, found without running a Spark job (False when it cannot tell).

    ``foreachBatch`` hands over a micro-batch as a ``LogicalRDD``; with no new input (an idle trigger:
    only the ticks source advanced) its RDD has no partition at all. A plan Spark's optimizer finds
    empty (``limit(0)``, as ``flush_stream`` passes) is empty too."""
    try:
        execution = batch._jdf.queryExecution()
        plan = execution.analyzed()
        if plan.getClass().getSimpleName() == "LogicalRDD":
            return int(plan.rdd().getNumPartitions()) == 0
        optimized = execution.optimizedPlan()  # Spark's optimizer turns a plan it knows is empty into this
        return optimized.getClass().getSimpleName() == "LocalRelation" and bool(optimized.data().isEmpty())
    except Exception:  # Spark Connect (no JVM handle here) or another plan: cannot tell cheaply
        return False
