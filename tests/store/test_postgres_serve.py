"""``oncebus serve`` on PostgreSQL, end to end with the real SDK: sends acknowledged with duplicate detection, the
server SIGKILLed (nothing written on the way out), started again: every message is there once, and the dedup
history too (resends are dropped). Also the CLI with no server: ``$ONCEBUS_STORE`` opens the same database."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import psycopg

from tests.postgres_cluster import PostgresCluster
from tests.store.test_files_deleted_under_serve import ONCEBUS, Serve, _drain, _send, cli


def test_serve_on_postgresql_loses_nothing_acknowledged_across_a_sigkill(
    tmp_path: Path, postgres_cluster: PostgresCluster
) -> None:
    url = postgres_cluster.fresh_url()
    env = {"ONCEBUS_STORE": url}
    data = tmp_path / "data"
    server = Serve(data, env)
    try:
        cli(data, "queue", "create", "q", "--duplicate-detection")
        ids = [f"m-{i}" for i in range(30)]
        acked = _send(server.connection_string, ids)
        assert acked == ids
        assert _send(server.connection_string, ["m-0"]) == ["m-0"]  # a resend: acknowledged, dropped
        assert any(f"with its store on {url}" in line for line in server.output), server.output
        server.kill()
        assert (data / "oncebus.db").stat().st_size == 0  # nothing went to the data directory's SQLite file
        with psycopg.connect(url) as db:
            assert db.execute("SELECT count(*) FROM oncebus_message").fetchone() == (30,)
            assert db.execute("SELECT count(*) FROM oncebus_dedup_key").fetchone() == (30,)

        server = Serve(data, env)
        assert _send(server.connection_string, ["m-1", "m-29", "new"]) == ["m-1", "m-29", "new"]
        got = _drain(server.connection_string)
        assert sorted(got) == sorted([*ids, "new"]) and len(got) == len(set(got))  # resends dropped: once each
        stats = json.loads(cli(data, "stats", "q", "--json"))[0]
        assert stats["accepted"] == 31 and stats["duplicates_dropped"] >= 2
        server.stop()
        # no server: a CLI command opens the store itself, the one $ONCEBUS_STORE names
        listed = subprocess.run(
            [*ONCEBUS, "--data-dir", str(data), "queue", "list", "--json"],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert listed.returncode == 0, listed.stderr
        assert [q["name"] for q in json.loads(listed.stdout)] == ["q"]
    finally:
        server.stop()


def test_the_database_restarted_under_load_loses_nothing_acknowledged(tmp_path: Path) -> None:
    """PostgreSQL restarted (``pg_ctl restart -m fast``: every session ended) while an SDK sender sends: the calls
    in flight are refused as server-busy (the SDK retries them), serve reconnects by itself, and every send the SDK
    saw acknowledged is delivered once. A cluster of its own: the session's other tests keep theirs."""
    from azure.servicebus import ServiceBusClient, ServiceBusMessage
    from azure.servicebus.exceptions import ServiceBusError

    cluster = PostgresCluster()
    server = None
    try:
        cluster.start()
        env = {"ONCEBUS_STORE": cluster.fresh_url()}
        data = tmp_path / "data"
        server = Serve(data, env)
        cli(data, "queue", "create", "q", "--duplicate-detection")
        acked: list[str] = []
        refused: list[str] = []
        restarted = threading.Event()
        after_restart = 0

        def send() -> None:
            nonlocal after_restart
            with ServiceBusClient.from_connection_string(server.connection_string) as client:
                with client.get_queue_sender("q") as sender:
                    i = 0
                    while after_restart < 30 and i < 5000:
                        mid = f"m-{i}"
                        i += 1
                        try:
                            sender.send_messages(ServiceBusMessage(mid.encode(), message_id=mid))
                        except ServiceBusError:
                            refused.append(mid)
                            continue
                        acked.append(mid)
                        if restarted.is_set():
                            after_restart += 1

        sender = threading.Thread(target=send)
        sender.start()
        deadline = time.monotonic() + 30
        while len(acked) < 30 and time.monotonic() < deadline:
            time.sleep(0.05)
        cluster.stop("fast")  # every session ends; the node's writes fail until it is back
        cluster.start()
        restarted.set()
        sender.join(120)
        assert not sender.is_alive() and after_restart >= 30, (len(acked), refused)
        got = _drain(server.connection_string)
        assert len(got) == len(set(got))  # none twice
        assert set(acked) <= set(got)  # every acknowledged send is there
        assert set(got) <= set(acked) | set(refused)
        assert any("reconnected to PostgreSQL" in line for line in server.output), server.output[-20:]
        refusal = next(line for line in server.output if "the connection to PostgreSQL failed" in line)
        assert "pipeline" not in refusal  # the cause (the server went away), not the driver's own echo of it
    finally:
        if server is not None:
            server.stop()
        cluster.remove()
