"""Several ``oncebus serve --cluster`` nodes on one PostgreSQL database, with the real SDK: one node leads, the
others forward their clients to it, so a client may use any node and gets one namespace's answers (a resend
through another node is dropped, a lock taken through one node is settled through another); a node SIGKILLed
or restarted under load loses nothing acknowledged. See ``oncebus.server.cluster``."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusAuthenticationError

from tests.postgres_cluster import PostgresCluster
from tests.store.test_files_deleted_under_serve import ONCEBUS, Serve, _drain, cli


def _node(data: Path, url: str, like: Serve | None = None) -> Serve:
    """A node on ``data``; ``like``: started again on the AMQP port that node had (its clients' address)."""
    port = () if like is None else ("--port", like.connection_string.split(":")[2].split(";")[0])
    return Serve(data, {"ONCEBUS_STORE": url}, ("--cluster", *port))


def _role(node: Serve) -> str:
    return str(json.loads((node.data_dir / "server.json").read_text()).get("role"))


def _client(connection_string: str, retries: int = 8) -> ServiceBusClient:
    # a node's clients reconnect when it stops or changes role: retries spread over several seconds
    return ServiceBusClient.from_connection_string(
        connection_string, retry_total=retries, retry_backoff_factor=0.5, retry_backoff_max=4
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
        # the standby holds no keys of its own to check: the leader checks every token that comes through it
        wrong = b.connection_string.replace("SharedAccessKey=SAS_KEY_VALUE", "SharedAccessKey=not-the-key")
        with ServiceBusClient.from_connection_string(wrong, retry_total=0) as client:
            with pytest.raises(ServiceBusAuthenticationError):
                with client.get_queue_sender("q") as sender:
                    sender.send_messages(ServiceBusMessage(b"x", message_id="intruder"))
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


class _Load:
    """SDK senders and receivers spread over the nodes, each moving to the next node when its node fails.

    A sender sends ids ``s<t>-<i>``; a send that fails is sent again (same id) through the next node until
    acknowledged, as a client unsure of its send does; each acknowledged id is also resent once through another
    node (a duplicate, to be dropped). Receivers complete what they get and record every delivery and every
    completion the broker confirmed."""

    def __init__(self, strings: list[str], senders: int, per_sender: int) -> None:
        self.strings = strings
        self.per_sender = per_sender
        self.acked: set[str] = set()
        self.resends_acked = 0
        self.deliveries: dict[str, int] = {}
        self.completed: dict[str, int] = {}  # completions the broker confirmed, per id
        self.complete_failed: set[str] = set()  # completions that failed (maybe done, the answer lost)
        self.errors: list[str] = []
        self.stop_receiving = threading.Event()
        self._lock = threading.Lock()
        self.senders = [threading.Thread(target=self._send, args=(t,), daemon=True) for t in range(senders)]
        self.receivers = [threading.Thread(target=self._receive, args=(r,), daemon=True) for r in range(len(strings))]

    def start(self) -> None:
        for thread in (*self.senders, *self.receivers):
            thread.start()

    def _send(self, t: int) -> None:
        node = t
        opened: dict[int, tuple[ServiceBusClient, Any]] = {}  # node -> its client and sender, kept while they work
        for i in range(self.per_sender):
            mid = f"s{t}-{i}"
            for attempt in range(2):  # the send, then its resend through another node
                tries = 0
                while True:
                    tries += 1
                    at = node % len(self.strings)
                    try:
                        if at not in opened:
                            client = _client(self.strings[at], retries=1)
                            opened[at] = (client, client.get_queue_sender("q"))
                        opened[at][1].send_messages(ServiceBusMessage(mid.encode(), message_id=mid))
                        break
                    except Exception as exc:  # the node died or changes role: unsure, send again elsewhere
                        with self._lock:
                            self.errors.append(f"send {mid}: {type(exc).__name__}")
                        if at in opened:
                            opened.pop(at)[0].close()
                        node += 1
                        assert tries < 40, f"{mid} was never acknowledged"
                        time.sleep(0.2)
                with self._lock:
                    if attempt == 0:
                        self.acked.add(mid)
                    else:
                        self.resends_acked += 1
                node += 1
        for client, _ in opened.values():
            client.close()

    def _receive(self, r: int) -> None:
        node = r
        while not self.stop_receiving.is_set():
            try:
                with _client(self.strings[node % len(self.strings)], retries=1) as client:
                    with client.get_queue_receiver("q", max_wait_time=1) as receiver:
                        while not self.stop_receiving.is_set():
                            for message in receiver.receive_messages(max_message_count=20, max_wait_time=1):
                                mid = str(message.message_id)
                                with self._lock:
                                    self.deliveries[mid] = self.deliveries.get(mid, 0) + 1
                                try:
                                    receiver.complete_message(message)
                                except Exception:  # its lock lost with its node, or the answer lost with it
                                    with self._lock:
                                        self.complete_failed.add(mid)
                                    raise
                                with self._lock:
                                    self.completed[mid] = self.completed.get(mid, 0) + 1
            except Exception as exc:  # the node died or changes role (a completion may have failed): go on elsewhere
                with self._lock:
                    self.errors.append(f"receive: {type(exc).__name__}")
                node += 1
                time.sleep(0.2)


def _wait_for(
    condition: Callable[[], bool], seconds: float, what: str, detail: Callable[[], object] = lambda: ""
) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what}: {detail()}"
        time.sleep(0.1)


def _state(load: _Load, nodes: list[Serve]) -> str:
    missing = sorted(load.acked - set(load.completed) - load.complete_failed)
    outputs = "\n".join(f"--- {n.data_dir.name}\n" + "\n".join(n.output[-12:]) for n in nodes)
    stuck = []
    frames = sys._current_frames()
    for thread in load.receivers:
        frame = frames.get(thread.ident or 0)
        if frame is not None:
            stuck.append("".join(traceback.format_stack(frame)[-4:]))
    return (
        f"acked {len(load.acked)}, resends {load.resends_acked}, completed {len(load.completed)}, "
        f"missing {missing[:20]} (delivered {[load.deliveries.get(m) for m in missing[:20]]}), "
        f"errors {collections.Counter(load.errors).most_common(6)}\n{outputs}\nreceivers:\n" + "\n".join(stuck)
    )


def test_three_nodes_under_load_lose_nothing_when_the_leader_is_killed_and_a_node_restarted(
    tmp_path: Path, postgres_cluster: PostgresCluster
) -> None:
    """Three nodes, SDK senders and receivers spread over them; the leader SIGKILLed under load, then a standby
    restarted (stopped, started again): every acknowledged send is delivered, none is completed twice (a second
    delivery only of a message whose first lock was lost with its node), every resend inside the window dropped."""
    url = postgres_cluster.fresh_url()
    nodes = [_node(tmp_path / name, url) for name in ("a", "b", "c")]
    try:
        # a lock lost with a failed completion comes back after 10 s (not the default minute)
        cli(nodes[0].data_dir, "queue", "create", "q", "--duplicate-detection", "--lock-duration", "PT10S")
        load = _Load([n.connection_string for n in nodes], senders=3, per_sender=150)
        load.start()
        _wait_for(lambda: len(load.acked) >= 60, 120, "the senders did not get going")
        nodes[0].kill()  # the leader, mid-load
        _wait_for(
            lambda: any(_role(n) == "leader" for n in nodes[1:]),
            30,
            "no standby took over",
            lambda: _state(load, nodes),
        )
        leader = next(i for i in (1, 2) if _role(nodes[i]) == "leader")
        nodes[0] = _node(tmp_path / "a", url, like=nodes[0])  # back, as a standby, on its port
        _wait_for(
            lambda: len(load.acked) >= 250, 180, "the senders stalled after the failover", lambda: _state(load, nodes)
        )
        standby = 3 - leader  # the other of b and c: stopped and started again under load
        nodes[standby].stop()
        nodes[standby] = _node(tmp_path / "bc"[standby - 1], url, like=nodes[standby])
        for thread in load.senders:
            thread.join(300)
            assert not thread.is_alive(), f"a sender hung: {_state(load, nodes)}"
        _wait_for(
            lambda: set(load.completed) | load.complete_failed >= load.acked,
            120,
            "acknowledged messages were not all delivered",
            lambda: _state(load, nodes),
        )
        load.stop_receiving.set()
        for thread in load.receivers:
            thread.join(60)
        left = _drain(nodes[leader].connection_string)  # locked ones whose completion failed come back
        assert set(left) <= load.complete_failed, left
        assert len(load.acked) == 450 and load.resends_acked == 450
        twice = {mid: n for mid, n in load.completed.items() if n > 1}
        assert twice == {}, twice  # a completion confirmed twice: two valid locks at once, or a resend stored
        assert not set(left) & set(load.completed)
        assert set(load.deliveries) == load.acked  # nothing else was stored
        stats = json.loads(cli(nodes[leader].data_dir, "stats", "q", "--json"))[0]
        assert stats["accepted"] == 450, stats
        assert any("leads the cluster now" in line for line in nodes[leader].output)
    finally:
        for node in nodes:
            node.stop()


def test_the_database_restarted_under_load_the_cluster_loses_nothing_acknowledged(tmp_path: Path) -> None:
    """PostgreSQL restarted (every session ended, the leader's lock with them) while SDK senders send through
    both nodes: the calls in flight fail (server-busy, or the connection closed as the leader steps down), the
    senders send them again (same ids), a node leads again once the database is back, and every acknowledged send
    is delivered once. A database of its own: the session's other tests keep theirs."""
    cluster = PostgresCluster()
    nodes: list[Serve] = []
    try:
        cluster.start()
        url = cluster.fresh_url()
        nodes = [_node(tmp_path / "a", url), _node(tmp_path / "b", url)]
        cli(nodes[0].data_dir, "queue", "create", "q", "--duplicate-detection", "--lock-duration", "PT10S")
        load = _Load([n.connection_string for n in nodes], senders=2, per_sender=200)
        load.stop_receiving.set()  # senders only: the queue is drained at the end
        load.start()
        _wait_for(lambda: len(load.acked) >= 60, 120, "the senders did not get going")
        cluster.stop("fast")
        time.sleep(1.0)  # the outage: calls fail meanwhile
        acked_in_the_outage = len(load.acked)  # by the end of the outage (none is acknowledged while it lasts)
        cluster.start()
        assert acked_in_the_outage < 400, "the senders were done before the outage: no load crossed it"
        for thread in load.senders:
            thread.join(300)
            assert not thread.is_alive(), f"a sender hung: {_state(load, nodes)}"
        leader = next(n for n in nodes if _role(n) == "leader")
        got = _drain(leader.connection_string)
        assert len(got) == len(set(got)), sorted(got)  # none twice: the resends were dropped
        assert set(got) == load.acked and len(load.acked) == 400
        # the outage happened under load: the leader lost its session and stepped down (whether a sender saw an
        # error depends on timing: the SDK retries a closed connection itself, so none may reach the application)
        assert any("no longer the cluster's leader" in line for n in nodes for line in n.output), load.errors
    finally:
        for node in nodes:
            node.stop()
        cluster.remove()
