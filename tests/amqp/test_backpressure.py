"""A receiver that grants large credit and never reads: the server takes (and locks) no more than it can send.

The server runs on a test clock (``ONCEBUS_CLOCK_FILE``) so lock expiry is a clock step, not a wait.
Before backpressure, the server pulled every message into its write buffer (memory grew by the whole
queue) and re-delivered each one whose lock expired there, until all were dead-lettered.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode, ServiceBusSubQueue

from tests.amqp.conftest import ServerProcess, TestClock, topology
from tests.amqp.raw import ATTACH, RawClient, attach_frame, flow_frame, vmrss_kib

COUNT = 600
SIZE = 48 * 1024  # 600 x 48 KiB = 28 MiB of messages


@pytest.fixture(scope="module")
def clocked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, TestClock]]:
    base = tmp_path_factory.mktemp("backpressure")
    clock = TestClock(base / "clock")
    queues = {
        "stall": {"LockDuration": "PT5S", "MaxDeliveryCount": 2},
        "stalldelete": {},
    }
    process = ServerProcess(base / "data", topology(queues, {}), clock_file=clock.path).start()
    yield process, clock
    process.stop()


def fill(client: ServiceBusClient, queue: str) -> None:
    with client.get_queue_sender(queue) as sender:
        batch = sender.create_message_batch()
        for i in range(COUNT):
            message = ServiceBusMessage(b"%06d" % i + b"x" * (SIZE - 6), message_id=f"m{i}")
            try:
                batch.add_message(message)
            except ValueError:
                sender.send_messages(batch)
                batch = sender.create_message_batch()
                batch.add_message(message)
        sender.send_messages(batch)


def stalled_receiver(server: ServerProcess, queue: str, *, receive_and_delete: bool) -> RawClient:
    """A raw receiver with a tiny socket buffer that grants 100,000 credits and never reads."""
    client = RawClient.__new__(RawClient)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.port))
    client.port, client.sock, client.timeout = server.port, sock, 10.0
    client.buffer, client.headers, client.eof, client.next_delivery_id = b"", [], False, 0
    client.handshake()
    assert client.put_token(queue) == 202
    settle = {"send_settle_mode": 1, "rcv_settle_mode": 0} if receive_and_delete else {}
    client.send(attach_frame("stalled", 1, queue, sender=False, **settle))
    client.expect(ATTACH)
    client.send(flow_frame(1, 100_000))
    return client


def settle_time(server: ServerProcess, seconds: float = 2.0) -> None:
    """Give the server time to push what it can (real time, not the broker's)."""
    assert server.alive()
    time.sleep(seconds)


def test_a_receiver_that_never_reads_gets_no_more_than_the_bound(clocked: tuple[ServerProcess, TestClock]) -> None:
    server, clock = clocked
    with ServiceBusClient.from_connection_string(server.connection_string) as client:
        fill(client, "stall")
        settle_time(server, 0.5)
        before = vmrss_kib(server.pid)
        stalled = stalled_receiver(server, "stall", receive_and_delete=False)
        try:
            settle_time(server)
            grown_mib = (vmrss_kib(server.pid) - before) / 1024
            assert grown_mib < 12, f"the server buffered {grown_mib:.0f} MiB for a client that does not read"
            # the locks of what was sent expire; nothing more is taken for the stalled client, so no message
            # reaches its max delivery count (2) inside the server
            for _ in range(3):
                clock.set(clock.now_us + 6_000_000)
                settle_time(server, 0.7)
            got: dict[str, int] = {}
            with client.get_queue_receiver("stall", max_wait_time=5, prefetch_count=20) as receiver:
                while batch := receiver.receive_messages(max_message_count=50, max_wait_time=3):
                    for message in batch:
                        got[str(message.message_id)] = got.get(str(message.message_id), 0) + 1
                        receiver.complete_message(message)
            with client.get_queue_receiver(
                "stall", sub_queue=ServiceBusSubQueue.DEAD_LETTER, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
            ) as dead:
                dead_letters = dead.receive_messages(max_message_count=COUNT, max_wait_time=2)
            assert [m.message_id for m in dead_letters] == []
            assert sorted(got) == sorted(f"m{i}" for i in range(COUNT))
            assert set(got.values()) == {1}
        finally:
            stalled.close()


def test_receive_and_delete_to_a_stalled_client_takes_only_what_fits(
    clocked: tuple[ServerProcess, TestClock],
) -> None:
    """RECEIVE_AND_DELETE removes a message when it is taken: only what the client's buffers hold may go."""
    server, _ = clocked
    with ServiceBusClient.from_connection_string(server.connection_string) as client:
        fill(client, "stalldelete")
        settle_time(server, 0.5)
        before = vmrss_kib(server.pid)
        stalled = stalled_receiver(server, "stalldelete", receive_and_delete=True)
        try:
            settle_time(server)
            assert (vmrss_kib(server.pid) - before) / 1024 < 12
            with client.get_queue_receiver(
                "stalldelete", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE, max_wait_time=3
            ) as receiver:
                left = 0
                while batch := receiver.receive_messages(max_message_count=100, max_wait_time=2):
                    left += len(batch)
            taken = COUNT - left
            # the kernel's socket buffers hold a few MiB; the server's own buffer at most 1 MiB and a batch
            assert taken * SIZE < 16 * 1024 * 1024, f"{taken} messages were taken for a client that does not read"
        finally:
            stalled.close()
