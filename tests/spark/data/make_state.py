"""How tests/spark/data/state-v1 and state-v2 were made: streaming state folders of earlier layouts.

Run with the source tree of the release that wrote the layout first on the path:
    PYTHONPATH=<checkout of 191e9ee^>/src python tests/spark/data/make_state.py OUT_DIR   # state-v1: keys/, held/
    PYTHONPATH=<checkout of 13aef5b>/src python tests/spark/data/make_state.py OUT_DIR   # state-v2: b=N/__oncebus_role
It decides the first 3,000 rows of a generated trace (seed 21) as batches 0 and 1, and keeps the trace,
the state and the output; tests/spark/test_state_layout.py continues from there with this release.
"""

import os
import shutil
import sys
from datetime import timedelta
from pathlib import Path

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
import oncebus.spark._stream as st
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from tests.spark.traces import DEFAULT_ENTITIES, generate_trace

from oncebus.spark import EntitySettings

out = Path(sys.argv[1])
shutil.rmtree(out, ignore_errors=True)
out.mkdir(parents=True)
spark = (
    SparkSession.builder.master("local[2]")
    .config("spark.ui.enabled", "false")
    .config("spark.sql.shuffle.partitions", "2")
    .config("spark.sql.session.timeZone", "UTC")
    .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    .getOrCreate()
)
SETTINGS = {
    e.name: EntitySettings(window=timedelta(microseconds=e.window_us), partitioned=e.partitioned)
    for e in DEFAULT_ENTITIES
}
trace = generate_trace(6000, rate=500, max_out_of_order_us=2_000_000, seed=21)
pq.write_table(trace, out / "trace.parquet")
df = spark.read.parquet(str(out / "trace.parquet"))
engine = st._Engine(
    df,
    window="PT10M",
    partitioned=False,
    state_path=str(out / "state"),
    output_path=str(out / "out"),
    foreach_batch=None,
    max_out_of_order=timedelta(seconds=2),
    message_id_col="message_id",
    partition_key_col="partition_key",
    session_id_col="session_id",
    time_col="enqueued_time",
    entity_col="entity",
    entity_settings=SETTINGS,
    order_col="seq",
    on_invalid="drop",
)
for b in range(2):
    part = spark.read.parquet(str(out / "trace.parquet")).where(f"seq >= {b * 1500} and seq < {(b + 1) * 1500}")
    m = engine.process(part, b)
    print(m["counts"])
spark.stop()
