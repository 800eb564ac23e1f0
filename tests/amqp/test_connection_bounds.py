"""Bounds on connections themselves: a cap on how many are served, and a deadline for the first token.

The server runs with ``ONCEBUS_AMQP_MAX_CONNECTIONS=3`` and ``ONCEBUS_AMQP_AUTH_TIMEOUT=1.5``.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode
from azure.servicebus._pyamqp.performatives import SASLInit
from azure.servicebus.exceptions import ServiceBusError

from tests.amqp.conftest import ServerProcess, topology
from tests.amqp.raw import (
    AMQP_HEADER,
    CLOSE,
    OPEN,
    SASL_HEADER,
    SASL_MECHANISMS,
    SASL_OUTCOME,
    RawClient,
    error_of,
    frame,
    open_frame,
)

MAX_CONNECTIONS = 3
AUTH_TIMEOUT = 1.5


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    env = {"ONCEBUS_AMQP_MAX_CONNECTIONS": str(MAX_CONNECTIONS), "ONCEBUS_AMQP_AUTH_TIMEOUT": str(AUTH_TIMEOUT)}
    base = tmp_path_factory.mktemp("bounded")
    process = ServerProcess(base / "data", topology({"capped": {}}, {}), env=env).start()
    yield process
    process.stop()


def send_and_receive(server: ServerProcess, tag: str) -> None:
    with ServiceBusClient.from_connection_string(server.connection_string) as client:
        with client.get_queue_sender("capped") as sender:
            sender.send_messages(ServiceBusMessage(tag, message_id=tag))
        with client.get_queue_receiver(
            "capped", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE, max_wait_time=5
        ) as receiver:
            assert [str(m) for m in receiver.receive_messages(max_message_count=5, max_wait_time=5)] == [tag]


def test_an_open_connection_without_a_token_is_closed_after_the_auth_timeout(bounded: ServerProcess) -> None:
    with RawClient(bounded.port) as client:
        client.handshake()
        started = time.monotonic()
        frames = client.frames_until_closed(AUTH_TIMEOUT + 5)
        waited = time.monotonic() - started
    assert waited >= AUTH_TIMEOUT * 0.9
    condition, description = error_of([f for f in frames if f.code == CLOSE][-1])
    assert condition == "amqp:unauthorized-access"
    assert "no valid token was put on $cbs within 1.5 s" in description
    send_and_receive(bounded, "after-auth-timeout")


def test_a_connection_with_a_token_stays_past_the_auth_timeout(bounded: ServerProcess) -> None:
    with RawClient(bounded.port) as client:
        client.handshake()
        assert client.put_token("capped") == 202
        time.sleep(AUTH_TIMEOUT + 1.5)
        assert client.put_token("capped", handles=(102, 103)) == 202  # still served


def _hold_the_cap(bounded: ServerProcess) -> list[RawClient]:
    """As many authenticated connections as the cap allows: the next one is refused at its open."""
    held = [RawClient(bounded.port) for _ in range(MAX_CONNECTIONS)]
    for client in held:
        client.handshake()
        assert client.put_token("capped") == 202
    return held


def test_connections_over_the_cap_are_closed_at_their_open_with_the_reason(bounded: ServerProcess) -> None:
    held = _hold_the_cap(bounded)
    try:
        with RawClient(bounded.port) as extra:
            extra.handshake(begin=False)  # the open is answered (AMQP asks for it), then closed
            frames = extra.frames_until_closed(5)
        closes = [f for f in frames if f.code == CLOSE]
        assert closes, frames
        condition, description = error_of(closes[-1])
        assert condition == "amqp:resource-limit-exceeded"
        assert f"at most {MAX_CONNECTIONS} AMQP connections" in description
        # the SDK gets the same answer, as an error naming the limit
        with ServiceBusClient.from_connection_string(bounded.connection_string, retry_total=0) as client:
            with pytest.raises(ServiceBusError, match="at most 3 AMQP connections"):
                with client.get_queue_sender("capped") as sender:
                    sender.send_messages(ServiceBusMessage(b"x", message_id="over-the-cap"))
    finally:
        for client in held:
            client.close()
    # closing the held connections frees their places
    deadline = time.monotonic() + 10
    while True:
        try:
            send_and_receive(bounded, "after-cap")
            break
        except ServiceBusError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_a_refused_connection_gets_our_header_before_the_open_and_close_when_its_header_and_open_come_at_once(
    bounded: ServerProcess,
) -> None:
    """azure-servicebus 7.14 read "illegal state" instead of the reason when the AMQP header and open of a refused
    connection reached the server in one read (seen in CI): the answer must be our header, then open, then close."""
    held = _hold_the_cap(bounded)
    try:
        with RawClient(bounded.port) as extra:
            extra.send(SASL_HEADER)
            extra.expect(SASL_MECHANISMS)
            extra.send(frame(SASLInit(b"ANONYMOUS", None, None), frame_type=b"\x01"))
            extra.expect(SASL_OUTCOME)
            assert extra.buffer == b""
            extra.send(AMQP_HEADER + open_frame())  # one write: one read on the server
            data = b""
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                extra.sock.settimeout(max(deadline - time.monotonic(), 0.01))
                try:
                    chunk = extra.sock.recv(65536)
                except (TimeoutError, ConnectionResetError):
                    break
                if not chunk:
                    break
                data += chunk
        assert data.startswith(AMQP_HEADER), data[:16]
        codes = []
        pos = 8
        while pos + 8 <= len(data):
            size, doff = struct.unpack_from(">IB", data, pos)
            codes.append(data[pos + doff * 4 + 2])
            pos += size
        assert codes == [OPEN, CLOSE]
    finally:
        for client in held:
            client.close()
