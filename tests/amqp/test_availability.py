"""Issue 18, items 1 and 2: clients without a key cannot lock others out of a port.

``oncebus serve`` runs with its default bounds; the attacks are raw sockets as an outsider would open them, and
the victim is the real SDK (and an HTTPS client) that must still be served, promptly and without a refusal.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode
from azure.servicebus._pyamqp.performatives import SASLInit

from tests.amqp.raw import AMQP_HEADER, SASL_HEADER, frame, open_frame
from tests.http.conftest import Served, start_server

# the first bytes of a TLS ClientHello: a handshake record header and the start of its body, never finished
HALF_CLIENT_HELLO = bytes.fromhex("160301020001") + b"\x00\x01\xfc\x03\x03" + bytes(16)
UNAUTHENTICATED_OPEN = SASL_HEADER + frame(SASLInit(b"ANONYMOUS", None, None), frame_type=b"\x01") + AMQP_HEADER


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    served = start_server(tmp_path_factory.mktemp("avail") / "data")
    subprocess_cli(served, "queue", "create", "victim")
    yield served
    served.stop()


def subprocess_cli(served: Served, *args: str) -> None:
    cmd = [sys.executable, "-m", "oncebus.cli", "--data-dir", str(served.data_dir), *args]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def victim_round_trip(served: Served, tag: str) -> float:
    """One SDK send and receive (no retries: a refusal fails the test); returns the seconds it took."""
    started = time.monotonic()
    with ServiceBusClient.from_connection_string(served.connection_string, retry_total=0) as client:
        with client.get_queue_sender("victim") as sender:
            sender.send_messages(ServiceBusMessage(tag, message_id=tag))
        with client.get_queue_receiver(
            "victim", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE, max_wait_time=5
        ) as receiver:
            got = receiver.receive_messages(max_message_count=1, max_wait_time=5)
    assert [str(m) for m in got] == [tag]
    return time.monotonic() - started


def https_health(served: Served, port: int) -> int:
    context = ssl.create_default_context(cafile=served.ca_file)
    with urllib.request.urlopen(f"https://localhost:{port}/health", context=context, timeout=5) as response:
        return int(response.status)


def open_sockets(port: int, count: int, first_bytes: bytes = b"") -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port))
        if first_bytes:
            sock.sendall(first_bytes)
        sockets.append(sock)
    return sockets


def close_all(sockets: list[socket.socket]) -> None:
    for sock in sockets:
        sock.close()


def test_300_idle_sockets_do_not_lock_out_the_sdk(served: Served) -> None:
    idle = open_sockets(served.port, 300)
    try:
        time.sleep(0.3)  # every one accepted
        assert victim_round_trip(served, "after-idle") < 10
        assert https_health(served, served.port) == 200
        idle += open_sockets(served.port, 100)  # and newcomers keep coming
        assert victim_round_trip(served, "after-more-idle") < 10
    finally:
        close_all(idle)


def test_half_client_hellos_do_not_lock_out_the_tls_port(served: Served) -> None:
    stuck = open_sockets(served.tls_port, 300, HALF_CLIENT_HELLO)
    try:
        time.sleep(0.3)
        assert https_health(served, served.tls_port) == 200
    finally:
        close_all(stuck)


def test_1000_connections_that_never_authenticate_do_not_block_the_sdk(served: Served) -> None:
    flood: list[socket.socket] = []
    try:
        for _ in range(1000):
            sock = socket.create_connection(("127.0.0.1", served.port))
            sock.sendall(UNAUTHENTICATED_OPEN + open_frame())
            flood.append(sock)
            assert sock.recv(65536)  # the server took it (SASL answered): it counts from now on
        time.sleep(0.5)
        assert victim_round_trip(served, "after-flood") < 10
    finally:
        close_all(flood)


def test_held_http_connections_do_not_exhaust_the_server(served: Served) -> None:
    """Keep-alive HTTP connections that each made one request: past the HTTP cap the oldest are closed."""
    held: list[socket.socket] = []
    try:
        for _ in range(600):
            sock = socket.create_connection(("127.0.0.1", served.http_port))
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
            held.append(sock)
            sock.recv(65536)  # answered (or closed to make room): the next one comes after
        time.sleep(0.5)
        open_now = sum(1 for sock in held if _still_open(sock))
        assert open_now <= 256, open_now  # HttpLimits.max_connections
        assert victim_round_trip(served, "after-http") < 10
    finally:
        close_all(held)


def _still_open(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return False
    except BlockingIOError:
        return True
    except OSError:
        return False


def test_a_huge_peek_is_capped_as_azure_caps_it(served: Served) -> None:
    """Azure answers a peek of any size with at most a service-limited number of messages (250 observed); oncebus
    returns at most MAX_PEEK_MESSAGES, in order, from where the peek starts."""
    subprocess_cli(served, "queue", "create", "peeked")
    with ServiceBusClient.from_connection_string(served.connection_string, retry_total=0) as client:
        with client.get_queue_sender("peeked") as sender:
            for start in range(0, 1000, 250):
                sender.send_messages(
                    [ServiceBusMessage(f"m{i}", message_id=f"m{i}") for i in range(start, start + 250)]
                )
        with client.get_queue_receiver("peeked") as receiver:
            started = time.monotonic()
            first = receiver.peek_messages(max_message_count=2**31 - 1)
            assert time.monotonic() - started < 5
            assert [m.message_id for m in first] == [f"m{i}" for i in range(250)]
            rest = receiver.peek_messages(max_message_count=2**31 - 1)  # the SDK's peek goes on from there
            assert [m.message_id for m in rest] == [f"m{i}" for i in range(250, 500)]
