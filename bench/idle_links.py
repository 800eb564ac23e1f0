"""Idle receive links against traffic elsewhere: what thousands of waiting receivers cost everyone else.

One ``oncebus serve``; ``--connections`` raw AMQP connections each attach ``--links`` receiver links
with credit on the empty queue 'receive' and then say nothing. Meanwhile an SDK sender sends
single messages to 'dedup-off' (another queue) and times each send. Printed, side by side in one
run (never asserted):

- the server's CPU (all threads) per second of wall time, idle, before and after the links attach;
- the SDK sender's median and p99 send latency without and with the idle links, and their ratio.

Issue 18 (item 5) measured 5 x 998 links: the server idled at 60 % CPU and another client's sends
went from 2 ms to 266 ms median, because one namespace-wide signal woke every waiting link on every
commit and tick. Each receivable now wakes only its own receivers.

Usage: ``python bench/idle_links.py [--connections 5] [--links 998] [--sends 300]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from amqp_send import process_cpu, start_oncebus
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from tests.amqp.raw import ATTACH, RawClient, attach_frame, flow_frame


def send_latencies(connection_string: str, count: int) -> list[float]:
    out = []
    with ServiceBusClient.from_connection_string(connection_string) as client:
        with client.get_queue_sender("dedup-off") as sender:
            sender.send_messages(ServiceBusMessage(b"warm"))
            for n in range(count):
                started = time.perf_counter()
                sender.send_messages(ServiceBusMessage(b"x" * 256, message_id=f"m-{n}-{time.time_ns()}"))
                out.append(time.perf_counter() - started)
    return out


def cpu_share(pid: int, seconds: float) -> float:
    before = process_cpu(pid) or 0.0
    time.sleep(seconds)
    return ((process_cpu(pid) or 0.0) - before) / seconds


def attach_idle_links(port: int, connections: int, links: int) -> list[RawClient]:
    clients = []
    for c in range(connections):
        client = RawClient(port, timeout=30)
        client.handshake()
        assert client.put_token("receive") in (200, 202)
        for handle in range(links):
            client.send(attach_frame(f"idle-{c}-{handle}", handle, "receive", sender=False))
            client.send(flow_frame(handle, 10))
        for _ in range(links):
            client.expect(ATTACH, 30)
        clients.append(client)
    return clients


def p99(values: list[float]) -> float:
    return sorted(values)[max(0, round(len(values) * 0.99) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=5)
    parser.add_argument("--links", type=int, default=998, help="receiver links per connection (at most 1,000)")
    parser.add_argument("--sends", type=int, default=300)
    parser.add_argument("--idle-seconds", type=float, default=5.0)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        process, connection_string = start_oncebus(Path(work))
        port = int(connection_string.split("sb://", 1)[1].split(";", 1)[0].rsplit(":", 1)[1])
        try:
            idle_before = cpu_share(process.pid, options.idle_seconds)
            quiet = send_latencies(connection_string, options.sends)
            started = time.perf_counter()
            clients = attach_idle_links(port, options.connections, options.links)
            attach_seconds = time.perf_counter() - started
            idle_after = cpu_share(process.pid, options.idle_seconds)
            crowded = send_latencies(connection_string, options.sends)
            for client in clients:
                client.close()
        finally:
            process.terminate()
            process.wait(30)
    total = options.connections * options.links
    print(f"{total:,} idle receiver links ({options.connections} connections), attached in {attach_seconds:.1f} s")
    print(f"  server CPU while idle: {idle_before:.1%} without the links, {idle_after:.1%} with them")
    q_med, c_med = statistics.median(quiet), statistics.median(crowded)
    print(f"  another client's send, median: {q_med * 1000:.2f} ms without, {c_med * 1000:.2f} ms with")
    print(f"  another client's send, p99:    {p99(quiet) * 1000:.2f} ms without, {p99(crowded) * 1000:.2f} ms with")
    print(f"  ratio of medians (with / without): {c_med / q_med:.2f}")


if __name__ == "__main__":
    main()
