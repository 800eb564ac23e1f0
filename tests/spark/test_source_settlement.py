"""A quiet queue drains under the oncebus source (issue 33, item 9).

Spark calls a source's ``commit(end)`` only when it constructs the next micro-batch, and on a queue
that went quiet no next batch came: the messages of the stream's last micro-batch stayed locked (their
locks renewed) for as long as the query ran, active in the queue, and a stop delivered them again with
a raised delivery count. The source now asks for one more (empty) micro-batch when a batch it has run
still holds messages, so Spark commits it and the messages are completed within a trigger or two.

``Trigger.AvailableNow`` had the same defect in full: the source did not support it, so Spark ran a single
micro-batch whose messages were never completed and came back to every later run. It now reads the backlog
in micro-batches, settles the last one, and stops.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from pyspark.sql import SparkSession

from oncebus.spark import deduplicate_stream, register
from tests.amqp.conftest import ServerProcess, topology
from tests.spark.queues import active_messages

ROOT = Path(__file__).resolve().parents[2]
SETTLE_SECONDS = 10.0  # a 1 s trigger: the next trigger plus an empty micro-batch, with room on a loaded machine


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    queues = {"quiet": {}, "crash": {"LockDuration": "PT5S"}, "backlog": {}, "busy": {}}
    process = ServerProcess(tmp_path_factory.mktemp("settle") / "data", topology(queues, {})).start()
    yield process
    process.stop()


def _send(broker: ServerProcess, queue: str, ids: list[str]) -> None:
    with ServiceBusClient.from_connection_string(broker.connection_string) as client:
        with client.get_queue_sender(queue) as sender:
            for start in range(0, len(ids), 100):
                chunk = ids[start : start + 100]
                sender.send_messages([ServiceBusMessage(f"body of {m}", message_id=m) for m in chunk])


def _kept(output: Path) -> list[str]:
    """Message ids in the committed output folders (a folder is committed once it has _SUCCESS)."""
    ids: list[str] = []
    for done in sorted(output.glob("batch_id=*/_SUCCESS")) if output.exists() else []:
        for part in done.parent.glob("*.parquet"):
            try:
                ids += pq.read_table(part, columns=["message_id"]).column(0).to_pylist()
            except (FileNotFoundError, OSError):
                return _kept(output)  # Spark replaced the folder while we read it; read again
    return ids


def _wait_drained(broker: ServerProcess, queue: str, running: Callable[[], bool]) -> float:
    """Seconds until the queue has no active message; fails after SETTLE_SECONDS or if ``running()`` turns false."""
    start = time.monotonic()
    while (left := active_messages(broker, queue)) != 0:
        assert running(), "the stream stopped"
        waited = time.monotonic() - start
        assert waited < SETTLE_SECONDS, f"{left} messages still active {waited:.1f} s after their batch committed"
        time.sleep(0.3)
    return time.monotonic() - start


@pytest.mark.timeout(300)
def test_a_burst_then_silence_leaves_the_queue_empty(
    spark: SparkSession, broker: ServerProcess, tmp_path: Path
) -> None:
    register(spark)
    source = (
        spark.readStream.format("oncebus")
        .option("connectionString", broker.connection_string)
        .option("queue", "quiet")
        .option("receiveWaitSeconds", "0.5")
        .load()
    )
    state, output = tmp_path / "state", tmp_path / "out"
    query = deduplicate_stream(
        source, "PT10M", state_path=str(state), output_path=str(output), trigger={"processingTime": "1 second"}
    )
    try:
        ids = [f"order-{i}" for i in range(300)]
        _send(broker, "quiet", ids)  # one burst, then nothing
        deadline = time.monotonic() + 180
        while set(_kept(output)) != set(ids):
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline, f"{len(set(_kept(output)))} of {len(ids)} ids out"
            time.sleep(0.3)
        _wait_drained(broker, "quiet", lambda: query.isActive)
        # settled once: no endless empty micro-batches after it, the stream still runs, no id twice
        offsets = state / "_checkpoint" / "offsets"
        planned = len(list(offsets.iterdir()))
        time.sleep(3)  # three triggers of a quiet queue
        assert len(list(offsets.iterdir())) == planned
        assert query.isActive and query.exception() is None
        assert max(Counter(_kept(output)).values()) == 1
    finally:
        query.stop()
    assert active_messages(broker, "quiet") == 0  # the stop delivers nothing again


def _job(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.spark.jobs.source_job", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: the JVM and Python workers die together
    )


@pytest.mark.timeout(900)
def test_the_queue_drains_after_a_driver_crash_and_restart(broker: ServerProcess, tmp_path: Path) -> None:
    ids = [f"m{i}" for i in range(300)]
    _send(broker, "crash", ids)
    state, output, stop = tmp_path / "state", tmp_path / "out", tmp_path / "stop"
    args = (broker.connection_string, "crash", str(state), str(output), str(stop))
    first = _job(*args)  # 40 messages a micro-batch, a 1 s trigger
    try:
        deadline = time.monotonic() + 300
        while len(_kept(output)) < 80:
            assert first.poll() is None, first.stdout.read() if first.stdout else ""
            assert time.monotonic() < deadline, "the source job produced nothing"
            time.sleep(0.2)
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the driver dies mid-stream, its messages locked
        first.wait()
    relocked = time.monotonic() + 5  # the dead driver's locks (PT5S) have lapsed by then
    second = _job(*args)  # from the same checkpoint
    try:
        deadline = time.monotonic() + 360
        while set(_kept(output)) != set(ids):
            assert second.poll() is None, second.stdout.read() if second.stdout else ""
            assert time.monotonic() < deadline, f"only {len(set(_kept(output)))} of {len(ids)} arrived"
            time.sleep(0.3)
        # what the dead driver held comes back once its locks lapse: count from then, or from the output
        time.sleep(max(0.0, relocked - time.monotonic()))
        _wait_drained(broker, "crash", lambda: second.poll() is None)
        counts = Counter(_kept(output))
        assert set(counts) == set(ids) and max(counts.values()) == 1
    finally:
        stop.write_text("stop")
        try:
            second.wait(120)
        finally:
            if second.poll() is None:
                os.killpg(second.pid, signal.SIGKILL)
                second.wait()


def _available_now(spark: SparkSession, broker: ServerProcess, queue: str, work: Path) -> Any:
    """One ``availableNow`` run of the source into Parquet, 20 messages a micro-batch; the query, terminated."""
    register(spark)
    source = (
        spark.readStream.format("oncebus")
        .option("connectionString", broker.connection_string)
        .option("queue", queue)
        .option("maxMessagesPerBatch", "20")
        .option("receiveWaitSeconds", "0.5")
        .load()
    )
    query = (
        source.select("message_id")
        .writeStream.format("parquet")
        .option("path", str(work / "out"))
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(180), "the availableNow run did not stop"
    finally:
        query.stop()
    assert query.exception() is None, query.exception()
    return query


def _written(spark: SparkSession, work: Path) -> Counter[str]:
    return Counter(row["message_id"] for row in spark.read.parquet(str(work / "out")).collect())


@pytest.mark.timeout(600)
def test_an_available_now_run_reads_the_backlog_and_settles_it(
    spark: SparkSession, broker: ServerProcess, tmp_path: Path
) -> None:
    """The source did not support availableNow: Spark ran one micro-batch (20 of 50 messages) and stopped, and
    that batch's messages, never committed, came back to the next run: the queue never drained."""
    _send(broker, "backlog", [f"a{i}" for i in range(50)])
    query = _available_now(spark, broker, "backlog", tmp_path)
    assert [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]] == [20, 20, 10]
    assert active_messages(broker, "backlog") == 0
    _send(broker, "backlog", [f"b{i}" for i in range(10)])
    _available_now(spark, broker, "backlog", tmp_path)  # the next run, from the checkpoint
    assert active_messages(broker, "backlog") == 0
    written = _written(spark, tmp_path)
    assert set(written) == {f"a{i}" for i in range(50)} | {f"b{i}" for i in range(10)}
    assert max(written.values()) == 1


@pytest.mark.timeout(600)
def test_an_available_now_run_stops_while_senders_go_on(
    spark: SparkSession, broker: ServerProcess, tmp_path: Path
) -> None:
    """The run reads the backlog and stops at the messages sent after it began, though they keep coming: every
    round of receives finds one, so "until a receive finds nothing" alone would never end."""
    backlog = [f"s{i}" for i in range(200)]
    _send(broker, "busy", backlog)
    sent = list(backlog)
    stopping = threading.Event()

    def send() -> None:  # a trickle, a message every 50 ms: shorter than a receive's wait
        with ServiceBusClient.from_connection_string(broker.connection_string) as client:
            with client.get_queue_sender("busy") as sender:
                while not stopping.wait(0.05):
                    sender.send_messages(ServiceBusMessage("more", message_id=f"s{len(sent)}"))
                    sent.append(f"s{len(sent)}")

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        _available_now(spark, broker, "busy", tmp_path)
    finally:
        stopping.set()
        sender.join(30)
    written = _written(spark, tmp_path)
    assert len(written) >= 200 and max(written.values()) == 1
    assert set(written) <= set(sent)
    assert active_messages(broker, "busy") == len(sent) - len(written)  # what it read, it completed
