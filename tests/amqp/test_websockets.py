"""AMQP over WebSockets: the real azure-servicebus SDK with ``TransportType.AmqpOverWebsocket``, and hostile clients.

How the SDK (7.15) builds its WebSocket URL: it appends ``/$servicebus/websocket``
to the host and, with an emulator connection string alone, drops the endpoint's
port (``ws://127.0.0.1/...``: port 80 for the sync client, 443 for aio), so
``custom_endpoint_address="sb://127.0.0.1:<port>"`` is how it reaches oncebus's
port. ``UseDevelopmentEmulator=true`` makes it ``ws://`` (no TLS); without the
flag it is ``wss://`` with the CA given in ``connection_verify``.

The hostile tests speak WebSocket on a raw socket (frames built by wsproto's client
side, see ``wsraw``); the server runs with short handshake, request and close
timeouts and a 256 KiB WebSocket message bound.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, TransportType
from azure.servicebus._pyamqp.performatives import CloseFrame, SASLInit
from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient
from azure.servicebus.exceptions import ServiceBusError
from azure.servicebus.management import ServiceBusAdministrationClient
from wsproto.events import BytesMessage, CloseConnection, Ping, TextMessage

from oncebus.server.certs import CA_FILE, TLS_DIR
from tests.amqp.conftest import ServerProcess, topology
from tests.amqp.raw import AMQP_HEADER, CLOSE, OPEN, SASL_HEADER, SASL_MECHANISMS, error_of, frame, open_frame
from tests.amqp.wsraw import WsRawClient, read_response, upgrade_request

TIMEOUT = 3.0  # the handshake, HTTP request and close-flush timeouts of the module's server
MESSAGE_LIMIT = 256 * 1024
QUICK = TIMEOUT / 2  # seconds: a close by handshake, well before any timeout
QUEUES: dict[str, dict[str, Any]] = {
    "ws-main": {"RequiresDuplicateDetection": True},
    "ws-http": {"RequiresDuplicateDetection": True},
    "wss-main": {"RequiresDuplicateDetection": True},
    "wss-tls": {"RequiresDuplicateDetection": True},
    "ws-aio": {"RequiresDuplicateDetection": True},
    "ws-sessions": {"RequiresSession": True},
    "ws-admin": {},
    "ws-probe": {},
}


@dataclass
class WsServer:
    process: ServerProcess
    tls_port: int
    http_port: int
    ca_file: str

    @property
    def port(self) -> int:
        return self.process.port

    @property
    def connection_string(self) -> str:
        return self.process.connection_string

    def tls_connection_string(self) -> str:
        return self.connection_string.replace(";UseDevelopmentEmulator=true", "")


def _port_of(output: list[str], label: str) -> int:
    for line in output:
        if m := re.match(rf"{label} on [^ ]+:(\d+) ", line):
            return int(m.group(1))
    raise AssertionError(f"no {label} port in {output}")


@pytest.fixture(scope="module")
def ws_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WsServer]:
    base = tmp_path_factory.mktemp("websockets")
    env = {
        "ONCEBUS_AMQP_HANDSHAKE_TIMEOUT": str(TIMEOUT),
        "ONCEBUS_AMQP_CLOSE_FLUSH_TIMEOUT": str(TIMEOUT),
        "ONCEBUS_HTTP_REQUEST_TIMEOUT": str(TIMEOUT),
        "ONCEBUS_AMQP_WEBSOCKET_MESSAGE_SIZE": str(MESSAGE_LIMIT),
    }
    process = ServerProcess(base / "data", topology(QUEUES, {}), env=env).start()
    ca_file = str(Path(process.data_dir) / TLS_DIR / CA_FILE)
    yield WsServer(process, _port_of(process.output, "TLS"), _port_of(process.output, "HTTP"), ca_file)
    process.stop()


def ws_client(server: WsServer, port: int, *, tls: bool = False) -> ServiceBusClient:
    if tls:
        return ServiceBusClient.from_connection_string(
            server.tls_connection_string(),
            transport_type=TransportType.AmqpOverWebsocket,
            custom_endpoint_address=f"sb://127.0.0.1:{port}",
            connection_verify=server.ca_file,
        )
    return ServiceBusClient.from_connection_string(
        server.connection_string,
        transport_type=TransportType.AmqpOverWebsocket,
        custom_endpoint_address=f"sb://127.0.0.1:{port}",
    )


def _send_resend_receive(client: ServiceBusClient, queue: str) -> list[tuple[str, str]]:
    """Send 1, resend 1, a batch of 2, 3, 2; receive and complete all; what was received."""
    with client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage("one", message_id="1"))
        sender.send_messages(ServiceBusMessage("one again", message_id="1"))  # a resend: dropped
        batch = sender.create_message_batch()
        for message_id in ("2", "3", "2"):
            batch.add_message(ServiceBusMessage(f"batch {message_id}", message_id=message_id))
        sender.send_messages(batch)
    received: list[tuple[str, str]] = []
    with client.get_queue_receiver(queue, max_wait_time=2) as receiver:
        for _ in range(5):
            got = receiver.receive_messages(max_message_count=10, max_wait_time=2)
            for message in got:
                receiver.complete_message(message)
            received += [(str(m.message_id), str(m)) for m in got]
            if len(received) >= 3:
                break
        assert receiver.receive_messages(max_message_count=10, max_wait_time=1) == []  # completed: gone
    return sorted(received)


EXPECTED = [("1", "one"), ("2", "batch 2"), ("3", "batch 3")]


# --- the SDK ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["main", "http"])
def test_sdk_over_ws_sends_drops_the_resend_receives_and_completes(ws_server: WsServer, which: str) -> None:
    """Plain ws:// on the main port (sniffed as HTTP) and on the HTTP port, which admits nothing but HTTP: the
    SDK's AMQP can only have reached it through the WebSocket."""
    port = ws_server.port if which == "main" else ws_server.http_port
    with ws_client(ws_server, port) as client:
        assert _send_resend_receive(client, f"ws-{which}") == EXPECTED


@pytest.mark.parametrize("which", ["main", "tls"])
def test_sdk_over_wss_on_the_main_and_the_tls_port(ws_server: WsServer, which: str) -> None:
    port = ws_server.port if which == "main" else ws_server.tls_port
    with ws_client(ws_server, port, tls=True) as client:
        assert _send_resend_receive(client, f"wss-{which}") == EXPECTED


def test_aio_sdk_over_ws_with_sessions(ws_server: WsServer) -> None:
    async def scenario() -> None:
        async with AsyncServiceBusClient.from_connection_string(
            ws_server.connection_string,
            transport_type=TransportType.AmqpOverWebsocket,
            custom_endpoint_address=f"sb://127.0.0.1:{ws_server.port}",
        ) as client:
            async with client.get_queue_sender("ws-aio") as sender:
                await sender.send_messages(
                    [ServiceBusMessage("x", message_id="a"), ServiceBusMessage("y", message_id="a")]
                )
            async with client.get_queue_receiver("ws-aio", max_wait_time=2) as receiver:
                got = await receiver.receive_messages(max_message_count=10, max_wait_time=2)
                assert [(m.message_id, str(m)) for m in got] == [("a", "x")]
                await receiver.complete_message(got[0])
            async with client.get_queue_sender("ws-sessions") as sender:
                await sender.send_messages(
                    [ServiceBusMessage(f"{s}-{i}", session_id=s) for s in ("s1", "s2") for i in range(2)]
                )
            async with client.get_queue_receiver("ws-sessions", session_id="s2", max_wait_time=2) as receiver:
                session = receiver.session
                assert session is not None
                await session.set_state(b"halfway")
                got = await receiver.receive_messages(max_message_count=10, max_wait_time=2)
                assert [str(m) for m in got] == ["s2-0", "s2-1"]
                for message in got:
                    await receiver.complete_message(message)
                assert await session.get_state() == b"halfway"

    asyncio.run(scenario())


def test_sync_sdk_sessions_over_wss(ws_server: WsServer) -> None:
    with ws_client(ws_server, ws_server.port, tls=True) as client:
        with client.get_queue_sender("ws-sessions") as sender:
            sender.send_messages(ServiceBusMessage("t-0", session_id="s3"))
        with client.get_queue_receiver("ws-sessions", session_id="s3", max_wait_time=2) as receiver:
            got = receiver.receive_messages(max_message_count=10, max_wait_time=2)
            assert [str(m) for m in got] == ["t-0"]
            receiver.complete_message(got[0])


def test_the_admin_client_is_served_beside_the_websockets(ws_server: WsServer) -> None:
    """The same port answers the administration client's HTTPS and the SDK's WebSocket, one after the other."""
    with ServiceBusAdministrationClient.from_connection_string(
        ws_server.connection_string, connection_verify=ws_server.ca_file
    ) as admin:
        assert admin.get_queue("ws-admin").requires_duplicate_detection is False
        with ws_client(ws_server, ws_server.port) as client:
            with client.get_queue_sender("ws-admin") as sender:
                sender.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])
            assert admin.get_queue_runtime_properties("ws-admin").active_message_count == 2
            with client.get_queue_receiver("ws-admin", max_wait_time=2) as receiver:
                for message in receiver.receive_messages(max_message_count=10, max_wait_time=2):
                    receiver.complete_message(message)
        assert admin.get_queue_runtime_properties("ws-admin").active_message_count == 0


@pytest.mark.parametrize("kind", ["sync", "aio"])
def test_the_sdk_drops_the_emulator_strings_port_for_websockets(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Why the README says ``custom_endpoint_address``: the emulator string's port never reaches the URL (a test
    that fails, and says so, the day the SDK keeps it)."""
    urls: list[str] = []

    class Refused(ConnectionRefusedError):
        pass

    def connect(url: str, *args: Any, **kwargs: Any) -> Any:
        urls.append(str(url))
        raise Refused("recorded")

    conn = (
        "Endpoint=sb://127.0.0.1:5999;SharedAccessKeyName=RootManageSharedAccessKey;"
        "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true"
    )
    if kind == "sync":
        import websocket

        monkeypatch.setattr(websocket, "create_connection", connect)
        with ServiceBusClient.from_connection_string(
            conn, transport_type=TransportType.AmqpOverWebsocket, retry_total=0
        ) as client:
            with pytest.raises(ServiceBusError), client.get_queue_sender("q") as sender:
                sender.send_messages(ServiceBusMessage("x"))
        assert urls and set(urls) == {"ws://127.0.0.1/$servicebus/websocket"}  # port 80
    else:
        import aiohttp

        async def ws_connect(self: Any, url: str, *args: Any, **kwargs: Any) -> Any:
            return connect(url)

        monkeypatch.setattr(aiohttp.ClientSession, "ws_connect", ws_connect)

        async def scenario() -> None:
            async with AsyncServiceBusClient.from_connection_string(
                conn, transport_type=TransportType.AmqpOverWebsocket, retry_total=0
            ) as client:
                with pytest.raises(ServiceBusError):
                    async with client.get_queue_sender("q") as sender:
                        await sender.send_messages(ServiceBusMessage("x"))

        asyncio.run(scenario())
        assert urls and set(urls) == {"ws://127.0.0.1:443/$servicebus/websocket"}


# --- hostile clients -------------------------------------------------------------------------------
def _probe(server: WsServer) -> None:
    """An SDK client over a WebSocket still sends and receives."""
    with ws_client(server, server.port) as client:
        with client.get_queue_sender("ws-probe") as sender:
            sender.send_messages(ServiceBusMessage("probe"))
        with client.get_queue_receiver("ws-probe", max_wait_time=2) as receiver:
            got = receiver.receive_messages(max_message_count=10, max_wait_time=2)
            assert [str(m) for m in got] == ["probe"]
            receiver.complete_message(got[0])


def test_an_upgrade_request_that_never_ends_is_closed_after_the_request_timeout(ws_server: WsServer) -> None:
    with socket.create_connection(("127.0.0.1", ws_server.port), timeout=10) as sock:
        started = time.monotonic()
        sock.sendall(upgrade_request(ws_server.port)[:-2])  # the blank line never comes
        response, _ = read_response(sock)
        assert response.status_code == 408
        while sock.recv(65536):  # the rest of the answer, then the end
            pass
        assert TIMEOUT * 0.8 <= time.monotonic() - started < TIMEOUT + 5


@pytest.mark.parametrize("sent", ["nothing", "a protocol header"])
def test_an_upgraded_connection_without_an_amqp_handshake_is_closed_after_the_handshake_timeout(
    ws_server: WsServer, sent: str
) -> None:
    with WsRawClient(ws_server.port) as client:
        started = time.monotonic()
        response = client.upgrade()
        assert dict(response.headers)[b"sec-websocket-protocol"] == b"AMQPWSB10"
        if sent != "nothing":
            client.send(SASL_HEADER)
        client.until_closed(TIMEOUT + 5)
        assert client.close_code == 1000
        assert TIMEOUT * 0.8 <= time.monotonic() - started < TIMEOUT + 5


def test_fragmented_messages_with_pings_between_carry_the_amqp_stream(ws_server: WsServer) -> None:
    """The SASL exchange and the open in fragments of odd sizes, a ping between two fragments (answered with its
    payload), the first bytes sent in the same write as the upgrade request."""
    with WsRawClient(ws_server.port) as client:
        client.send_raw(upgrade_request(ws_server.port) + client.ws.send(BytesMessage(data=SASL_HEADER)))
        response, rest = read_response(client.sock)
        assert response.status_code == 101
        client._unwrap(rest)
        client.expect(SASL_MECHANISMS)
        init = frame(SASLInit(b"ANONYMOUS", None, None), frame_type=b"\x01")
        stream = init + AMQP_HEADER + open_frame()
        cuts = [0, 3, 11, len(init) + 5, len(stream)]
        for i, (start, end) in enumerate(itertools.pairwise(cuts)):
            finished = end == len(stream)
            client.send_event(BytesMessage(data=stream[start:end], message_finished=finished))
            if i == 1:
                client.send_event(Ping(payload=b"still there?"))
        client.expect(OPEN)
        assert client.pongs() == [b"still there?"]
        client.send_event(CloseConnection(code=1000))
        assert client.until_closed(5) < QUICK  # by the close handshake, not a timeout
        assert client.close_code == 1000


@pytest.mark.parametrize("shape", ["one frame", "fragments"])
def test_a_message_over_the_bound_closes_the_connection_with_1009(ws_server: WsServer, shape: str) -> None:
    """After a real handshake, heartbeats (empty AMQP frames, harmless to AMQP) in one message past the bound."""
    heartbeats = struct.pack(">IBBH", 8, 2, 0, 0) * ((MESSAGE_LIMIT + 4096) // 8)
    with WsRawClient(ws_server.port) as client:
        client.upgrade()
        client.handshake(begin=False)
        if shape == "one frame":
            client.send(heartbeats)
        else:
            third = len(heartbeats) // 3
            for start in range(0, len(heartbeats), third):
                client.send_event(BytesMessage(data=heartbeats[start : start + third], message_finished=False))
                if client.eof:
                    break
        assert client.until_closed(TIMEOUT + 5) < QUICK  # by the close handshake, not a timeout
        assert client.close_code == 1009
    _probe(ws_server)


def test_a_message_under_the_bound_is_served(ws_server: WsServer) -> None:
    heartbeats = struct.pack(">IBBH", 8, 2, 0, 0) * ((MESSAGE_LIMIT - 4096) // 8)
    with WsRawClient(ws_server.port) as client:
        client.upgrade()
        client.handshake()
        client.send(heartbeats)
        assert client.put_token("ws-probe") == 202  # the connection still works after the large message


def test_a_text_message_closes_the_connection_with_1003(ws_server: WsServer) -> None:
    with WsRawClient(ws_server.port) as client:
        client.upgrade()
        client.send_event(TextMessage(data="AMQP\x03\x01\x00\x00"))
        assert client.until_closed(TIMEOUT + 5) < QUICK  # by the close handshake, not a timeout
        assert client.close_code == 1003


@pytest.mark.parametrize(
    "garbage",
    [b"\xff" * 64, b"AMQP\x00\x01\x00\x00", b"\x82\x05hello", b"\x8f\x80\x00\x00\x00\x00"],
    ids=["bytes", "amqp-unframed", "unmasked", "bad-opcode"],
)
def test_garbage_after_the_upgrade_closes_cleanly_and_another_client_goes_on(
    ws_server: WsServer, garbage: bytes
) -> None:
    with ws_client(ws_server, ws_server.port) as other:
        with other.get_queue_sender("ws-probe") as sender:
            sender.send_messages(ServiceBusMessage("before"))
            with WsRawClient(ws_server.port) as client:
                client.upgrade()
                client.send_raw(garbage)
                assert client.until_closed(TIMEOUT + 5) < QUICK  # by the close handshake, not a timeout
                assert client.close_code == 1002
            sender.send_messages(ServiceBusMessage("after"))
        with other.get_queue_receiver("ws-probe", max_wait_time=2) as receiver:
            got = receiver.receive_messages(max_message_count=10, max_wait_time=2)
            assert sorted(str(m) for m in got) == ["after", "before"]
            for message in got:
                receiver.complete_message(message)


def test_amqp_garbage_inside_binary_messages_gets_amqps_answer_then_a_close(ws_server: WsServer) -> None:
    with WsRawClient(ws_server.port) as client:
        client.upgrade()
        client.send(b"HTTP/1.1 200 OK\r\n\r\n")
        assert client.until_closed(TIMEOUT + 5) < QUICK  # by the close handshake, not a timeout
        assert client.buffer == AMQP_HEADER  # what AMQP answers a wrong protocol header with
        assert client.close_code == 1000


def test_the_client_closing_first_gets_the_close_answered(ws_server: WsServer) -> None:
    with WsRawClient(ws_server.port) as client:
        client.upgrade()
        client.handshake()
        client.send_event(CloseConnection(code=1001, reason="going away"))
        assert client.until_closed(5) < QUICK
        assert client.close_code == 1001


def test_the_amqp_close_exchange_ends_with_the_websocket_close(ws_server: WsServer) -> None:
    with WsRawClient(ws_server.port) as client:
        client.upgrade()
        client.handshake(begin=False)
        client.send(frame(CloseFrame(None)))
        client.expect(CLOSE)
        assert client.until_closed(5) < QUICK
        assert client.close_code == 1000


def test_an_upgrade_in_absolute_form_as_the_java_sdk_sends_it(ws_server: WsServer) -> None:
    """The Java SDK (proton-j's WebSocket layer, azure-core-amqp 2.12.0) asks for
    ``GET https://127.0.0.1/$servicebus/websocket`` (the absolute form, which RFC 9112 3.2.2 says a server must
    accept), with ``Connection: Upgrade,Keep-Alive`` and a Host without the port. Failed before: the target was
    taken whole as the path, the upgrade went to the application (501) and the SDK waited for ever."""
    request = upgrade_request(
        ws_server.port,
        path="https://127.0.0.1/$servicebus/websocket",
        extra=[("Connection", "Upgrade,Keep-Alive"), ("Host", "127.0.0.1")],
    )
    with WsRawClient(ws_server.port) as client:
        client.send_raw(request)
        response, rest = read_response(client.sock)
        assert response.status_code == 101
        assert dict(response.headers)[b"sec-websocket-protocol"] == b"AMQPWSB10"
        client._unwrap(rest)
        client.send(SASL_HEADER)
        client.expect(SASL_MECHANISMS)


@pytest.mark.parametrize(
    ("request_bytes", "status", "says"),
    [
        ("no-subprotocol", 400, b"AMQPWSB10"),
        ("version-8", 426, b"Sec-WebSocket-Version"),
        ("no-key", 400, b"Sec-WebSocket-Key"),
        ("other-path", 501, b"/$servicebus/websocket"),
    ],
)
def test_upgrades_oncebus_cannot_serve_are_answered_and_closed(
    ws_server: WsServer, request_bytes: str, status: int, says: bytes
) -> None:
    port = ws_server.port
    data = {
        "no-subprotocol": upgrade_request(port, subprotocol=None),
        "version-8": upgrade_request(port, extra=[("Sec-WebSocket-Version", "8")]),
        "no-key": upgrade_request(port, extra=[("Sec-WebSocket-Key", "")]),
        "other-path": upgrade_request(port, path="/somewhere"),
    }[request_bytes]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        response, body = read_response(sock)
        assert response.status_code == status
        length = int(dict(response.headers)[b"content-length"])
        while len(body) < length and (chunk := sock.recv(65536)):
            body += chunk
        assert says in body
        if status != 501:  # refused upgrades close; the application's answer keeps the connection alive
            assert sock.recv(65536) == b""


def test_the_amqp_connection_bounds_apply_to_websockets(tmp_path: Path) -> None:
    """Connections waiting for a token are bounded per address as on TCP: past two, the oldest is closed with the
    AMQP reason (inside a binary message), then the WebSocket close."""
    env = {"ONCEBUS_AMQP_MAX_UNAUTHENTICATED_PER_PEER": "2"}
    process = ServerProcess(tmp_path / "data", topology({"q": {}}, {}), env=env).start()
    try:
        clients = [WsRawClient(process.port) for _ in range(3)]
        try:
            for client in clients[:2]:
                client.upgrade()
                client.handshake(begin=False)
            clients[2].upgrade()
            clients[2].handshake()
            closed = clients[0].expect(CLOSE)
            assert error_of(closed)[0] == "amqp:resource-limit-exceeded"
            assert clients[0].until_closed(10) < QUICK  # by the close handshake, not a timeout
            assert clients[0].close_code == 1000
            assert clients[2].put_token("q") == 202  # the newcomer is served
        finally:
            for client in clients:
                client.close()
    finally:
        process.stop()
