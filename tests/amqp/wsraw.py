"""A raw AMQP client over a WebSocket, for hostile-client tests: the frames are built by wsproto's client side.

:class:`WsRawClient` is :class:`~tests.amqp.raw.RawClient` (the SDK's codec, the usual AMQP steps) with every
write sent as a binary WebSocket message and every read unwrapped; the server's WebSocket events (pongs, its
Close frame) are kept for the test to look at, and ``send_raw`` writes bytes with no framing at all.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import time

import h11
from wsproto.connection import Connection, ConnectionType
from wsproto.events import BytesMessage, CloseConnection, Event, Pong, TextMessage
from wsproto.utilities import generate_nonce

from tests.amqp.raw import RawClient

PATH = "/$servicebus/websocket"
SUBPROTOCOL = "AMQPWSB10"


def upgrade_request(
    port: int, *, path: str = PATH, subprotocol: str | None = SUBPROTOCOL, extra: list[tuple[str, str]] | None = None
) -> bytes:
    """The upgrade request a WebSocket client sends (``extra`` replaces headers of the same name)."""
    headers = {
        "Host": f"127.0.0.1:{port}",
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Key": generate_nonce().decode(),
        "Sec-WebSocket-Version": "13",
    }
    if subprotocol is not None:
        headers["Sec-WebSocket-Protocol"] = subprotocol
    for name, value in extra or []:
        headers[name] = value
    head = f"GET {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items() if v) + "\r\n"
    return head.encode()


def read_response(sock: socket.socket, timeout: float = 10.0) -> tuple[h11.Response | h11.InformationalResponse, bytes]:
    """The server's answer to an upgrade request, and what followed its head."""
    client = h11.Connection(h11.CLIENT)
    upgrade = [("Host", "x"), ("Upgrade", "websocket"), ("Connection", "Upgrade")]
    client.send(h11.Request(method="GET", target="/", headers=upgrade))  # so h11 expects a 101 or a response
    client.send(h11.EndOfMessage())
    sock.settimeout(timeout)
    while True:
        event = client.next_event()
        if isinstance(event, h11.Response | h11.InformationalResponse):
            return event, bytes(client.trailing_data[0])
        if event is h11.NEED_DATA:
            data = sock.recv(65536)
            if not data:
                raise AssertionError("the server closed without answering the upgrade")
            client.receive_data(data)


class WsRawClient(RawClient):
    """An AMQP raw client whose bytes travel in WebSocket messages (TLS when ``context`` is given)."""

    def __init__(self, port: int, timeout: float = 10.0, *, context: ssl.SSLContext | None = None) -> None:
        super().__init__(port, timeout)
        if context is not None:
            self.sock = context.wrap_socket(self.sock, server_hostname="127.0.0.1")
        self.ws = Connection(ConnectionType.CLIENT)
        self.events: list[Event] = []  # what the server sent besides binary data (pongs, its Close)
        self.text: list[str] = []
        self.close_code: int | None = None

    def upgrade(self, *, subprotocol: str = SUBPROTOCOL) -> h11.InformationalResponse:
        self.sock.sendall(upgrade_request(self.port, subprotocol=subprotocol))
        response, rest = read_response(self.sock, self.timeout)
        assert response.status_code == 101, response
        assert isinstance(response, h11.InformationalResponse)
        if rest:
            self._unwrap(rest)
        return response

    def send(self, data: bytes) -> None:
        self.sock.sendall(self.ws.send(BytesMessage(data=data)))

    def send_event(self, event: Event) -> None:
        self.sock.sendall(self.ws.send(event))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self, deadline: float) -> bool:
        if self.eof:
            return False
        self.sock.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
            chunk = self.sock.recv(65536)
        except (TimeoutError, ssl.SSLWantReadError):
            return False
        except (ConnectionResetError, ssl.SSLError):
            self.eof = True
            return False
        if not chunk:
            self.eof = True
            return False
        self._unwrap(chunk)
        return True

    def _unwrap(self, chunk: bytes) -> None:
        self.ws.receive_data(chunk)
        for event in self.ws.events():
            if isinstance(event, BytesMessage):
                self.buffer += bytes(event.data)
            elif isinstance(event, TextMessage):
                self.text.append(event.data)
            else:
                self.events.append(event)
                if isinstance(event, CloseConnection):
                    self.close_code = event.code
                    with contextlib.suppress(Exception):  # answer the server's Close, as a client does
                        self.sock.sendall(self.ws.send(event.response()))

    def until_closed(self, timeout: float = 10.0) -> float:
        """Read (dropping AMQP bytes) until the server ends the TCP connection; the seconds it took."""
        started = time.monotonic()
        deadline = started + timeout
        while not self.eof:
            assert time.monotonic() < deadline, f"the server did not close within {timeout} s (events {self.events})"
            self._fill(deadline)
        return time.monotonic() - started

    def pongs(self) -> list[bytes]:
        return [bytes(e.payload) for e in self.events if isinstance(e, Pong)]
