"""The streaming engine the state tests drive by hand: the generated trace's columns and entities."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from pyspark.sql import DataFrame

from oncebus.spark import EntitySettings
from oncebus.spark.stream import Engine, StreamOptions
from tests.spark.traces import DEFAULT_ENTITIES

SETTINGS = {
    e.name: EntitySettings(window=timedelta(microseconds=e.window_us), partitioned=e.partitioned)
    for e in DEFAULT_ENTITIES
}


def trace_engine(frame: DataFrame, work: Path, *, order_col: str = "seq") -> Engine:
    """``deduplicate_stream``'s engine over a generated trace, state and output under ``work``."""
    options = StreamOptions(
        state_path=str(work / "state"),
        window="PT10M",
        output_path=str(work / "out"),
        max_out_of_order=timedelta(seconds=2),
        entity_col="entity",
        entity_settings=SETTINGS,
        order_col=order_col,
    )
    return Engine(frame, options)
