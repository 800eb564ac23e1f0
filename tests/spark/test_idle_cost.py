"""A quiet stream with held rows runs no Spark job at an idle trigger (issue 21).

The ticks source makes a micro-batch run every second so held rows are released in processing
time; a batch with no new rows whose watermark does not move has nothing to decide, and must not
read, sort and rewrite the held rows to find that out.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from oncebus.spark import deduplicate_stream


@pytest.mark.timeout(300)
def test_idle_triggers_with_held_rows_run_no_spark_job(spark: SparkSession, tmp_path: Path) -> None:
    source = tmp_path / "in"
    start = dt.datetime(2026, 11, 25, tzinfo=dt.UTC)
    rows = [(f"m{i % 40}", start + dt.timedelta(milliseconds=i), i) for i in range(50)]
    schema = "message_id STRING, enqueued_time TIMESTAMP, seq LONG"
    spark.createDataFrame(rows, schema).coalesce(1).write.parquet(str(source))
    query = deduplicate_stream(
        spark.readStream.schema(schema).parquet(str(source)),
        "PT10M",
        state_path=str(tmp_path / "state"),
        output_path=str(tmp_path / "out"),
        max_out_of_order="PT1H",  # every row is held for the whole test
        order_col="seq",
        trigger={"processingTime": "500 milliseconds"},
    )
    tracker = spark.sparkContext.statusTracker()
    try:
        deadline = time.monotonic() + 120

        def batches_done() -> int:
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline, f"only {len(query.recentProgress)} micro-batches ran"
            return len(query.recentProgress)

        while batches_done() < 1:  # the first batch read the rows and held them
            time.sleep(0.2)
        before = set(tracker.getJobIdsForGroup(str(query.runId)))
        first = batches_done()
        while batches_done() < first + 4:  # four idle triggers (the ticks source advances every second)
            time.sleep(0.2)
        during = set(tracker.getJobIdsForGroup(str(query.runId))) - before
        manifests = sorted((tmp_path / "state" / "batches").glob("*.json"))
    finally:
        query.stop()
    assert during == set(), f"{len(during)} Spark jobs ran during idle triggers"
    assert len(manifests) == 1  # the first batch's; an idle trigger changes no state
