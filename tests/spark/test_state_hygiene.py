"""State stays proportional to the keys inside the window: old key folders are merged, expired keys
dropped, unlisted folders deleted; ``state_report`` tells size and age without changing anything."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from oncebus.spark import state_report
from oncebus.spark.stream import bucketed as _bucketed
from oncebus.spark.stream import state as _state
from tests.spark.test_exactness import core_kept_seqs
from tests.spark.trace_engine import trace_engine
from tests.spark.traces import generate_trace


def test_compaction_keeps_the_result_exact_and_the_state_small(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_state, "COMPACT_AT", 3)
    monkeypatch.setattr(_state, "KEEP_RECENT", 1)
    # 150 s of sends at 200/s: the 20 s and 60 s windows pass several times over
    trace = generate_trace(30_000, rate=200, max_out_of_order_us=2_000_000, seed=17)
    pq.write_table(trace, tmp_path / "trace.parquet")
    path = str(tmp_path / "trace.parquet")
    state = tmp_path / "state"
    engine = trace_engine(spark.read.parquet(path), tmp_path)
    step = 2_500
    folders_on_disk = []
    for batch_id in range(len(trace) // step):
        rows = spark.read.parquet(path).where(f"seq >= {batch_id * step} and seq < {(batch_id + 1) * step}")
        manifest = engine.process(rows, batch_id)
        folders_on_disk.append(len([p for p in state.iterdir() if p.name.startswith(("b=", "c="))]))
        assert len(manifest["key_folders"]) <= 3 + 1  # COMPACT_AT, and this batch's
    engine.process(spark.read.parquet(path).limit(0), len(trace) // step, flush=True)

    got = [r["seq"] for r in spark.read.parquet(str(tmp_path / "out")).select("seq").collect()]
    assert len(got) == len(set(got))
    assert set(got) == core_kept_seqs(trace)

    manifests = [json.loads(p.read_text()) for p in sorted((state / "batches").glob("*.json"))]
    assert any(f["path"].startswith("c=") for m in manifests for f in m["key_folders"])
    assert max(folders_on_disk) <= 7  # never one folder per batch
    # keys held stay near the keys inside the window (60 s at 200/s is 12,000 sends)
    assert max(m["keys_held"] for m in manifests) < 20_000

    report = state_report(str(state))
    assert report["batch_id"] == len(trace) // step
    assert report["keys_held"] == manifests[-1]["keys_held"]
    assert report["bytes"] > 0 and report["key_folders"] == len(manifests[-1]["key_folders"])
    assert state_report(str(state)) == report  # reporting changes nothing


def test_an_order_column_arrow_cannot_sort_like_spark_is_sorted_by_spark(spark: SparkSession, tmp_path: Path) -> None:
    """A float tie-break (NaN and -0.0 order differently in Arrow): Spark sorts and brings the held rows."""
    trace = generate_trace(9_000, rate=500, max_out_of_order_us=2_000_000, seed=23)
    pq.write_table(trace, tmp_path / "trace.parquet")
    path = str(tmp_path / "trace.parquet")
    frame = spark.read.parquet(path).withColumn("rank", F.col("seq").cast("double"))
    engine = trace_engine(frame, tmp_path, order_col="rank")
    assert engine.bucketed and not _bucketed._sorts_like_spark(engine)
    for batch_id in range(3):
        rows = frame.where(f"seq >= {batch_id * 3000} and seq < {(batch_id + 1) * 3000}")
        manifest = engine.process(rows, batch_id)
        assert manifest["layout"] == 3 and manifest["counts"]["held"] > 0
    engine.process(frame.limit(0), 3, flush=True)
    got = [r["seq"] for r in spark.read.parquet(str(tmp_path / "out")).select("seq").collect()]
    assert len(got) == len(set(got))
    assert set(got) == core_kept_seqs(trace)
