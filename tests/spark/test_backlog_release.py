"""A backlog replayed faster than real time stays exact: processing-time release waits for a quiet batch.

Idle release decides what was seen ``max_out_of_order`` ago in processing time, so that a quiet stream
still produces its output. While rows keep arriving (a backlog read batch after batch, each batch
taking longer than the bound), event time moves the watermark; releasing by processing time there made
the next batch's rows that are older than the released ones (within the bound) late, and a late copy
of a key lost to the newer copy already kept. bench/spark_dedup.py's 10,000-row batches showed 876
rows differing from the core.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from pyspark.sql import SparkSession

from oncebus.spark.stream import Engine, StreamOptions

S = 1_000_000
SCHEMA = "message_id STRING, enqueued_time TIMESTAMP, seq LONG"
BASE = dt.datetime(2026, 11, 25, tzinfo=dt.UTC)


def rows(*sends: tuple[str, float, int]) -> list[tuple[str, dt.datetime, int]]:
    return [(m, BASE + dt.timedelta(seconds=t), seq) for m, t, seq in sends]


def test_a_backlog_is_not_released_by_processing_time(spark: SparkSession, tmp_path: Path) -> None:
    now = [0]
    options = StreamOptions(
        state_path=str(tmp_path / "state"),
        window="PT10M",
        output_path=str(tmp_path / "out"),
        max_out_of_order="PT2S",
        order_col="seq",
    )
    engine = Engine(spark.createDataFrame([], SCHEMA), options, clock=lambda: now[0])
    # arrival order: A at 10 s, other traffic up to 11 s, then B at 9.5 s (within the 2 s bound of 11 s);
    # each batch starts 10 s of processing time after the one before (a slow backlog)
    batches = [
        rows(("A", 10.0, 0)),
        rows(("x", 10.5, 1), ("y", 11.0, 2)),
        rows(("A", 9.5, 3)),  # in time order this copy of A is the first one: the core keeps it
    ]
    for batch_id, batch in enumerate(batches):
        now[0] = batch_id * 10 * S
        engine.process(spark.createDataFrame(batch, SCHEMA), batch_id)
    now[0] = 40 * S
    engine.process(spark.createDataFrame([], SCHEMA), 3)  # a quiet batch, 10 s later: everything is due
    kept = {r["seq"] for r in spark.read.parquet(str(tmp_path / "out")).collect()}
    assert kept == {1, 2, 3}  # the core's verdicts for the rows in time order: A@9.5 kept, A@10 dropped


def test_a_backlog_batch_with_a_due_arrival_runs_only_the_decide_job(spark: SparkSession, tmp_path: Path) -> None:
    """Asking whether a batch is empty (to release held rows by processing time) cost a Spark job of its
    own in every backlog batch slower than the bound; the batch is now decided as a busy one by the one
    decide job."""
    now = [0]
    options = StreamOptions(
        state_path=str(tmp_path / "state"),
        window="PT10M",
        output_path=str(tmp_path / "out"),
        max_out_of_order="PT2S",
        order_col="seq",
    )
    engine = Engine(spark.createDataFrame([], SCHEMA), options, clock=lambda: now[0])
    engine.process(spark.createDataFrame(rows(("A", 10.0, 0), ("B", 10.5, 1)), SCHEMA), 0)
    now[0] = 10 * S  # batch 0's arrival is due for release; batch 1 brings rows (a backlog)
    tracker = spark.sparkContext.statusTracker()
    spark.sparkContext.setJobGroup("oncebus-backlog", "one backlog batch")
    try:
        backlog = rows(("A", 11.0, 2), *((f"n{i}", 11.0 + i / 100, 3 + i) for i in range(20)))  # in every bucket
        manifest = engine.process(spark.createDataFrame(backlog, SCHEMA), 1)
        jobs = tracker.getJobIdsForGroup("oncebus-backlog")
    finally:
        spark.sparkContext.setJobGroup("", "")
    stages = [s for j in jobs if (job := tracker.getJobInfo(j)) is not None for s in job.stageIds]
    names = [info.name for s in stages if (info := tracker.getStageInfo(s)) is not None]
    # the decide job only: its shuffle's map stage is a job of its own under adaptive execution
    assert len(jobs) == 2 and all("bucketed.py" in name for name in names), names
    assert manifest["counts"]["batch_rows"] == 21 and manifest["counts"]["held"] == 23  # event time: 11.19 - 2 s
    now[0] = 20 * S
    engine.process(spark.createDataFrame([], SCHEMA), 2)  # quiet after all (its plan has partitions): released
    kept = {r["seq"] for r in spark.read.parquet(str(tmp_path / "out")).collect()}
    assert kept == {0, 1, *range(3, 23)}
