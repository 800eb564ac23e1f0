"""``deduplicate_stream`` stopped in the middle of a micro-batch; prints how the stop went.

    python -m tests.spark.jobs.stop_job WORK_DIR

The query's ``foreach_batch`` starts a Spark job that runs until it is cancelled; once that job runs,
the main thread calls ``query.stop()``. The test reads this process's stderr, where the JVM writes.
"""

from __future__ import annotations

import datetime as dt
import sys
import threading
import time
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from oncebus.spark import deduplicate_stream
from tests.spark.jobs.common import local_session


def main() -> None:
    work = Path(sys.argv[1])
    spark = local_session("oncebus-stop-job")
    start = dt.datetime(2026, 11, 25, tzinfo=dt.UTC)
    rows = [(f"m{i % 40}", start + dt.timedelta(milliseconds=i), i) for i in range(100)]
    schema = "message_id STRING, enqueued_time TIMESTAMP, seq LONG"
    spark.createDataFrame(rows, schema).coalesce(1).write.parquet(str(work / "in"))
    inside = threading.Event()

    def slow_sink(batch: DataFrame, batch_id: int) -> None:
        inside.set()  # foreachBatch runs in this (the driver's) Python process
        batch.sparkSession.range(0, 1 << 42, 1, 2).agg(F.max(F.col("id") % 7)).collect()  # runs until cancelled

    query = deduplicate_stream(
        spark.readStream.schema(schema).parquet(str(work / "in")),
        "PT10M",
        state_path=str(work / "state"),
        foreach_batch=slow_sink,
        max_out_of_order="PT0S",
        order_col="seq",
        trigger={"processingTime": "1 second"},
    )
    assert inside.wait(120), "the micro-batch never reached the sink"
    time.sleep(1.0)  # the sink's job is running
    began = time.monotonic()
    query.stop()
    print(f"STOPPED in {time.monotonic() - began:.1f} s; exception: {query.exception()}", flush=True)
    time.sleep(1.0)  # let the JVM print whatever the stream thread left behind
    spark.stop()
    print("FINISHED", flush=True)


if __name__ == "__main__":
    main()
