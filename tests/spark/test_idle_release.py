"""No row waits forever: held rows are released in processing time too (issue 12, item 5)."""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from oncebus.spark import deduplicate_stream
from oncebus.spark.stream import next_watermark

S = 1_000_000  # microseconds


def test_event_time_bound_alone_holds_the_newest_rows() -> None:
    wm, arrivals = next_watermark(
        previous_us=None, max_time_us=100 * S, bound_us=5 * S, ordered=False, idle_release=False, arrivals=[], now_us=0
    )
    assert wm == 95 * S
    assert arrivals == [[0, 100 * S]]


def test_idle_release_decides_what_was_seen_a_bound_ago_in_processing_time() -> None:
    common = {"bound_us": 5 * S, "ordered": False, "idle_release": True}
    wm, arrivals = next_watermark(previous_us=None, max_time_us=100 * S, arrivals=[], now_us=1_000 * S, **common)
    assert wm == 95 * S  # seen just now: held
    wm, arrivals = next_watermark(previous_us=wm, max_time_us=100 * S, arrivals=arrivals, now_us=1_004 * S, **common)
    assert wm == 95 * S  # 4 s later: still within the bound
    wm, arrivals = next_watermark(previous_us=wm, max_time_us=100 * S, arrivals=arrivals, now_us=1_005 * S, **common)
    assert wm == 100 * S + 1  # 5 s later: everything at or before 100 s is decided
    assert arrivals == [[1_004 * S, 100 * S]]  # only what is not yet due is remembered


def test_idle_release_off_waits_for_event_time() -> None:
    common = {"bound_us": 5 * S, "ordered": False, "idle_release": False}
    wm, arrivals = next_watermark(previous_us=None, max_time_us=100 * S, arrivals=[], now_us=0, **common)
    wm, _ = next_watermark(previous_us=wm, max_time_us=100 * S, arrivals=arrivals, now_us=3_600 * S, **common)
    assert wm == 95 * S


def test_ordered_input_holds_nothing_and_the_watermark_never_goes_back() -> None:
    common = {"bound_us": 0, "ordered": True, "idle_release": True, "arrivals": [], "now_us": 0}
    wm, arrivals = next_watermark(previous_us=None, max_time_us=100 * S, **common)
    assert (wm, arrivals) == (100 * S + 1, [])
    assert next_watermark(previous_us=wm, max_time_us=None, **common)[0] == wm
    assert next_watermark(previous_us=wm, max_time_us=50 * S, **common)[0] == wm


@pytest.mark.timeout(300)
def test_a_quiet_file_stream_outputs_everything_without_flush(spark: SparkSession, tmp_path: Path) -> None:
    """Rows all at one time, then nothing: event time never moves past them, processing time does."""
    source = tmp_path / "in"
    start = dt.datetime(2026, 11, 25, tzinfo=dt.UTC)
    rows = [(f"m{i % 40}", start + dt.timedelta(milliseconds=i), i) for i in range(50)]
    spark.createDataFrame(rows, "message_id STRING, enqueued_time TIMESTAMP, seq LONG").coalesce(1).write.parquet(
        str(source)
    )
    stream = spark.readStream.schema("message_id STRING, enqueued_time TIMESTAMP, seq LONG").parquet(str(source))
    query = deduplicate_stream(
        stream,
        "PT10M",
        state_path=str(tmp_path / "state"),
        output_path=str(tmp_path / "out"),
        max_out_of_order="PT2S",
        order_col="seq",
        trigger={"processingTime": "1 second"},
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert query.exception() is None, query.exception()
            done = list((tmp_path / "out").glob("batch_id=*/_SUCCESS")) if (tmp_path / "out").exists() else []
            got = [s for d in done for p in d.parent.glob("*.parquet") for s in pq.read_table(p)["seq"].to_pylist()]
            if len(got) >= 40:
                break
            assert time.monotonic() < deadline, f"{len(got)} of 40 rows out"
            time.sleep(0.5)
        assert sorted(got) == list(range(40))
        while True:  # the manifest of the batch that wrote the rows is written after its output
            manifests = [json.loads(p.read_text()) for p in sorted((tmp_path / "state" / "batches").glob("*.json"))]
            if manifests[-1]["counts"]["held"] == 0:
                break
            assert time.monotonic() < deadline, f"still held: {manifests[-1]['counts']}"
            time.sleep(0.5)
        assert manifests[0]["counts"]["held"] == 50  # the first batch held them all (event time stood still)
    finally:
        query.stop()
