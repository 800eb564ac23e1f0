"""A finite backlog (``availableNow`` or ``once``) is read without the ticks source (issue 21).

The ticks source only makes micro-batches run while the input is quiet, to release held rows in
processing time. Under a finite trigger the query stops once the backlog is read, so it adds
nothing but its Python planner at the start and an offset round trip per batch.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from oncebus.spark import deduplicate_stream, flush_stream

SCHEMA = "message_id STRING, enqueued_time TIMESTAMP, seq LONG"


def _source(spark: SparkSession, tmp_path: Path) -> Path:
    source = tmp_path / "in"
    start = dt.datetime(2026, 11, 25, tzinfo=dt.UTC)
    rows = [(f"m{i % 40}", start + dt.timedelta(milliseconds=100 * i), i) for i in range(100)]
    spark.createDataFrame(rows, SCHEMA).coalesce(1).write.parquet(str(source))
    return source


@pytest.mark.parametrize("trigger", [{"availableNow": True}, {"once": True}])
def test_a_finite_trigger_reads_no_ticks_source(spark: SparkSession, tmp_path: Path, trigger: dict[str, bool]) -> None:
    """Only the input is a source of the query (the ticks source, a Python data source, would be a second)."""
    source = _source(spark, tmp_path)
    query = deduplicate_stream(
        spark.readStream.schema(SCHEMA).parquet(str(source)),
        "PT10M",
        state_path=str(tmp_path / "state"),
        output_path=str(tmp_path / "out"),
        max_out_of_order="PT2S",
        order_col="seq",
        trigger=trigger,
    )
    query.awaitTermination()
    sources = [[s["description"] for s in p["sources"]] for p in query.recentProgress]
    assert sources and all(len(one) == 1 and "FileStreamSource" in one[0] for one in sources), sources
    got = sorted(r["seq"] for r in spark.read.parquet(str(tmp_path / "out")).collect())
    assert got == list(range(40))[: len(got)] and got  # the first copy of each id, but the held tail


def test_flush_after_a_finite_run_is_one_small_job_and_exact(spark: SparkSession, tmp_path: Path) -> None:
    """flush_stream decides the held rows by one job over the buckets that hold rows (no shuffle of an
    empty batch first), and the output is then every first copy."""
    source = _source(spark, tmp_path)
    stream = spark.readStream.schema(SCHEMA).parquet(str(source))
    options: dict[str, Any] = {
        "state_path": str(tmp_path / "state"),
        "output_path": str(tmp_path / "out"),
        "order_col": "seq",
    }
    deduplicate_stream(
        stream, "PT10M", max_out_of_order="PT2S", trigger={"availableNow": True}, **options
    ).awaitTermination()
    held = json.loads(sorted((tmp_path / "state" / "batches").glob("*.json"))[-1].read_text())["counts"]["held"]
    assert held > 0
    tracker = spark.sparkContext.statusTracker()
    spark.sparkContext.setJobGroup("oncebus-flush", "flush_stream")
    try:
        manifest = flush_stream(stream, "PT10M", **options)
        jobs = tracker.getJobIdsForGroup("oncebus-flush")
    finally:
        spark.sparkContext.setJobGroup("", "")
    assert len(jobs) == 1, f"{len(jobs)} Spark jobs for a flush"
    assert manifest["counts"]["held"] == 0 and manifest["counts"]["decided"] == held
    got = sorted(r["seq"] for r in spark.read.parquet(str(tmp_path / "out")).collect())
    assert got == list(range(40))
