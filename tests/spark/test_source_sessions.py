"""The oncebus source on session-enabled queues and subscriptions (issue 12, item 6): any available
session or named ones, one partition per session, messages settled only after Spark commits."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode
from pyspark.sql import SparkSession

from oncebus.spark import deduplicate_stream, register
from tests.amqp.conftest import ServerProcess, topology

SESSIONS = ("a", "b", "c")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    config = topology({"sq": {"RequiresSession": True}}, {"st": ({}, {"sub": {"RequiresSession": True}})})
    process = ServerProcess(tmp_path_factory.mktemp("sessions") / "data", config).start()
    yield process
    process.stop()


def _messages() -> list[ServiceBusMessage]:
    ids = [f"m{i}" for i in range(90)] + [f"m{i}" for i in range(0, 90, 9)]  # 10 resent
    return [ServiceBusMessage(f"body {m}", message_id=m, session_id=SESSIONS[int(m[1:]) % 3]) for m in ids]


def _committed(output: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for done in sorted(output.glob("batch_id=*/_SUCCESS")) if output.exists() else []:
        for part in done.parent.glob("*.parquet"):
            rows += pq.read_table(part, columns=["message_id", "session_id"]).to_pylist()
    return rows


def _run(
    spark: SparkSession, options: dict[str, str], tmp_path: Path, expected: set[str]
) -> tuple[Counter[str], list[Any]]:
    """The kept rows' message ids, counted, and the query's progress reports."""
    register(spark)
    reader = spark.readStream.format("oncebus")
    for key, value in options.items():
        reader = reader.option(key, value)
    output = tmp_path / "out"
    query = deduplicate_stream(
        reader.load(),
        "PT10M",
        state_path=str(tmp_path / "state"),
        output_path=str(output),
        trigger={"processingTime": "1 second"},
    )
    try:
        deadline = time.monotonic() + 180
        while {r["message_id"] for r in _committed(output)} != expected:
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline, sorted({r["message_id"] for r in _committed(output)} ^ expected)
            time.sleep(0.5)
        # two later micro-batches: the source's commit of the last one with rows (Spark calls it when
        # the next batch starts) has settled its messages
        last = max(int(p.parent.name.split("=")[1]) for p in output.glob("batch_id=*/_SUCCESS"))
        while max((p["batchId"] for p in query.recentProgress), default=-1) < last + 2:
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline + 120, "no later micro-batch ran"
            time.sleep(0.5)
    finally:
        progress = query.recentProgress
        query.stop()
    return Counter(r["message_id"] for r in _committed(output)), progress


def _left(conn: str, entity: str, subscription: str | None = None) -> list[str]:
    """Message ids still in the entity, in any of the sessions the tests send to. Each session is named:
    asking for the next available session when none is left waits for the broker's timeout (20 s and
    more) instead of the 2 s a named one takes."""
    left: list[str] = []
    with ServiceBusClient.from_connection_string(conn) as client:
        for session_id in SESSIONS:
            kwargs: dict[str, Any] = {
                "session_id": session_id,
                "max_wait_time": 2,
                "receive_mode": ServiceBusReceiveMode.RECEIVE_AND_DELETE,
            }
            receiver = (
                client.get_subscription_receiver(entity, subscription, **kwargs)
                if subscription
                else client.get_queue_receiver(entity, **kwargs)
            )
            with receiver:
                left += [str(m.message_id) for m in receiver]
    return left


def test_any_available_session_of_a_queue(spark: SparkSession, broker: ServerProcess, tmp_path: Path) -> None:
    conn = broker.connection_string
    with ServiceBusClient.from_connection_string(conn) as client, client.get_queue_sender("sq") as sender:
        sender.send_messages(_messages())
    options = {"connectionString": conn, "queue": "sq", "sessions": "*", "maxSessions": "2"}  # 3 sessions, 2 at a time
    counts, progress = _run(spark, options, tmp_path, {f"m{i}" for i in range(90)})
    assert max(counts.values()) == 1
    assert _left(conn, "sq") == []  # every message settled once its batch was committed
    # fewer sessions available than maxSessions: accepting one waits for the broker's timeout (about 20 s),
    # in the background; a micro-batch does not wait for it
    planning = [p["durationMs"].get("latestOffset", 0) for p in progress]
    assert max(planning) < 10_000, planning


def test_named_sessions_of_a_subscription(spark: SparkSession, broker: ServerProcess, tmp_path: Path) -> None:
    conn = broker.connection_string
    with ServiceBusClient.from_connection_string(conn) as client, client.get_topic_sender("st") as sender:
        sender.send_messages(_messages())
    options = {"connectionString": conn, "topic": "st", "subscription": "sub", "sessions": "a, b"}
    counts, _ = _run(spark, options, tmp_path, {f"m{i}" for i in range(90) if i % 3 != 2})
    assert max(counts.values()) == 1
    left = _left(conn, "st", "sub")
    assert sorted(left) == sorted(str(m.message_id) for m in _messages() if m.session_id == "c")


def test_sessions_option_is_validated(spark: SparkSession) -> None:
    register(spark)
    df = spark.readStream.format("oncebus").option("connectionString", "Endpoint=sb://x").option("queue", "q")
    with pytest.raises(Exception, match="option 'sessions' must be"):
        df.option("sessions", "*,a").load().writeStream.format("noop").start().awaitTermination(30)
