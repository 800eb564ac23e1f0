"""The same API through Spark Connect (issue 12, item 2): a Connect server started from the installed
pyspark on a free port; the checks run in a client process of their own (``jobs/connect_job.py``: a
process that holds the suite's classic session cannot open a remote one). The data source registers and
runs through Connect; ``deduplicate`` and ``deduplicate_stream`` give the core's survivors."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.amqp.conftest import ServerProcess, topology
from tests.spark.servers import ConnectServer, spark_env

pytestmark = [pytest.mark.connect, pytest.mark.timeout(600)]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    started = ConnectServer(tmp_path_factory.mktemp("connect")).start()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    dedup = {"RequiresDuplicateDetection": True, "DuplicateDetectionHistoryTimeWindow": "PT1H"}
    config = topology({"orders": {}}, {"events": (dedup, {"all": {}})})
    process = ServerProcess(tmp_path_factory.mktemp("connect-broker") / "data", config).start()
    yield process
    process.stop()


def _check(server: ConnectServer, check: str, work: Path, *extra: str) -> None:
    env = spark_env(work)
    result = subprocess.run(
        [sys.executable, "-m", "tests.spark.jobs.connect_job", server.url, check, str(work), *extra],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert result.returncode == 0 and result.stdout.strip().endswith("OK"), result.stdout + result.stderr[-6000:]


def test_batch_and_streaming_dedup_equal_the_core(server: ConnectServer, tmp_path: Path) -> None:
    _check(server, "dedup", tmp_path)


def test_the_data_source_reads_and_writes_through_connect(
    server: ConnectServer, broker: ServerProcess, tmp_path: Path
) -> None:
    _check(server, "data_source", tmp_path, broker.connection_string)
