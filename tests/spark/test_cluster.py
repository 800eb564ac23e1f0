"""The pipeline on a real Spark standalone cluster (issue 12, item 1): a master and two 1-core workers
started from the installed pyspark, the venv's Python on the workers, state and checkpoints on a path
every worker reaches. One executor is killed (its JVM, by pid) in the middle of a micro-batch: Spark
retries its tasks and the results stay exactly-once."""

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
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from tests.amqp.conftest import ServerProcess, topology
from tests.spark.servers import StandaloneCluster, is_executor, spark_env
from tests.spark.test_exactness import core_kept_seqs
from tests.spark.traces import generate_trace

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    started = StandaloneCluster(tmp_path_factory.mktemp("cluster"), workers=2, worker_memory="1g").start()
    try:
        started.wait_registered()
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    queues = {
        "in": {"LockDuration": "PT30S"},  # no duplicate detection: the copies reach the pipeline
        "out": {"RequiresDuplicateDetection": True, "DuplicateDetectionHistoryTimeWindow": "PT1H"},
    }
    process = ServerProcess(tmp_path_factory.mktemp("cluster-broker") / "data", topology(queues, {})).start()
    yield process
    process.stop()


def _executor_of(pid: int) -> int:
    """The executor JVM (CoarseGrainedExecutorBackend) that ``pid`` descends from."""
    current = pid
    while current > 1:
        if is_executor(current):
            return current
        current = int(Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()[1])
    raise AssertionError(f"process {pid} does not descend from an executor")


def _committed(output: Path) -> list[str]:
    ids: list[str] = []
    for done in sorted(output.glob("batch_id=*/_SUCCESS")) if output.exists() else []:
        for part in done.parent.glob("*.parquet"):
            ids += pq.read_table(part, columns=["message_id"]).column(0).to_pylist()
    return ids


def test_pipeline_on_a_cluster_survives_a_killed_executor(
    cluster: StandaloneCluster, broker: ServerProcess, tmp_path: Path
) -> None:
    conn = broker.connection_string
    ids = [f"m{i}" for i in range(300)] + [f"m{i}" for i in range(0, 300, 5)]
    with ServiceBusClient.from_connection_string(conn) as client, client.get_queue_sender("in") as sender:
        for start in range(0, len(ids), 100):
            sender.send_messages([ServiceBusMessage(f"body {m[1:]}", message_id=m) for m in ids[start : start + 100]])

    env = spark_env(tmp_path)
    job = subprocess.Popen(
        [sys.executable, "-m", "tests.spark.jobs.cluster_job", cluster.url, str(tmp_path), conn],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    try:
        assert job.stdout is not None
        for line in job.stdout:
            lines.append(line.rstrip())
            if line.startswith("STARTED"):
                break
        else:
            raise AssertionError("\n".join(lines[-60:]))
        expected = core_kept_seqs(generate_trace(20_000, rate=2_000, max_out_of_order_us=2_000_000, seed=13))
        results = {
            line.split(" ", 1)[0]: json.loads(line.split(" ", 1)[1])
            for line in lines
            if line[:6] in ("BATCH ", "STREAM")
        }
        assert set(results["BATCH"]) == expected and len(results["BATCH"]) == len(expected)
        assert set(results["STREAM"]) == expected and len(results["STREAM"]) == len(expected)

        marker = tmp_path / "hung"
        deadline = time.monotonic() + 300
        while not marker.exists():
            assert job.poll() is None, "\n".join(lines[-60:])
            assert time.monotonic() < deadline, "the sink never reached row 150"
            time.sleep(0.2)
        time.sleep(1.0)  # the sink has sent its first chunks of that partition; the rest waits
        executor = _executor_of(int(marker.read_text()))
        assert executor in cluster.executor_pids()
        os.kill(executor, signal.SIGKILL)

        output = tmp_path / "queue-out"
        deadline = time.monotonic() + 300
        while len(set(_committed(output))) < 300:
            assert job.poll() is None, "\n".join(lines[-60:])
            assert time.monotonic() < deadline, f"only {len(set(_committed(output)))} of 300 in the output"
            time.sleep(0.5)
        deadline = time.monotonic() + 120  # the master gave the app a new executor in place of the killed one
        while not [pid for pid in cluster.executor_pids() if pid != executor]:
            assert time.monotonic() < deadline, "no executor replaced the killed one"
            time.sleep(0.5)
        assert executor not in cluster.executor_pids()
        time.sleep(3)  # a few more micro-batches: nothing more may come out
        (tmp_path / "stop").write_text("stop")
        out, _ = job.communicate(timeout=180)
        lines += out.splitlines()
        assert any(line == "FINISHED None" for line in lines), "\n".join(lines[-60:])
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()

    counts = Counter(_committed(tmp_path / "queue-out"))
    assert set(counts) == {f"m{i}" for i in range(300)}
    assert max(counts.values()) == 1
    # What the queue holds, from the server, before anything reads it: a message lost in the broker shows here,
    # apart from a receiver that gave up early (a receive-and-delete iterator with an idle wait read fewer than
    # 300 once under load, and could not say which)
    assert _active_messages(broker, "out") == 300
    sent: Counter[str] = Counter()
    deadline = time.monotonic() + 120
    with ServiceBusClient.from_connection_string(conn) as client, client.get_queue_receiver("out") as receiver:
        while sum(sent.values()) < 300 and time.monotonic() < deadline:
            for message in receiver.receive_messages(max_message_count=100, max_wait_time=5):
                sent[str(message.message_id)] += 1
                receiver.complete_message(message)
    assert set(sent) == {f"m{i}" for i in range(300)}
    assert max(sent.values()) == 1
    assert _active_messages(broker, "out") == 0


def _active_messages(broker: ServerProcess, queue: str) -> int:
    """The queue's active message count as the running server reports it (oncebus stats)."""
    cli = [sys.executable, "-c", "import sys; from oncebus.cli import main; sys.exit(main())"]
    cli += ["--data-dir", str(broker.data_dir), "stats", queue, "--json"]
    done = subprocess.run(cli, capture_output=True, text=True, timeout=60, check=True)
    return int(json.loads(done.stdout)[0]["active_message_count"])
