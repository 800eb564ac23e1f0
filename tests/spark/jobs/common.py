"""The local[2] SparkSession of the Spark tests: the suite's fixture and the job processes it starts and kills."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession


def local_session(name: str, driver_memory: str = "1g") -> SparkSession:
    """Settings measured for fast local tests (few shuffle partitions, no UI); the venv's Python on workers."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    session = (
        SparkSession.builder.master("local[2]")
        .appName(name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.memory", driver_memory)
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session
