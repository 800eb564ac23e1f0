"""JSON files -> oncebus sink (a queue). The first run hangs inside a micro-batch after part of it was sent.

    python -m tests.spark.jobs.sink_job CONNECTION_STRING QUEUE INPUT_DIR CHECKPOINT HANG_MARKER

A UDF blocks at row 150 of the input the first time it runs (it leaves HANG_MARKER);
the test then kills the process, and the restarted run replays that batch.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from pyspark.sql import functions as F
from pyspark.sql import types as T

from oncebus.spark._datasource import register
from tests.spark.jobs.common import local_session


def main() -> None:
    conn, queue, input_dir, checkpoint, marker = sys.argv[1:]
    spark = local_session("oncebus-sink-job")
    register(spark)

    @F.udf(T.LongType())
    def hang_once(value: int) -> int:
        if value == 150 and not os.path.exists(marker):
            Path(marker).write_text("hung")
            time.sleep(3600)
        return value

    rows = (
        spark.readStream.schema("n LONG")
        .option("maxFilesPerTrigger", 1)
        .json(input_dir)
        .select(hang_once("n").alias("n"))
        .select(F.col("n"), F.concat(F.lit("row "), F.col("n").cast("string")).alias("body"))
    )
    query = (
        rows.coalesce(1)
        .writeStream.format("oncebus")
        .option("connectionString", conn)
        .option("queue", queue)
        .option("sendBatchSize", "50")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    print("FINISHED", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
