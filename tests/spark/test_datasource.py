"""The oncebus data source against `oncebus serve` via the real SDK: exactly-once in, nothing lost out."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode
from pyspark.sql import SparkSession

from oncebus.spark._datasource import register
from tests.amqp.conftest import ServerProcess, topology

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    dedup = {"RequiresDuplicateDetection": True, "DuplicateDetectionHistoryTimeWindow": "PT1H"}
    queues = {"in": {**dedup, "LockDuration": "PT5S"}, "sunk": dedup, "ids": dedup}
    topics = {"out": (dedup, {"all": {}})}
    process = ServerProcess(tmp_path_factory.mktemp("ds") / "data", topology(queues, topics)).start()
    yield process
    process.stop()


def _drain(conn: str, entity: str, subscription: str | None = None) -> list[tuple[str, bytes]]:
    got: list[tuple[str, bytes]] = []
    with ServiceBusClient.from_connection_string(conn) as client:
        mode = ServiceBusReceiveMode.RECEIVE_AND_DELETE
        receiver = (
            client.get_subscription_receiver(entity, subscription, receive_mode=mode)
            if subscription
            else client.get_queue_receiver(entity, receive_mode=mode)
        )
        with receiver:
            while batch := receiver.receive_messages(max_message_count=200, max_wait_time=1):
                got += [(str(m.message_id), b"".join(m.body)) for m in batch]
    return got


def _job(module: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", f"tests.spark.jobs.{module}", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: the JVM and Python workers die together
    )


def _kill(job: subprocess.Popen[str]) -> None:
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()


def test_batch_write_is_exactly_once_across_reruns(spark: SparkSession, broker: ServerProcess) -> None:
    register(spark)
    df = spark.createDataFrame([(i, f"event {i}") for i in range(200)], "n LONG, body STRING")
    for _ in range(2):  # a re-run of the same job: same ids, dropped by the topic's duplicate detection
        df.write.format("oncebus").mode("append").option("connectionString", broker.connection_string).option(
            "topic", "out"
        ).save()
    got = _drain(broker.connection_string, "out", "all")
    assert sorted(body for _, body in got) == sorted(f"event {i}".encode() for i in range(200))
    assert len({mid for mid, _ in got}) == 200


def test_batch_write_uses_a_message_id_column(spark: SparkSession, broker: ServerProcess) -> None:
    register(spark)
    df = spark.createDataFrame([("a", "1"), ("b", "2"), ("a", "3")], "message_id STRING, body STRING").coalesce(1)
    df.write.format("oncebus").mode("append").option("connectionString", broker.connection_string).option(
        "queue", "ids"
    ).save()
    assert sorted(_drain(broker.connection_string, "ids")) == [("a", b"1"), ("b", b"2")]


def test_bad_options_are_named(spark: SparkSession) -> None:
    register(spark)
    with pytest.raises(Exception, match="connectionString"):
        spark.createDataFrame([(1,)], "n INT").write.format("oncebus").mode("append").option("queue", "q").save()


@pytest.mark.timeout(900)
def test_streaming_sink_killed_mid_batch_replays_without_duplicates(broker: ServerProcess, tmp_path: Path) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    for part in range(3):  # three files, one per micro-batch
        lines = "\n".join(json.dumps({"n": n}) for n in range(part * 100, part * 100 + 100))
        (inputs / f"part-{part}.json").write_text(lines + "\n")
    marker = tmp_path / "hung"
    args = (broker.connection_string, "sunk", str(inputs), str(tmp_path / "ckpt"), str(marker))
    first = _job("sink_job", *args)
    deadline = time.monotonic() + 300
    while not marker.exists():
        assert first.poll() is None, first.stdout.read() if first.stdout else ""
        assert time.monotonic() < deadline, "the sink job never reached row 150"
        time.sleep(0.2)
    time.sleep(1.0)  # the first 50-row chunk of that batch has been sent; the rest hangs
    _kill(first)
    second = _job("sink_job", *args)
    out, _ = second.communicate(timeout=300)
    assert "FINISHED" in out, out
    got = _drain(broker.connection_string, "sunk")
    counts = Counter(body for _, body in got)
    assert set(counts) == {f"row {n}".encode() for n in range(300)}
    assert max(counts.values()) == 1


@pytest.mark.timeout(900)
def test_streaming_source_killed_and_restarted_loses_nothing(broker: ServerProcess, tmp_path: Path) -> None:
    conn = broker.connection_string
    with ServiceBusClient.from_connection_string(conn) as client, client.get_queue_sender("in") as sender:
        for start in range(0, 300, 100):
            sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"m{i}") for i in range(start, start + 100)])
    state, output, stop = tmp_path / "state", tmp_path / "out", tmp_path / "stop"
    args = (conn, "in", str(state), str(output), str(stop))

    def kept() -> list[str]:
        """Message ids in the committed output folders (a folder is committed once it has _SUCCESS)."""
        ids: list[str] = []
        for done in output.glob("batch_id=*/_SUCCESS") if output.exists() else []:
            for part in done.parent.glob("*.parquet"):
                try:
                    ids += pq.read_table(part, columns=["message_id"]).column(0).to_pylist()
                except (FileNotFoundError, OSError):
                    return kept()  # Spark replaced the folder while we read it; read again
        return ids

    first = _job("source_job", *args)
    deadline = time.monotonic() + 300
    while len(kept()) < 80:
        assert first.poll() is None, first.stdout.read() if first.stdout else ""
        assert time.monotonic() < deadline, "the source job produced nothing"
        time.sleep(0.2)
    _kill(first)  # mid-stream: some batches committed, some messages locked and never completed
    second = _job("source_job", *args)
    deadline = time.monotonic() + 360
    while len(set(kept())) < 300:
        assert second.poll() is None, second.stdout.read() if second.stdout else ""
        assert time.monotonic() < deadline, f"only {len(set(kept()))} of 300 arrived"
        time.sleep(0.5)
    time.sleep(8)  # messages whose locks lapsed with the first job are delivered again: dedup drops them
    stop.write_text("stop")
    second.wait(120)
    counts = Counter(kept())
    assert set(counts) == {f"m{i}" for i in range(300)}
    assert max(counts.values()) == 1
