"""The streaming engine the state tests drive by hand: the generated trace's columns and entities."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from pyspark.sql import DataFrame

from oncebus.spark import EntitySettings
from oncebus.spark._stream import _Engine
from tests.spark.traces import DEFAULT_ENTITIES

SETTINGS = {
    e.name: EntitySettings(window=timedelta(microseconds=e.window_us), partitioned=e.partitioned)
    for e in DEFAULT_ENTITIES
}


def trace_engine(frame: DataFrame, work: Path, *, order_col: str = "seq") -> _Engine:
    """``deduplicate_stream``'s engine over a generated trace, state and output under ``work``."""
    return _Engine(
        frame,
        window="PT10M",
        partitioned=False,
        state_path=str(work / "state"),
        output_path=str(work / "out"),
        foreach_batch=None,
        max_out_of_order=timedelta(seconds=2),
        message_id_col="message_id",
        partition_key_col="partition_key",
        session_id_col="session_id",
        time_col="enqueued_time",
        entity_col="entity",
        entity_settings=SETTINGS,
        order_col=order_col,
        on_invalid="drop",
    )
