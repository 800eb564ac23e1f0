"""Load: concurrent SDK senders with resends, receivers completing, a slow consumer, a stalled receiver and a
hostile connection, all at once against one ``oncebus serve``; then exact counts.

Checked at the end: every acknowledged message was delivered exactly once (no loss, no duplicate
delivery), the broker counted exactly the distinct messages as accepted and every resend as a duplicate,
the slow consumer and the stalled receiver's queue lost nothing, the server's memory stayed bounded,
it logged no traceback and is alive. ``ONCEBUS_LOAD_SECONDS`` sets how long the senders run (default 60).
"""

from __future__ import annotations

import json
import os
import random
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode

from tests.amqp.conftest import ServerProcess, topology
from tests.amqp.raw import (
    AMQP_HEADER,
    ATTACH,
    RawClient,
    attach_frame,
    flow_frame,
    raw_frame,
    transfer_frame,
    vmrss_kib,
)

SECONDS = float(os.environ.get("ONCEBUS_LOAD_SECONDS", "60"))
SENDERS = 3
RECEIVERS = 2
BATCH = 20
SLOW_COUNT = 150
STALLED_COUNT = 200
MEMORY_BOUND_MIB = 150

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("load")
    queues = {
        "load": {"RequiresDuplicateDetection": True, "LockDuration": "PT1M", "MaxDeliveryCount": 10},
        "slow": {"RequiresDuplicateDetection": True, "LockDuration": "PT2M"},
        "stalled": {"LockDuration": "PT5S", "MaxDeliveryCount": 100},
    }
    env = {"ONCEBUS_AMQP_HANDSHAKE_TIMEOUT": "2"}
    process = ServerProcess(base / "data", topology(queues, {}), env=env).start()
    yield process
    process.stop()


class Shared:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acknowledged: set[str] = set()
        self.resends = 0
        self.received: Counter[str] = Counter()
        self.errors: list[str] = []
        self.senders_done = threading.Event()
        self.stop = threading.Event()
        self.hostile_actions: Counter[str] = Counter()
        self.peak_rss_kib = 0


def guarded(shared: Shared, name: str, work: Callable[[], None]) -> threading.Thread:
    def run() -> None:
        try:
            work()
        except Exception as exc:
            with shared.lock:
                shared.errors.append(f"{name}: {type(exc).__name__}: {exc}")

    thread = threading.Thread(target=run, name=name)
    thread.start()
    return thread


def sender(server: ServerProcess, shared: Shared, number: int) -> None:
    rng = random.Random(number)
    sent: list[list[str]] = []
    deadline = time.monotonic() + SECONDS
    with ServiceBusClient.from_connection_string(server.connection_string) as client:
        with client.get_queue_sender("load") as link:
            batch_number = 0
            while time.monotonic() < deadline:
                if sent and rng.random() < 0.25:  # a resend of an earlier batch (a retry after a lost ack)
                    ids = rng.choice(sent)
                    resend = True
                else:
                    ids = [f"s{number}-{batch_number}-{i}" for i in range(BATCH)]
                    batch_number += 1
                    resend = False
                if rng.random() < 0.5:
                    batch = link.create_message_batch()
                    for message_id in ids:
                        batch.add_message(ServiceBusMessage(message_id.encode(), message_id=message_id))
                    link.send_messages(batch)
                else:
                    link.send_messages([ServiceBusMessage(m.encode(), message_id=m) for m in ids])
                with shared.lock:
                    shared.acknowledged.update(ids)
                    shared.resends += len(ids) if resend else 0
                if not resend:
                    sent.append(ids)
                time.sleep(0.05 + rng.random() * 0.05)  # about 600 messages a second in all: receivers keep up


def receiver(server: ServerProcess, shared: Shared) -> None:
    idle_after_senders = 0
    with ServiceBusClient.from_connection_string(server.connection_string) as client:
        with client.get_queue_receiver("load", prefetch_count=20) as link:
            while idle_after_senders < 3:
                got = link.receive_messages(max_message_count=50, max_wait_time=1)
                for message in got:
                    link.complete_message(message)
                with shared.lock:
                    shared.received.update(str(m.message_id) for m in got)
                if not got and shared.senders_done.is_set():
                    idle_after_senders += 1
                elif got:
                    idle_after_senders = 0


def slow_consumer(server: ServerProcess, shared: Shared) -> None:
    """Sends SLOW_COUNT messages, then takes one every 0.2 s with a large prefetch, completing each."""
    with ServiceBusClient.from_connection_string(server.connection_string) as client:
        with client.get_queue_sender("slow") as link:
            link.send_messages([ServiceBusMessage(b"slow", message_id=f"slow-{i}") for i in range(SLOW_COUNT)])
        seen: Counter[str] = Counter()
        with client.get_queue_receiver("slow", prefetch_count=100, max_wait_time=5) as link:
            while sum(seen.values()) < SLOW_COUNT and not shared.stop.is_set():
                for message in link.receive_messages(max_message_count=1, max_wait_time=5):
                    seen[str(message.message_id)] += 1
                    link.complete_message(message)
                time.sleep(0.2)
    assert sorted(seen) == sorted(f"slow-{i}" for i in range(SLOW_COUNT)), "the slow consumer lost messages"
    assert set(seen.values()) == {1}, "the slow consumer got a message twice"


def stalled(server: ServerProcess, shared: Shared) -> None:
    """A raw receiver with large credit that never reads, for the whole run; then its queue is complete."""
    with ServiceBusClient.from_connection_string(server.connection_string) as client:
        with client.get_queue_sender("stalled") as link:
            for start in range(0, STALLED_COUNT, 10):
                link.send_messages(
                    [ServiceBusMessage(b"z" * 16_000, message_id=f"st-{i}") for i in range(start, start + 10)]
                )
    raw = RawClient(server.port)
    raw.handshake()
    assert raw.put_token("stalled") == 202
    raw.send(attach_frame("stalled", 1, "stalled", sender=False))
    raw.expect(ATTACH)
    raw.send(flow_frame(1, 100_000))
    shared.senders_done.wait()
    raw.close()  # what it was sent comes back when the locks (5 s) expire
    got: Counter[str] = Counter()
    deadline = time.monotonic() + 60
    with ServiceBusClient.from_connection_string(server.connection_string) as client:
        with client.get_queue_receiver("stalled", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as link:
            while len(got) < STALLED_COUNT and time.monotonic() < deadline:
                got.update(str(m.message_id) for m in link.receive_messages(max_message_count=100, max_wait_time=2))
    assert sorted(got) == sorted(f"st-{i}" for i in range(STALLED_COUNT)), "the stalled receiver's queue lost some"


def hostile(server: ServerProcess, shared: Shared) -> None:
    """A hostile client, over and over, until the senders are done."""
    rng = random.Random(99)

    def huge_frame() -> None:
        with RawClient(server.port) as client:
            client.send(AMQP_HEADER + struct.pack(">IBBH", 2**31, 2, 0, 0))
            try:
                for _ in range(64):
                    client.sock.sendall(b"\xee" * 16384)
            except OSError:
                pass

    def wrong_header() -> None:
        with RawClient(server.port) as client:
            client.send(b"AMQP\x00\x00\x09\x01")  # AMQP 0-9-1
            client.frames_until_closed(5)

    def garbage() -> None:
        with RawClient(server.port) as client:
            client.send(bytes(range(256)))
            client.frames_until_closed(15)

    def malformed_after_open() -> None:
        with RawClient(server.port) as client:
            client.handshake()
            client.send(raw_frame(b"\x00\x53\x14\xc0\x03\x01\xff\x00"))
            client.frames_until_closed(5)

    def slowloris() -> None:
        sockets = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(20)]
        for sock in sockets:
            sock.send(b"AM")
        time.sleep(0.5)
        for sock in sockets:
            sock.close()

    def oversized_send() -> None:
        with RawClient(server.port) as client:
            client.handshake()
            assert client.put_token("load") == 202
            client.attach_sender("load", handle=1)
            first = client.transfer(1, b"\x00\x53\x75\xb0" + struct.pack(">I", 10**6) + b"q" * 60_000, more=True)
            for _ in range(10):
                client.send(transfer_frame(1, b"q" * 60_000, delivery_id=first, more=True))
            client.disposition(first, timeout=10)

    actions = {
        f.__name__: f for f in (huge_frame, wrong_header, garbage, malformed_after_open, slowloris, oversized_send)
    }
    while not shared.senders_done.is_set():
        name = rng.choice(sorted(actions))
        actions[name]()
        shared.hostile_actions[name] += 1
        time.sleep(0.1)


def memory_sampler(server: ServerProcess, shared: Shared) -> None:
    while not shared.stop.is_set():
        shared.peak_rss_kib = max(shared.peak_rss_kib, vmrss_kib(server.pid))
        time.sleep(0.5)


def test_load_with_resends_slow_stalled_and_hostile_clients(loaded: ServerProcess) -> None:
    server = loaded
    baseline = vmrss_kib(server.pid)
    shared = Shared()
    sampler = threading.Thread(target=memory_sampler, args=(server, shared), daemon=True)
    sampler.start()
    threads = [guarded(shared, f"sender-{n}", lambda n=n: sender(server, shared, n)) for n in range(SENDERS)]
    threads += [guarded(shared, f"receiver-{n}", lambda: receiver(server, shared)) for n in range(RECEIVERS)]
    background = [
        guarded(shared, "slow", lambda: slow_consumer(server, shared)),
        guarded(shared, "stalled", lambda: stalled(server, shared)),
        guarded(shared, "hostile", lambda: hostile(server, shared)),
    ]
    for thread in threads[:SENDERS]:
        thread.join()
    shared.senders_done.set()
    for thread in threads[SENDERS:] + background:
        thread.join(timeout=180)
    shared.stop.set()
    assert not shared.errors, shared.errors
    assert server.alive()
    # exact counts: each acknowledged message delivered exactly once, nothing more
    assert shared.acknowledged, "nothing was sent"
    duplicates = {m: n for m, n in shared.received.items() if n > 1}
    assert not duplicates, f"delivered twice: {sorted(duplicates)[:10]}"
    assert set(shared.received) == shared.acknowledged, (
        f"lost: {sorted(shared.acknowledged - set(shared.received))[:10]}, "
        f"unexpected: {sorted(set(shared.received) - shared.acknowledged)[:10]}"
    )
    stats = json.loads(server.cli("stats", "load", "--json"))
    stats = stats[0] if isinstance(stats, list) else stats
    assert stats["accepted"] == len(shared.acknowledged)
    assert stats["duplicates_dropped"] == shared.resends
    assert stats["active_message_count"] == 0 and stats["dead_letter_message_count"] == 0
    assert sum(shared.hostile_actions.values()) >= 5, shared.hostile_actions
    grown_mib = (shared.peak_rss_kib - baseline) / 1024
    assert grown_mib < MEMORY_BOUND_MIB, f"server memory grew by {grown_mib:.0f} MiB"
    tracebacks = [line for line in server.output if "Traceback" in line]
    assert not tracebacks, "\n".join(server.output[-80:])
    print(
        f"load: {len(shared.acknowledged)} distinct messages, {shared.resends} resent, "
        f"hostile actions {dict(shared.hostile_actions)}, peak server memory +{grown_mib:.0f} MiB"
    )
