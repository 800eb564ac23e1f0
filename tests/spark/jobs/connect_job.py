"""Checks run from a Spark Connect client session (its own process: a process with a classic session
cannot open a remote one).

    python -m tests.spark.jobs.connect_job sc://127.0.0.1:PORT CHECK WORK_DIR [CONNECTION_STRING]

CHECK is ``dedup`` (deduplicate and deduplicate_stream give the core's survivors) or ``data_source``
(the oncebus format registers and runs through Connect: sink to a topic twice, source -> dedup -> Parquet).
Prints ``OK`` when every assertion held.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode
from pyspark.sql import SparkSession

from oncebus.spark import EntitySettings, deduplicate, deduplicate_stream, flush_stream, register
from tests.spark.test_exactness import core_kept_seqs
from tests.spark.traces import DEFAULT_ENTITIES, generate_trace, write_parts

SETTINGS = {
    e.name: EntitySettings(window=timedelta(microseconds=e.window_us), partitioned=e.partitioned)
    for e in DEFAULT_ENTITIES
}


def _committed(output: Path, columns: list[str]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for done in sorted(output.glob("batch_id=*/_SUCCESS")) if output.exists() else []:
        for part in done.parent.glob("*.parquet"):
            rows += pq.read_table(part, columns=columns).to_pylist()
    return rows


def check_dedup(remote: SparkSession, tmp_path: Path, conn: str) -> None:
    trace = generate_trace(20_000, rate=2_000, max_out_of_order_us=2_000_000, seed=9)
    source = tmp_path / "in"
    source.mkdir()
    write_parts(trace, source, 5_000)  # one part per micro-batch, in order
    expected = core_kept_seqs(trace)
    options: dict[str, Any] = {"entity_col": "entity", "entity_settings": SETTINGS, "order_col": "seq"}

    kept = deduplicate(remote.read.parquet(str(source)), **options)
    assert sorted(r["seq"] for r in kept.select("seq").collect()) == sorted(expected)

    schema = remote.read.parquet(str(source)).schema
    stream = remote.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(source))
    paths = {"state_path": str(tmp_path / "state"), "output_path": str(tmp_path / "out")}
    query = deduplicate_stream(stream, max_out_of_order="PT2S", trigger={"availableNow": True}, **options, **paths)
    query.awaitTermination()
    assert query.exception() is None
    flush_stream(stream, **options, **paths)
    got = [r["seq"] for r in _committed(tmp_path / "out", ["seq"])]
    assert len(got) == len(set(got))
    assert set(got) == expected


def check_data_source(remote: SparkSession, tmp_path: Path, conn: str) -> None:
    register(remote)
    events = remote.createDataFrame([(f"e{i}", f"event {i}") for i in range(50)], "event_id STRING, body STRING")
    for _ in range(2):  # a re-run sends the same ids; the topic drops them
        (
            events.write.format("oncebus")
            .mode("append")
            .option("connectionString", conn)
            .option("topic", "events")
            .option("messageIdColumn", "event_id")
            .save()
        )
    with ServiceBusClient.from_connection_string(conn) as client:
        mode = ServiceBusReceiveMode.RECEIVE_AND_DELETE
        with client.get_subscription_receiver("events", "all", max_wait_time=2, receive_mode=mode) as receiver:
            got = [str(m.message_id) for m in receiver]
    assert sorted(got) == sorted(f"e{i}" for i in range(50))

    ids = [f"o{i}" for i in range(200)] + [f"o{i}" for i in range(0, 200, 4)]
    with ServiceBusClient.from_connection_string(conn) as client, client.get_queue_sender("orders") as sender:
        sender.send_messages([ServiceBusMessage(f"body {m}", message_id=m) for m in ids])
    orders = remote.readStream.format("oncebus").option("connectionString", conn).option("queue", "orders").load()
    output = tmp_path / "orders-parquet"
    query = deduplicate_stream(
        orders,
        "PT10M",
        state_path=str(tmp_path / "orders-dedup"),
        output_path=str(output),
        trigger={"processingTime": "1 second"},
    )
    try:
        deadline = time.monotonic() + 180
        while len({r["message_id"] for r in _committed(output, ["message_id"])}) < 200:
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline, "the Connect pipeline produced too little"
            time.sleep(0.5)
    finally:
        query.stop()
    counts = Counter(r["message_id"] for r in _committed(output, ["message_id"]))
    assert set(counts) == {f"o{i}" for i in range(200)}
    assert max(counts.values()) == 1


def main() -> None:
    url, check, work = sys.argv[1:4]
    conn = sys.argv[4] if len(sys.argv) > 4 else ""
    remote = SparkSession.builder.remote(url).getOrCreate()
    assert type(remote).__module__.startswith("pyspark.sql.connect"), type(remote)
    {"dedup": check_dedup, "data_source": check_data_source}[check](remote, Path(work), conn)
    remote.stop()
    print("OK", flush=True)


if __name__ == "__main__":
    main()
