"""The pipeline on a standalone cluster (its own driver process: one SparkContext per process).

    python -m tests.spark.jobs.cluster_job MASTER_URL WORK_DIR CONNECTION_STRING

1. ``deduplicate`` of a generated trace on the cluster: prints ``BATCH <kept seqs json>``.
2. ``deduplicate_stream`` of the same trace as files (state and checkpoint under WORK_DIR, which every
   worker reaches): prints ``STREAM <kept seqs json>``.
3. The ``oncebus`` source (queue ``in``) -> ``deduplicate_stream`` -> Parquet and, in ``foreach_batch``,
   the ``oncebus`` sink (queue ``out``). The sink's first attempt at row 150 writes WORK_DIR/hung (its
   pid) and hangs, so the test can kill that executor mid micro-batch; the retry does not hang.
   Runs until WORK_DIR/stop appears, then prints ``FINISHED``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from oncebus.spark import EntitySettings, deduplicate, deduplicate_stream, flush_stream, register
from tests.spark.traces import DEFAULT_ENTITIES, generate_trace, write_parts

SETTINGS = {
    e.name: EntitySettings(window=timedelta(microseconds=e.window_us), partitioned=e.partitioned)
    for e in DEFAULT_ENTITIES
}
OPTIONS = {"entity_col": "entity", "entity_settings": SETTINGS, "order_col": "seq"}


def cluster_session(master: str, work: Path) -> SparkSession:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master(master)
        .appName("oncebus-cluster-job")
        .config("spark.executor.memory", "512m")
        .config("spark.executor.cores", "1")
        .config("spark.cores.max", "2")
        .config("spark.driver.memory", "768m")
        .config("spark.task.maxFailures", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.local.dir", str(work / "driver-local"))
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


def seqs(df: DataFrame) -> list[int]:
    return sorted(int(r["seq"]) for r in df.select("seq").collect())


def main() -> None:
    master, work_dir, conn = sys.argv[1:]
    work = Path(work_dir)
    spark = cluster_session(master, work)
    register(spark)

    trace = generate_trace(20_000, rate=2_000, max_out_of_order_us=2_000_000, seed=13)
    source = work / "trace"
    source.mkdir(parents=True, exist_ok=True)
    write_parts(trace, source, 5_000)  # one part per micro-batch, in order
    print("BATCH " + json.dumps(seqs(deduplicate(spark.read.parquet(str(source)), **OPTIONS))), flush=True)

    schema = spark.read.parquet(str(source)).schema
    stream = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(source))
    paths = {"state_path": str(work / "trace-state"), "output_path": str(work / "trace-out")}
    query = deduplicate_stream(stream, max_out_of_order="PT2S", trigger={"availableNow": True}, **OPTIONS, **paths)
    query.awaitTermination()
    flush_stream(stream, **OPTIONS, **paths)
    print("STREAM " + json.dumps(seqs(spark.read.parquet(paths["output_path"]))), flush=True)

    marker = str(work / "hung")

    @F.udf(T.StringType())
    def hang_once(body: str) -> str:
        if body == "body 150" and not os.path.exists(marker):
            Path(marker).write_text(str(os.getpid()))
            time.sleep(600)
        return body

    def to_queue(kept: DataFrame, batch_id: int) -> None:
        rows = kept.select("message_id", hang_once(F.col("body").cast("string")).alias("body"))
        (
            rows.write.format("oncebus")
            .mode("append")
            .option("connectionString", conn)
            .option("queue", "out")
            .option("sendBatchSize", "20")
            .save()
        )

    orders = (
        spark.readStream.format("oncebus")
        .option("connectionString", conn)
        .option("queue", "in")
        .option("maxMessagesPerBatch", "400")
        .load()
    )
    query = deduplicate_stream(
        orders,
        "PT10M",
        state_path=str(work / "queue-state"),
        output_path=str(work / "queue-out"),
        foreach_batch=to_queue,
        trigger={"processingTime": "1 second"},
    )
    print("STARTED", flush=True)
    while not (work / "stop").exists() and query.isActive:
        time.sleep(0.2)
    error = query.exception()
    query.stop()
    print(f"FINISHED {error}", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
