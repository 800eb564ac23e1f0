"""deduplicate's arguments, edge rows and modes (small frames, real Spark)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from oncebus.core import QueueProperties
from oncebus.core.errors import ArgumentOutOfRangeError, InvalidArgumentError
from oncebus.core.keys import dedup_key
from oncebus.spark import EntitySettings, deduplicate
from oncebus.spark._keys import invalid_column, key_text_column

START = dt.datetime(2026, 11, 25, tzinfo=dt.UTC)


def _at(seconds: float) -> dt.datetime:
    return START + dt.timedelta(seconds=seconds)


def test_key_text_and_validity_agree_with_core(spark: SparkSession) -> None:
    cases = [
        ("a", None, None),
        ("a", "1", None),
        ("a", None, "s"),
        ("a", "s", "s"),
        ("a", "t", "s"),
        ("ünï-çødé", "分区", None),
        ("x" * 128, "p", None),
        ("x" * 129, None, None),
        ("a", "p" * 129, None),
        ("", None, None),
        ("12:3", "1", None),
        ("\U0001f600" * 64, None, None),  # 64 characters, 128 UTF-16 code units: the most Service Bus takes
        ("a" + "\U0001f600" * 64, None, None),  # 65 characters, 129 code units: refused as Service Bus does
        ("a", "\U0001f600" * 64 + "p", None),
        ("a", None, "s" + "\U0001f600" * 64),
    ]
    df = spark.createDataFrame(cases, "message_id string, partition_key string, session_id string")
    mid, pk, sid = F.col("message_id"), F.col("partition_key"), F.col("session_id")
    for partitioned in (False, True):
        rows = df.select(
            key_text_column(mid, pk, sid, F.lit(partitioned)).alias("key"),
            invalid_column(mid, pk, sid, F.lit(partitioned), F.lit(True)).alias("invalid"),
        ).collect()
        for (message_id, partition_key, session_id), row in zip(cases, rows, strict=True):
            try:
                expected = dedup_key(message_id, partition_key, session_id, partitioned=partitioned).text
            except InvalidArgumentError:
                assert row["invalid"], (message_id, partition_key, session_id)
            else:
                assert not row["invalid"]
                assert row["key"] == expected


def test_window_is_validated_like_the_broker(spark: SparkSession) -> None:
    df = spark.createDataFrame([("a", _at(0))], "message_id string, enqueued_time timestamp")
    with pytest.raises(ArgumentOutOfRangeError, match=r"between 00:00:20 and 7\.00:00:00"):
        deduplicate(df, "PT19S")
    with pytest.raises(InvalidArgumentError, match="not a valid duration"):
        deduplicate(df, "ten minutes")
    with pytest.raises(InvalidArgumentError, match="'msg_id' is not a column"):
        deduplicate(df, message_id_col="msg_id")


def test_edge_rows_and_columns(spark: SparkSession) -> None:
    rows = [
        ("a", _at(0), 1, "first"),
        ("a", _at(0), 0, "tie, lower order wins"),
        ("a", _at(20), 2, "exactly W later: new"),
        (None, _at(1), 3, "no message id: kept"),
        (None, _at(1), 4, "no message id again: kept"),
    ]
    df = spark.createDataFrame(rows, "message_id string, enqueued_time timestamp, seq long, body string")
    kept = deduplicate(df, dt.timedelta(seconds=20), order_col="seq")
    assert kept.columns == df.columns
    assert sorted(r["seq"] for r in kept.collect()) == [0, 2, 3, 4]
    as_micros = df.withColumn("enqueued_time", F.unix_micros("enqueued_time"))
    assert sorted(r["seq"] for r in deduplicate(as_micros, "PT20S", order_col="seq").collect()) == [0, 2, 3, 4]


def test_entity_settings_from_core_properties(spark: SparkSession) -> None:
    rows = [
        ("q1", "a", "1", _at(0)),
        ("q1", "a", "2", _at(1)),
        ("q2", "a", "1", _at(0)),
        ("q2", "a", "2", _at(1)),
        ("off", "a", None, _at(0)),
        ("off", "a", None, _at(1)),
    ]
    df = spark.createDataFrame(rows, "entity string, message_id string, partition_key string, enqueued_time timestamp")
    settings = {
        "q1": QueueProperties.create("q1", requires_duplicate_detection=True, enable_partitioning=True),
        "q2": {"duplicate_detection_history_time_window": "PT1M"},
        "off": EntitySettings(requires_duplicate_detection=False),
    }
    kept = deduplicate(df, entity_col="entity", entity_settings=settings)
    counts = {r["entity"]: r["count"] for r in kept.groupBy("entity").count().collect()}
    assert counts == {"q1": 2, "q2": 1, "off": 2}


def test_streaming_needs_deduplicate_stream_or_approximate(spark: SparkSession, tmp_path: Path) -> None:
    rows = [("a", _at(0), 0), ("a", _at(5), 1), ("b", _at(6), 2)]
    schema = "message_id string, enqueued_time timestamp, seq long"
    spark.createDataFrame(rows, schema).write.parquet(str(tmp_path / "in"))
    stream = spark.readStream.schema(schema).parquet(str(tmp_path / "in"))
    with pytest.raises(InvalidArgumentError, match="deduplicate_stream"):
        deduplicate(stream, "PT1M")
    approximate = deduplicate(stream, "PT1M", mode="approximate")
    query = (
        approximate.writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    kept = sorted(r["seq"] for r in spark.read.parquet(str(tmp_path / "out")).collect())
    # approximate: one copy of "a" survives, but whichever Spark met first, not necessarily the earliest
    assert kept in ([0, 2], [1, 2])
    with pytest.raises(InvalidArgumentError, match="streaming DataFrames"):
        deduplicate(spark.createDataFrame(rows, schema), mode="approximate")
