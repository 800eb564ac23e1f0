"""AMQP over WebSockets: an AMQP connection's byte stream carried in binary WebSocket messages.

This is how every Service Bus SDK reaches Service Bus through port 443 and HTTP
proxies (``TransportType.AmqpOverWebsocket`` in Python, ``webSocketOptions`` in
JavaScript): an HTTP upgrade on ``/$servicebus/websocket`` with the subprotocol
``AMQPWSB10``, then binary messages whose payloads, put end to end, are exactly
what the client would have written to a TCP socket (SASL and CBS included).
Message boundaries mean nothing: a message may hold part of an AMQP frame or
several frames.

The HTTP door (``oncebus.http.server``) parses the upgrade request and hands the
transport over; from then on :class:`AmqpOverWebSocket` owns it. wsproto (the
h11 family's WebSocket state machine, no I/O of its own) answers the handshake
and unwraps the frames; the unwrapped bytes go to an ordinary
:class:`~oncebus.amqp.connection.AmqpConnection` through
:class:`WebSocketTransport`, an asyncio transport that wraps what the connection
writes in binary messages. The AMQP connection cannot tell it from TCP: the frame
bounds, the handshake and authentication timeouts and the connection cap are the
ones every TCP connection has (the handshake clock starts at the upgrade).

On top, for hostile clients: a message larger than ``websocket_message_size``
(its fragments added up) closes the connection with code 1009 as soon as it
passes the bound (its bytes past the bound never reach AMQP); a text message
with 1003; a frame wsproto cannot parse with the code it names (1002, 1007);
nothing is buffered beyond the frame header being read. A ping is answered with
a pong unless the client is not reading what it is sent. Every close is a close
handshake: our Close frame, then the client's answer (or ``close_flush_timeout``)
ends the TCP connection; after a protocol error the client's bytes are dropped
unread until then.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, cast

from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)
from wsproto.frame_protocol import CloseReason
from wsproto.utilities import RemoteProtocolError

from oncebus.amqp.limits import AmqpLimits

_LOG = logging.getLogger(__name__)

WEBSOCKET_PATH = "/$servicebus/websocket"
# the AMQP WebSocket Binding's subprotocol (the SDKs of Python, JavaScript, Java and .NET ask for it), and "amqp",
# which the Go SDK's WebSocket example asks for; the client's own spelling is echoed
SUBPROTOCOLS = ("amqpwsb10", "amqp")
# what oncebus writes is cut into binary messages of at most this size (aiohttp, under the Python SDK's aio
# client, refuses messages over 4 MiB by default)
OUTGOING_MESSAGE_SIZE = 64 * 1024

Headers = Sequence[tuple[bytes, bytes]]


class WebSocketTransport(asyncio.Transport):
    """What the AMQP connection writes to as if it were its socket: each write goes out in binary messages.

    Ending "our half" (``write_eof``) is sending our Close frame; ``close`` does the same; either way the TCP
    connection ends when the client answers with its Close (or after ``close_flush_timeout``)."""

    def __init__(self, door: AmqpOverWebSocket, protocol: asyncio.Protocol) -> None:
        super().__init__()
        self._door = door
        self._protocol = protocol

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._door.send_binary(bytes(data))

    def is_closing(self) -> bool:
        return self._door.closing

    def close(self) -> None:
        self._door.close(CloseReason.NORMAL_CLOSURE)

    def abort(self) -> None:
        self._door.abort()

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self._door.close(CloseReason.NORMAL_CLOSURE)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._door.transport.get_extra_info(name, default)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._door.transport.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._door.transport.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._door.transport.get_write_buffer_limits()

    def pause_reading(self) -> None:
        self._door.transport.pause_reading()

    def resume_reading(self) -> None:
        self._door.transport.resume_reading()

    def is_reading(self) -> bool:
        return self._door.transport.is_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        raise NotImplementedError("the AMQP connection over a WebSocket cannot be handed to another protocol")

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol


class AmqpOverWebSocket(asyncio.Protocol):
    """One upgraded connection: the WebSocket handshake, then an AMQP connection fed with the messages' bytes.

    ``amqp_connection`` makes the AMQP connection (the one a TCP connection gets); ``target`` and ``headers`` are
    the upgrade request's, already parsed by the HTTP door; ``early_data`` the bytes that followed the request."""

    def __init__(
        self,
        amqp_connection: Callable[[], asyncio.Protocol],
        limits: AmqpLimits,
        target: bytes,
        headers: Headers,
        early_data: bytes = b"",
    ) -> None:
        self.amqp_connection = amqp_connection
        self.limits = limits
        self.target = target
        self.headers = list(headers)
        self.early_data = early_data
        self.ws = WSConnection(ConnectionType.SERVER)
        self.amqp: asyncio.Protocol | None = None
        self._transport: asyncio.Transport | None = None
        self.closing = False  # our Close frame is sent (or the connection is ending without one)
        self.failed = False  # the client broke the WebSocket protocol: its bytes are no longer read
        self.message_bytes = 0  # of the message being received, so far
        self._close_timer: asyncio.TimerHandle | None = None
        self._lost = False

    @property
    def transport(self) -> asyncio.Transport:
        assert self._transport is not None, "the transport is set at connection_made"
        return self._transport

    # --- asyncio protocol --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # (uvloop's transports are not asyncio.Transport's subclasses)
        self._transport = transport
        try:
            subprotocol = self._handshake()
        except Exception as exc:  # whatever wsproto cannot read (a missing header, non-ASCII values) is a 400
            hint = exc.event_hint if isinstance(exc, RemoteProtocolError) else None
            if isinstance(hint, RejectConnection):
                self._reject(hint.status_code, f"not a WebSocket upgrade: {exc}", list(hint.headers))
            else:
                self._reject(400, f"not a WebSocket upgrade: {exc}")
            return
        if subprotocol is None:
            self._reject(
                400,
                f"AMQP over WebSockets needs the subprotocol AMQPWSB10 (Sec-WebSocket-Protocol) on {WEBSOCKET_PATH}",
            )
            return
        # no extensions: permessage-deflate is never negotiated (no compression bombs, nothing to inflate)
        transport.write(self.ws.send(AcceptConnection(subprotocol=subprotocol)))
        self.amqp = self.amqp_connection()
        self.amqp.connection_made(WebSocketTransport(self, self.amqp))
        early, self.early_data = self.early_data, b""
        if early:
            self.data_received(early)

    def _handshake(self) -> str | None:
        """wsproto reads the upgrade request; the subprotocol to answer with (None: the client offers none)."""
        self.ws.initiate_upgrade_connection(self.headers, self.target)
        request = next((e for e in self.ws.events() if isinstance(e, Request)), None)
        if request is None:
            raise RemoteProtocolError("no upgrade request", event_hint=RejectConnection())
        return next((p for p in request.subprotocols if p.lower() in SUBPROTOCOLS), None)

    def _reject(self, status: int, text: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        """Answer the upgrade request with ``status`` and why, then close (no WebSocket was opened)."""
        _LOG.info("refusing a WebSocket upgrade (%d): %s", status, text)
        body = text.encode() + b"\n"
        response = [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
            *(headers or []),
        ]
        self.closing = True
        try:
            data = self.ws.send(RejectConnection(status_code=status, headers=response, has_body=True))
            data += self.ws.send(RejectData(data=body, body_finished=True))
        except Exception:  # the request never reached wsproto's parser (it could not be re-encoded): no answer
            data = b""
        self.transport.write(data)
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self.failed or self.amqp is None or self.ws.state is ConnectionState.CLOSED:
            return  # after a protocol error (or the close handshake) the client's bytes are dropped unread
        try:
            self.ws.receive_data(data)
            for event in self.ws.events():
                if isinstance(event, BytesMessage):
                    self._received(event)
                elif isinstance(event, TextMessage):
                    self._fail(CloseReason.UNSUPPORTED_DATA, "AMQP over WebSockets carries binary messages only")
                elif isinstance(event, Ping):
                    self._pong(event)
                elif isinstance(event, CloseConnection):
                    self._close_received(event)
                if self.failed:
                    return
        except Exception:  # a bug here must still end in a clean close, never a half-open socket
            _LOG.exception("cannot read the client's WebSocket frames")
            self._fail(CloseReason.INTERNAL_ERROR, "oncebus failed to read the frames; see its log")

    def _received(self, message: BytesMessage) -> None:
        if self.closing:
            return  # our Close is sent: what the client sends before its own Close is not read
        size = self.message_bytes + len(message.data)
        limit = self.limits.websocket_message_size
        if size > limit:
            self._fail(
                CloseReason.MESSAGE_TOO_BIG,
                f"a WebSocket message passed {limit} bytes (ONCEBUS_AMQP_WEBSOCKET_MESSAGE_SIZE)",
            )
            return
        self.message_bytes = 0 if message.message_finished else size
        if message.data:
            assert self.amqp is not None
            self.amqp.data_received(bytes(message.data))

    def _pong(self, ping: Ping) -> None:
        # a client that pings without reading the pongs gets none (RFC 6455 lets pongs be skipped)
        if not self.closing and self.transport.get_write_buffer_size() < self.limits.outgoing_buffer_limit:
            self.transport.write(self.ws.send(ping.response()))

    def _close_received(self, event: CloseConnection) -> None:
        state = self.ws.state
        if state is ConnectionState.REMOTE_CLOSING:  # the client closes first: answer, then the TCP connection ends
            self.closing = True
            self.transport.write(self.ws.send(event.response()))
            self.transport.close()
        elif state is ConnectionState.CLOSED:  # the client's answer to our Close
            self.transport.close()
        else:  # wsproto reports a frame it could not parse as a close with the code to answer
            self._fail(event.code, event.reason or "a WebSocket protocol error")

    def eof_received(self) -> bool | None:
        return False  # the transport closes; connection_lost tells the AMQP connection

    def pause_writing(self) -> None:
        if self.amqp is not None:
            self.amqp.pause_writing()

    def resume_writing(self) -> None:
        if self.amqp is not None:
            self.amqp.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        self.closing = True
        if self._close_timer is not None:
            self._close_timer.cancel()
            self._close_timer = None
        if self.amqp is not None:
            self.amqp.connection_lost(exc)

    # --- what the AMQP connection asks for (through WebSocketTransport) --------------------------
    def send_binary(self, data: bytes) -> None:
        if self.closing or self.ws.state is not ConnectionState.OPEN:
            return
        out = bytearray()
        for start in range(0, len(data), OUTGOING_MESSAGE_SIZE):
            out += self.ws.send(BytesMessage(data=data[start : start + OUTGOING_MESSAGE_SIZE]))
        self.transport.write(bytes(out))

    def close(self, code: int, reason: str | None = None) -> None:
        """Send our Close (once); the TCP connection ends at the client's answer or after ``close_flush_timeout``."""
        if self.closing:
            return
        self.closing = True
        if self.ws.state is ConnectionState.OPEN:
            self.transport.write(self.ws.send(CloseConnection(code=code, reason=reason)))
        self._close_timer = asyncio.get_running_loop().call_later(self.limits.close_flush_timeout, self.abort)

    def abort(self) -> None:
        self.closing = True
        if self._transport is not None:
            self._transport.abort()

    def _fail(self, code: int, reason: str) -> None:
        """The client broke the WebSocket protocol (or a bound): say why in our Close, then read nothing more.

        Our half of the TCP stream ends after the Close where it can (plain TCP), so the client closes its own;
        its bytes meanwhile are read and dropped, since closing with them unread would reset the connection and
        could destroy our Close before the client reads it."""
        if self.failed:
            return
        _LOG.warning(
            "closing the WebSocket connection from %s: %d %s", self.transport.get_extra_info("peername"), code, reason
        )
        self.failed = True
        self.close(code, reason)
        if self.transport.can_write_eof():
            try:
                self.transport.write_eof()
            except OSError:
                self.abort()
        amqp, self.amqp = self.amqp, None
        if amqp is not None:  # it stops now (its broker work finishes); ending the transport is ours
            amqp.connection_lost(None)
