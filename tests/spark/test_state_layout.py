"""State directories written by earlier layouts (1: keys/ and held/; 2: b=N/__oncebus_role=1|3, keys joined as
DataFrames) are read and continued in place: their keys are moved into the buckets of layout 3."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from oncebus.spark.stream import LAYOUT, LAYOUT_JOINED
from tests.spark.test_exactness import core_kept_seqs
from tests.spark.trace_engine import trace_engine

DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize(
    ("earlier", "bucketed"),
    [("state-v1", True), ("state-v2", True), ("state-v1", False)],
    ids=["layout1-to-buckets", "layout2-to-buckets", "layout1-joined"],
)
def test_earlier_layout_state_is_continued_exactly(
    spark: SparkSession, tmp_path: Path, earlier: str, bucketed: bool
) -> None:
    """Continued in buckets; or (a state path Spark reaches only through Hadoop, forced here on a local
    path) with the keys joined as DataFrames, layout 2."""
    work = tmp_path / earlier
    shutil.copytree(DATA / earlier, work)
    before = json.loads((work / "state" / "batches" / "00000000000000000001.json").read_text())
    if earlier == "state-v1":
        assert "layout" not in before and before["key_folders"][0]["path"].startswith("keys/")
    else:
        assert before["layout"] == 2 and before["key_folders"][0]["path"].endswith("__oncebus_role=1")
    trace_path = str(work / "trace.parquet")
    df = spark.read.parquet(trace_path)
    engine = trace_engine(df, work)
    assert engine.bucketed
    engine.bucketed = bucketed
    layout = LAYOUT if bucketed else LAYOUT_JOINED
    for batch_id, (low, high) in enumerate([(3000, 4500), (4500, 6000)], start=2):
        manifest = engine.process(spark.read.parquet(trace_path).where(f"seq >= {low} and seq < {high}"), batch_id)
        assert manifest["layout"] == layout
        if bucketed:
            assert all(f["layout"] == LAYOUT for f in manifest["key_folders"])
        if batch_id == 2 and bucketed:  # the earlier keys moved into buckets, none dropped (windows not passed)
            assert manifest["key_folders"][0]["path"] == "c=2"
            assert manifest["key_folders"][0]["rows"] == sum(f["rows"] for f in before["key_folders"])
    engine.process(spark.read.parquet(trace_path).limit(0), 4, flush=True)
    got = [r["seq"] for r in spark.read.parquet(str(work / "out")).select("seq").collect()]
    assert len(got) == len(set(got))
    assert set(got) == core_kept_seqs(pq.read_table(trace_path))
    assert not (work / "state" / "held").exists() or not list((work / "state" / "held").iterdir())
    if bucketed:  # the earlier key folders moved into buckets are gone
        assert not (work / "state" / "keys").exists() or not list((work / "state" / "keys").iterdir())
        assert not list((work / "state").glob("*/__oncebus_role=*"))
