"""The shared scenarios (tests/data/scenarios.json) through the Spark pipeline, batch and streaming.

Every scenario becomes one entity, so one DataFrame (and one stream) runs them
all. send, batch and schedule steps are rows at their ``at`` time (a batch's
messages in batch order; a scheduled send takes part when sent). receive,
restart and advance steps have no meaning in Spark beyond ordering and are
skipped (restart durability has its own streaming test). A window change
(``set_window``) is applied as the entity's window, which Spark holds fixed per
run; as rule 8 says, it applies to keys already held.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from oncebus.core import parse_duration
from oncebus.spark import EntitySettings, deduplicate, deduplicate_stream, flush_stream
from tests.scenarios import delivered_tuple, expected_delivered, load_scenarios

START = dt.datetime(2026, 11, 25, tzinfo=dt.UTC)
SCHEMA = T.StructType(
    [
        T.StructField("entity", T.StringType()),
        T.StructField("message_id", T.StringType()),
        T.StructField("partition_key", T.StringType()),
        T.StructField("session_id", T.StringType()),
        T.StructField("enqueued_time", T.TimestampType()),
        T.StructField("seq", T.LongType()),
    ]
)


def _rows_and_settings() -> tuple[list[tuple[Any, ...]], dict[str, EntitySettings]]:
    rows: list[tuple[Any, ...]] = []
    settings: dict[str, EntitySettings] = {}
    for scenario in load_scenarios():
        entity = scenario["entity"]
        window = parse_duration(entity.get("duplicate_detection_history_time_window", "PT10M"))
        for step in scenario["steps"]:
            if "set_window" in step:
                window = parse_duration(step["set_window"])
            for m in step.get("batch") or [m for m in (step.get("send"), step.get("schedule")) if m]:
                when = START + dt.timedelta(seconds=step["at"])
                pk, sid = m.get("partition_key"), m.get("session_id")
                rows.append((scenario["name"], m.get("message_id"), pk, sid, when, len(rows)))
        settings[scenario["name"]] = EntitySettings(
            window=window,
            partitioned=entity.get("enable_partitioning", False),
            requires_duplicate_detection=entity.get("requires_duplicate_detection", False),
        )
    return rows, settings


def _delivered(df: DataFrame) -> dict[str, list[tuple[str, str | None]]]:
    out: dict[str, list[tuple[str, str | None]]] = defaultdict(list)
    for row in df.collect():
        out[row["entity"]].append(delivered_tuple(row.asDict()))
    return out


def _expected() -> dict[str, list[tuple[str, str | None]]]:
    return {s["name"]: sorted(expected_delivered(s), key=str) for s in load_scenarios()}


def test_scenarios_batch(spark: SparkSession) -> None:
    rows, settings = _rows_and_settings()
    df = spark.createDataFrame(rows, SCHEMA)
    kept = deduplicate(df, entity_col="entity", entity_settings=settings, order_col="seq")
    assert kept.columns == df.columns
    got = {name: sorted(v, key=str) for name, v in _delivered(kept).items()}
    assert {name: got.get(name, []) for name in _expected()} == _expected()


def test_scenarios_stream(spark: SparkSession, tmp_path: Path) -> None:
    rows, settings = _rows_and_settings()
    source = tmp_path / "in"
    spark.createDataFrame(rows, SCHEMA).coalesce(1).write.parquet(str(source))
    stream = spark.readStream.schema(SCHEMA).parquet(str(source))
    options: dict[str, Any] = {
        "entity_col": "entity",
        "entity_settings": settings,
        "order_col": "seq",
        "state_path": str(tmp_path / "state"),
        "output_path": str(tmp_path / "out"),
    }
    query = deduplicate_stream(stream, trigger={"availableNow": True}, **options)
    query.awaitTermination()
    assert query.exception() is None
    flush_stream(stream, **options)
    out = spark.read.parquet(str(tmp_path / "out"))
    assert set(out.columns) == {*SCHEMA.names, "batch_id"}
    got = {name: sorted(v, key=str) for name, v in _delivered(out).items()}
    assert {name: got.get(name, []) for name in _expected()} == _expected()


@pytest.mark.parametrize("on_invalid", ["drop", "raise"])
def test_partition_key_differing_from_session_id(spark: SparkSession, on_invalid: str) -> None:
    df = spark.createDataFrame([("orders", "a", "t", "s", START, 0), ("orders", "b", "s", "s", START, 1)], SCHEMA)
    kept = deduplicate(df, "PT10M", on_invalid=on_invalid)  # type: ignore[arg-type]
    if on_invalid == "drop":
        assert [r["message_id"] for r in kept.collect()] == ["b"]
    else:
        with pytest.raises(Exception, match="partition_key differs from session_id"):
            kept.collect()
