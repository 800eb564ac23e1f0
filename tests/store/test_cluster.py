"""Several ``oncebus serve --cluster`` nodes on one PostgreSQL database, with the real SDK: one node leads, the
others forward their clients to it, so a client may use any node and gets one namespace's answers (a resend
through another node is dropped, a lock taken through one node is settled through another); a node SIGKILLed
or restarted under load loses nothing acknowledged. See ``oncebus.server.cluster``."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from azure.servicebus import ServiceBusClient, ServiceBusMessage

from tests.postgres_cluster import PostgresCluster
from tests.store.test_files_deleted_under_serve import ONCEBUS, Serve, _drain, cli


def _node(data: Path, url: str) -> Serve:
    return Serve(data, {"ONCEBUS_STORE": url}, ("--cluster",))


def _role(node: Serve) -> str:
    return str(json.loads((node.data_dir / "server.json").read_text()).get("role"))


def _client(connection_string: str) -> ServiceBusClient:
    # a node's clients reconnect when it stops or changes role: retries spread over several seconds
    return ServiceBusClient.from_connection_string(
        connection_string, retry_total=8, retry_backoff_factor=0.5, retry_backoff_max=4
    )


def test_two_nodes_answer_as_one_namespace(tmp_path: Path, postgres_cluster: PostgresCluster) -> None:
    url = postgres_cluster.fresh_url()
    a = _node(tmp_path / "a", url)
    b = _node(tmp_path / "b", url)
    try:
        assert _role(a) == "leader" and _role(b) == "standby"
        assert any("a standby of the cluster" in line and "the leader is" in line for line in b.output), b.output
        cli(a.data_dir, "queue", "create", "q", "--duplicate-detection")
        with _client(a.connection_string) as ca, _client(b.connection_string) as cb:
            with ca.get_queue_sender("q") as sa, cb.get_queue_sender("q") as sb:
                sa.send_messages(ServiceBusMessage(b"1", message_id="m-1"))
                sb.send_messages(ServiceBusMessage(b"1 again", message_id="m-1"))  # through b: a duplicate
                sb.send_messages(ServiceBusMessage(b"2", message_id="m-2"))
            # a lock taken through b is settled through a (the same broker behind both)
            with cb.get_queue_receiver("q", max_wait_time=5) as rb:
                first = rb.receive_messages(max_message_count=1, max_wait_time=5)
                assert [str(m.message_id) for m in first] == ["m-1"] and first[0].body is not None
                with ca.get_queue_receiver("q", max_wait_time=2) as ra:
                    other = ra.receive_messages(max_message_count=5, max_wait_time=2)
                    assert [str(m.message_id) for m in other] == ["m-2"]  # m-1 is locked for b's receiver
                    ra.complete_message(other[0])
                rb.complete_message(first[0])
        assert _drain(b.connection_string) == []  # each completed once, through either node
        stats = json.loads(cli(a.data_dir, "stats", "q", "--json"))[0]
        assert stats["accepted"] == 2 and stats["duplicates_dropped"] == 1
        refused = subprocess.run(
            [*ONCEBUS, "--data-dir", str(b.data_dir), "queue", "list"], capture_output=True, text=True, timeout=60
        )
        assert refused.returncode != 0 and "standby node of a cluster" in refused.stderr, refused.stderr
    finally:
        b.stop()
        a.stop()


def test_the_standby_takes_over_when_the_leader_is_killed(tmp_path: Path, postgres_cluster: PostgresCluster) -> None:
    url = postgres_cluster.fresh_url()
    a = _node(tmp_path / "a", url)
    b = _node(tmp_path / "b", url)
    try:
        cli(a.data_dir, "queue", "create", "q", "--duplicate-detection")
        with _client(b.connection_string) as client, client.get_queue_sender("q") as sender:
            for i in range(10):
                sender.send_messages(ServiceBusMessage(b"x", message_id=f"m-{i}"))
        a.kill()
        deadline = time.monotonic() + 30
        while _role(b) != "leader" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _role(b) == "leader", b.output[-10:]
        assert any("leads the cluster now" in line for line in b.output), b.output
        with _client(b.connection_string) as client, client.get_queue_sender("q") as sender:
            for i in range(5, 15):  # m-5 .. m-9 again: dropped, the history survived the leader
                sender.send_messages(ServiceBusMessage(b"x", message_id=f"m-{i}"))
        a = _node(tmp_path / "a", url)  # back, as a standby of b
        assert _role(a) == "standby"
        got = _drain(a.connection_string)
        assert sorted(got) == sorted(f"m-{i}" for i in range(15))
    finally:
        a.stop()
        b.stop()


def test_without_a_postgresql_store_cluster_is_refused(tmp_path: Path) -> None:
    result = subprocess.run(
        [*ONCEBUS, "--data-dir", str(tmp_path / "d"), "serve", "--port", "0", "--cluster"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "ONCEBUS_STORE"},
    )
    assert result.returncode != 0 and "--cluster needs the PostgreSQL store" in result.stderr, result.stderr
