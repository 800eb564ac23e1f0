"""Queue -> oncebus source -> exact streaming dedup -> Parquet. Run until killed or until STOP_FILE appears.

python -m tests.spark.jobs.source_job CONNECTION_STRING QUEUE STATE_PATH OUTPUT_PATH STOP_FILE
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from oncebus.spark import deduplicate_stream
from oncebus.spark._datasource import register
from tests.spark.jobs.common import local_session


def main() -> None:
    conn, queue, state_path, output_path, stop_file = sys.argv[1:]
    spark = local_session("oncebus-source-job")
    register(spark)
    source = (
        spark.readStream.format("oncebus")
        .option("connectionString", conn)
        .option("queue", queue)
        .option("maxMessagesPerBatch", "40")
        .option("receiveWaitSeconds", "0.5")
        .load()
    )
    query = deduplicate_stream(
        source,
        "PT10M",
        state_path=state_path,
        output_path=output_path,
        trigger={"processingTime": "1 second"},
    )
    print("STARTED", flush=True)
    while not Path(stop_file).exists() and query.isActive:
        time.sleep(0.2)
    query.stop()
    spark.stop()


if __name__ == "__main__":
    main()
