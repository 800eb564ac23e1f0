"""One run: what a cluster leader's death costs a client, against restarting a single node, on PostgreSQL.

A queue with duplicate detection holds ``--messages`` 1 KiB messages (their keys held too). Then, twice:

- **failover**: two ``oncebus serve --cluster`` nodes; the leader is SIGKILLed; timed from the kill to the
  standby serving (its ``server.json`` says leader), to the first send acknowledged through the standby's
  address by an SDK client (opened after the kill, retrying every 0.1 to 0.5 s until it is answered), and to the
  first message received;
- **restart**: one node (no ``--cluster``) SIGKILLed and started again by hand; timed from the start of the new
  process to the same two points (a single node has no other process to take over: the operator's or the
  supervisor's restart delay comes on top).

Prints the seconds of each, the same client work on a node that serves all along ("no fault": what a new SDK
client's open and first calls cost anyway), and the ratio failover / restart. Not a test: figures vary with the
machine.

Usage: ``python bench/cluster_failover.py [--messages 50000]``
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT)]

from amqp_send import load, sdk_fill, start_oncebus  # noqa: E402  (bench/ is not a package)


class Node:
    """``oncebus serve`` on ``workdir`` with ``$ONCEBUS_STORE`` = ``url`` (bench/amqp_send.py's start_oncebus)."""

    def __init__(self, workdir: Path, url: str, *args: str) -> None:
        workdir.mkdir(exist_ok=True)
        self.data = workdir / "data"
        os.environ["ONCEBUS_STORE"] = url  # start_oncebus's serve inherits the environment
        try:
            self.process, self.connection_string = start_oncebus(workdir, serve_args=args)
        finally:
            del os.environ["ONCEBUS_STORE"]

    @property
    def port(self) -> str:
        return self.connection_string.split("sb://", 1)[1].split(";", 1)[0].rsplit(":", 1)[1]

    def role(self) -> str | None:
        try:
            return json.loads((self.data / "server.json").read_text()).get("role")
        except (OSError, ValueError):
            return None

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()


def first_send_and_receive(connection_string: str, started: float, tag: str) -> tuple[float, float]:
    """Seconds from ``started`` to the first acknowledged send and the first message received, retrying."""
    from azure.servicebus import ServiceBusClient, ServiceBusMessage

    sent = received = None
    with ServiceBusClient.from_connection_string(
        connection_string, retry_total=20, retry_backoff_factor=0.1, retry_backoff_max=0.5
    ) as client:
        while sent is None:
            try:
                with client.get_queue_sender("receive") as sender:
                    sender.send_messages(ServiceBusMessage(b"x" * 1024, message_id=f"after-{tag}"))
                sent = time.monotonic() - started
            except Exception:  # not serving yet: again
                time.sleep(0.02)
        while received is None:
            try:
                with client.get_queue_receiver("receive", max_wait_time=5) as receiver:
                    if receiver.receive_messages(max_message_count=1, max_wait_time=5):
                        received = time.monotonic() - started
            except Exception:
                time.sleep(0.02)
    return sent, received


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=50_000, help="messages waiting (and keys held)")
    args = parser.parse_args()
    from tests.postgres_cluster import PostgresCluster

    print(f"before: {load()}; python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    workdir = Path(tempfile.mkdtemp(prefix="oncebus-failover-"))
    cluster = PostgresCluster()
    nodes: list[Node] = []
    results: dict[str, Any] = {}
    try:
        cluster.start()
        # failover
        url = cluster.fresh_url()
        leader = Node(workdir / "a", url, "--cluster")
        standby = Node(workdir / "b", url, "--cluster")
        nodes += [leader, standby]
        sdk_fill(leader.connection_string, "receive", "fill", args.messages)
        killed = time.monotonic()
        leader.kill()
        while standby.role() != "leader":
            time.sleep(0.005)
        serving = time.monotonic() - killed
        sent, received = first_send_and_receive(standby.connection_string, killed, "failover")
        results["failover"] = (serving, sent, received)
        # the same client work on a node that serves all along: what a new SDK client's open costs anyway
        results["no fault"] = (0.0, *first_send_and_receive(standby.connection_string, time.monotonic(), "steady"))
        # restart of a single node on the same kind of store
        url = cluster.fresh_url()
        single = Node(workdir / "s", url)
        nodes.append(single)
        sdk_fill(single.connection_string, "receive", "fill", args.messages)
        port = single.port
        single.kill()
        started = time.monotonic()
        single = Node(workdir / "s", url, "--port", port)
        nodes.append(single)
        serving = time.monotonic() - started
        sent, received = first_send_and_receive(single.connection_string, started, "restart")
        results["restart"] = (serving, sent, received)
    finally:
        for node in nodes:
            node.stop()
        cluster.remove()
    print(f"{args.messages:,} x 1 KiB messages waiting and their keys held; after: {load()}")
    for name, (serving, sent, received) in results.items():
        print(f"  {name:<9} serving {serving:6.2f} s   first send acknowledged {sent:6.2f} s", end="")
        print(f"   first receive {received:6.2f} s")
    (f_serving, f_sent, f_received), (r_serving, r_sent, r_received) = results["failover"], results["restart"]
    _, n_sent, _ = results["no fault"]
    print(
        f"  ratio failover / restart: serving {f_serving / r_serving:.2f}, first send {f_sent / r_sent:.2f}, "
        f"first receive {f_received / r_received:.2f}"
    )
    print(
        f"  beyond a new client's own open on a serving node: failover {f_sent - n_sent:.2f} s to the first send, ",
        end="",
    )
    print(f"restart {r_sent - n_sent:.2f} s")
    print("  (failover is timed from the SIGKILL; restart from the new process's start, without any restart delay;")
    print("   'no fault': a new client opened on the serving node, timed from its opening)")


if __name__ == "__main__":
    main()
