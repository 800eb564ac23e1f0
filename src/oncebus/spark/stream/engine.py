"""The engine of ``deduplicate_stream``: one object decides every micro-batch of a query.

It keeps what the options resolve to (columns, windows, the out-of-order bound), reads the previous
batch's manifest, hands the batch to the state layout (``StateLayout``: ``bucketed`` on a local or
shared path, ``joined`` on paths only Spark reaches), writes the manifest the layout returns and
deletes what no manifest lists any more. Layouts use only the public part of :class:`Engine`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from oncebus.core.durations import parse_duration, to_micros
from oncebus.core.errors import InvalidArgumentError
from oncebus.spark import _plan
from oncebus.spark._settings import resolve_settings
from oncebus.spark.stream import manifest as manifests
from oncebus.spark.stream.bucketed import BucketedLayout
from oncebus.spark.stream.files import StateFiles, local_directory, state_files
from oncebus.spark.stream.joined import SHUFFLE_KEYS_UP_TO, JoinedLayout
from oncebus.spark.stream.layout import Seen, StateLayout, ordering_of
from oncebus.spark.stream.manifest import Counts, KeyFolder, Manifest
from oncebus.spark.stream.options import DEFAULT_MAX_OUT_OF_ORDER, StreamOptions

_MANIFESTS_KEPT = 100
Clock = Callable[[], int]


def _wall_clock_us() -> int:
    return time.time_ns() // 1000


class Engine:
    """Decides micro-batches; its state lives under ``state_path`` only."""

    def __init__(self, df: DataFrame, options: StreamOptions, clock: Clock = _wall_clock_us) -> None:
        output_path, foreach_batch, max_out_of_order = options.output_path, options.foreach_batch, None
        max_out_of_order = options.max_out_of_order
        order_col = options.order_col
        if output_path is None and foreach_batch is None:
            raise InvalidArgumentError("give output_path, foreach_batch or both: where the kept rows go")
        self.options = options
        self.default, self.per_entity = resolve_settings(options.window, options.partitioned, options.entity_settings)
        tie_break = ordering_of(df, options.time_col)
        self.ordered = tie_break is not None and max_out_of_order is None
        if order_col is None and tie_break is not None:
            order_col = tie_break
        self.columns = _plan.resolve_columns(
            df,
            message_id_col=options.message_id_col,
            partition_key_col=options.partition_key_col,
            session_id_col=options.session_id_col,
            time_col=options.time_col,
            entity_col=options.entity_col,
            order_col=order_col,
            entity_settings_given=bool(options.entity_settings),
        )
        if max_out_of_order is None:
            max_out_of_order = timedelta(0) if self.ordered else DEFAULT_MAX_OUT_OF_ORDER
        bound = parse_duration(max_out_of_order, name="max_out_of_order")
        if bound < timedelta(0):
            raise InvalidArgumentError("max_out_of_order must not be negative")
        self.bound_us = to_micros(bound)
        self.max_window_us = max([self.default.window_us, *(s.window_us for s in self.per_entity.values())])
        self.state_path = options.state_path
        self.output_path = output_path.rstrip("/") if output_path else None
        self.foreach_batch = foreach_batch
        self.on_invalid = options.on_invalid
        self.idle_release = options.idle_release
        self.clock = clock
        self.user_schema = df.schema
        self._previous: tuple[int, Manifest] | None = None
        self._files: StateFiles | None = None
        self.shuffle_keys_up_to = SHUFFLE_KEYS_UP_TO
        self.prepared_schema: T.StructType | None = None  # the prepared rows' schema, once known
        self._prepare_plan: _plan.PreparePlan | None = None
        # a state path (and output path) of plain files: tasks keep the state themselves (layout 3)
        self.bucketed = local_directory(options.state_path) is not None and (
            output_path is None or local_directory(output_path) is not None
        )

    @property
    def layout(self) -> StateLayout:
        """The state layout this engine writes (layout 3 where tasks reach the state's files)."""
        return BucketedLayout() if self.bucketed else JoinedLayout()

    def prepare(self, batch: DataFrame) -> DataFrame:
        """``_plan.prepare`` with its expressions built once per query."""
        if self._prepare_plan is None:
            timestamp = isinstance(self.user_schema[self.columns.time].dataType, T.TimestampType)
            self._prepare_plan = _plan.prepare_plan(
                self.columns, self.default, self.per_entity, self.on_invalid, timestamp
            )
        return self._prepare_plan.apply(batch)

    # -- manifests -----------------------------------------------------------------------------
    def files(self, spark: SparkSession) -> StateFiles:
        if self._files is None:
            self._files = state_files(spark, self.state_path)
        return self._files

    def previous_manifest(self, spark: SparkSession, batch_id: int) -> Manifest:
        """The manifest of the newest batch before ``batch_id`` (an empty one before the first)."""
        if self._previous is not None and self._previous[0] < batch_id:  # this engine wrote the newest one
            return self._previous[1]
        earlier = [i for i in manifests.batch_ids(self.files(spark)) if i < batch_id]
        return manifests.read(self.files(spark), max(earlier)) if earlier else manifests.empty()

    # -- one micro-batch -----------------------------------------------------------------------
    def process(self, batch: DataFrame, batch_id: int, *, flush: bool = False) -> Manifest:
        started = time.perf_counter()
        spark = batch.sparkSession
        previous = self.previous_manifest(spark, batch_id)
        decided = self.layout.decide(self, batch, previous, batch_id, flush, started)
        if decided is None:
            return previous  # an idle tick: nothing arrived and nothing is due; no state to change
        seen, manifest = decided
        manifest["flushed"] = flush
        seen.timings["total"] = round(time.perf_counter() - started, 3)
        manifests.write(self.files(spark), manifest)
        self._previous = (batch_id, manifest)
        self._clean(self.files(spark), previous, manifest, batch_id)
        return manifest

    @staticmethod
    def held_before(previous: Manifest) -> int:
        return manifests.held_rows(previous)

    def idle(self, previous: Manifest, watermark: int | None, flush: bool) -> bool:
        """Whether a batch without new rows changes nothing (an idle tick): no held row became due (the
        oldest held row, which the manifest records, is still at or above the watermark)."""
        replay_possible = self._previous is None  # the first batch of a run may replay one that wrote output
        held = self.held_before(previous)
        oldest_held = previous.get("held_min_t_us")
        none_due = watermark == previous["watermark_us"] or (
            oldest_held is not None and watermark is not None and watermark <= oldest_held
        )
        return not flush and not replay_possible and (none_due or not held)

    def manifest(
        self,
        seen: Seen,
        batch_id: int,
        folders: list[KeyFolder],
        held: str | None,
        counts: dict[str, int],
        layout: int,
    ) -> Manifest:
        """The manifest of a decided batch (a layout adds its own keys to it)."""
        decided_counts: Counts = {
            "batch_rows": seen.rows,
            "late": seen.late,
            "decided": seen.rows + seen.held_before - counts["held"],
            "held": counts["held"],
            "kept": counts["kept"],
            "kept_recorded": counts["recorded"],
        }
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
            "counts": decided_counts,
            "seconds": seen.timings,
        }

    def _clean(self, files: StateFiles, previous: Manifest, manifest: Manifest, batch_id: int) -> None:
        """Delete the folders neither this manifest nor the previous one lists (a replay of this batch
        reads what the previous one lists), and all but the newest manifests."""
        listed = {f["path"] for m in (previous, manifest) for f in m["key_folders"]}
        listed |= {held for m in (previous, manifest) if (held := m.get("held"))}
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
        for old_id in manifests.batch_ids(files)[:-_MANIFESTS_KEPT]:
            files.delete(f"{manifests.FOLDER}/{old_id:020d}.json")
