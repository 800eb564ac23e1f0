"""docs/spark-exactly-once.md's job, run as written against oncebus (issue 21).

The input repeats some events (an upstream resend), and the whole job runs a second time from a lost
checkpoint (every batch replayed): the ``payments`` queue, which has duplicate detection, still holds
each ``event_id`` once, because the sink sends each event with the same message id every time.
"""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusReceiveMode
from pyspark.sql import SparkSession

from tests.amqp.conftest import ServerProcess, topology

ROOT = Path(__file__).resolve().parents[2]


def doc_job_block() -> str:
    text = (ROOT / "docs" / "spark-exactly-once.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if 'format("oncebus")' in b]
    return block


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    dedup = {"RequiresDuplicateDetection": True, "DuplicateDetectionHistoryTimeWindow": "PT1H"}
    process = ServerProcess(tmp_path_factory.mktemp("eo") / "data", topology({"payments": dedup}, {})).start()
    yield process
    process.stop()


def drain(conn: str, queue: str) -> list[tuple[str, str, dict[str, Any]]]:
    got: list[tuple[str, str, dict[str, Any]]] = []
    with ServiceBusClient.from_connection_string(conn) as client:
        with client.get_queue_receiver(queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as receiver:
            while batch := receiver.receive_messages(max_message_count=200, max_wait_time=1):
                got += [(str(m.message_id), str(m.subject), json.loads(b"".join(m.body))) for m in batch]
    return got


@pytest.mark.timeout(300)
def test_the_documented_job_sends_each_event_once(spark: SparkSession, broker: ServerProcess, tmp_path: Path) -> None:
    block = doc_job_block()
    port = broker.connection_string.split("sb://127.0.0.1:", 1)[1].split(";", 1)[0]
    code = block.replace("127.0.0.1:5672", f"127.0.0.1:{port}").replace('"/tmp/', f'"{tmp_path}/')
    inputs = tmp_path / "payments-in"
    inputs.mkdir()
    events = [{"event_id": f"pay-{i}", "customer": f"c{i % 7}", "amount": float(i)} for i in range(300)]
    for part in range(3):  # three files; the third resends 50 events of the first
        chunk = events[part * 100 : part * 100 + 100] + (events[:50] if part == 2 else [])
        (inputs / f"part-{part}.json").write_text("\n".join(json.dumps(e) for e in chunk) + "\n")

    for run in range(2):
        namespace: dict[str, Any] = {"spark": spark}
        exec(compile(code, "docs/spark-exactly-once.md", "exec"), namespace)
        assert namespace["conn"] == broker.connection_string
        assert namespace["query"].exception() is None
        if run == 0:
            shutil.rmtree(tmp_path / "payments-checkpoint")  # lost: the second run sends everything again

    got = drain(broker.connection_string, "payments")
    counts = Counter(message_id for message_id, _, _ in got)
    assert set(counts) == {e["event_id"] for e in events}
    assert max(counts.values()) == 1, [m for m, n in counts.items() if n > 1][:5]
    by_id = {message_id: (subject, body) for message_id, subject, body in got}
    assert by_id["pay-8"] == ("c1", {"customer": "c1", "amount": 8.0})
