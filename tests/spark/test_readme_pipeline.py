"""docs/spark-pipeline.md's streaming pipeline, run as written, against a queue that gets one burst and then nothing.

Issue 12, item 5: every row used to wait in the out-of-order buffer for newer
traffic, so a quiet queue's output stayed empty. The oncebus source vouches
for the order of enqueued times, so nothing is held: the burst's survivors are
in the Parquet output within a few trigger intervals, with no later traffic.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from pyspark.sql import SparkSession

from tests.amqp.conftest import ServerProcess, topology
from tests.spark.queues import active_messages

ROOT = Path(__file__).resolve().parents[2]
TRIGGER_SECONDS = 10  # the page's trigger, checked below


def readme_stream_block() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "spark-pipeline.md").read_text(), flags=re.S)
    (block,) = [b for b in blocks if "deduplicate_stream(orders" in b]
    return block


def committed_rows(output: Path) -> list[dict[str, Any]]:
    """Rows of the committed output folders (a folder is committed once it has _SUCCESS)."""
    rows: list[dict[str, Any]] = []
    for done in sorted(output.glob("batch_id=*/_SUCCESS")) if output.exists() else []:
        for part in done.parent.glob("*.parquet"):
            try:
                rows += pq.read_table(part, columns=["message_id", "body"]).to_pylist()
            except (FileNotFoundError, OSError):
                return committed_rows(output)  # Spark replaced the folder while we read it; read again
    return rows


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(tmp_path_factory.mktemp("readme") / "data", topology({"orders": {}}, {})).start()
    yield process
    process.stop()


@pytest.mark.timeout(300)
def test_readme_pipeline_outputs_a_quiet_queues_burst(
    spark: SparkSession, broker: ServerProcess, tmp_path: Path
) -> None:
    block = readme_stream_block()
    assert f'"processingTime": "{TRIGGER_SECONDS} seconds"' in block
    port = broker.connection_string.split("sb://127.0.0.1:", 1)[1].split(";", 1)[0]
    code = block.replace("127.0.0.1:5672", f"127.0.0.1:{port}").replace('"/tmp/', f'"{tmp_path}/')
    namespace: dict[str, Any] = {"spark": spark}
    exec(compile(code, "docs/spark-pipeline.md", "exec"), namespace)
    assert namespace["conn"] == broker.connection_string
    query = namespace["query"]
    try:
        # one burst: 1,000 distinct ids, 100 of them sent twice (the queue has no duplicate detection)
        ids = [f"order-{i}" for i in range(1000)] + [f"order-{i}" for i in range(0, 1000, 10)]
        with ServiceBusClient.from_connection_string(broker.connection_string) as client:
            with client.get_queue_sender("orders") as sender:
                for start in range(0, len(ids), 100):
                    chunk = ids[start : start + 100]
                    sender.send_messages([ServiceBusMessage(f"body of {m}", message_id=m) for m in chunk])
        sent = time.monotonic()
        output = tmp_path / "orders-parquet"
        while len({r["message_id"] for r in committed_rows(output)}) < 1000:
            assert query.exception() is None, query.exception()
            waited = time.monotonic() - sent
            assert waited < 4 * TRIGGER_SECONDS, f"after {waited:.0f} s: {len(committed_rows(output))} rows out"
            time.sleep(0.5)
        written = time.monotonic()
        time.sleep(TRIGGER_SECONDS + 2)  # one more trigger: the resent copies must not show up later
        # and the queue drains: the last batch's messages are completed at the next trigger (issue 33, item 9)
        while (left := active_messages(broker, "orders")) != 0:
            assert query.isActive, query.exception()
            waited = time.monotonic() - written
            assert waited < 3 * TRIGGER_SECONDS, f"{left} messages still in the queue {waited:.0f} s after the output"
            time.sleep(0.5)
        counts = Counter(r["message_id"] for r in committed_rows(output))
        assert set(counts) == {f"order-{i}" for i in range(1000)}
        assert max(counts.values()) == 1
        manifests = [json.loads(p.read_text()) for p in sorted((tmp_path / "orders-dedup" / "batches").glob("*.json"))]
        assert all(m["ordered"] and m["counts"]["held"] == 0 for m in manifests)
    finally:
        query.stop()
