"""One port, every way in: a listener that sniffs each connection's first bytes.

Each accepted socket is peeked at (``MSG_PEEK``: nothing is consumed) until its
first bytes tell what it speaks:

* ``AMQP`` (the AMQP 1.0 or SASL protocol header) -> oncebus's AMQP connection;
* a TLS handshake record (``0x16 0x03``) -> TLS with the local certificate,
  then, on the first decrypted bytes, AMQP again (``amqps``) or HTTP (HTTPS);
* an HTTP method and a space -> plain HTTP.

Peeking rather than reading is what lets TLS start on the untouched socket
(``loop.connect_accepted_socket(..., ssl=context)``), so asyncio's own TLS
does the handshake; inside TLS the decrypted bytes are read by a small
protocol that then hands the transport (and those bytes) over with
``transport.set_protocol``.

Every step is bounded: a connection must show its kind within ``sniff_timeout``
seconds (``pressure_sniff_timeout`` once half of ``max_pending`` are undecided),
the TLS handshake within ``handshake_timeout`` and its first decrypted bytes
within the sniff timeout; anything else is closed. At most ``max_pending``
connections may be undecided at once (TLS handshakes and the wait for the first
decrypted bytes included), at most ``max_pending_per_peer`` from one address:
past either bound the *oldest* undecided connection (of that address, or of the
address holding the most) is closed, never the newcomer, so idle sockets cannot
lock a client out, even one on the same address as the attacker (every local
client is 127.0.0.1). Each listener admits a subset of the kinds (the TLS port
only TLS, the HTTP port only plain HTTP).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import select
import socket
import ssl
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import cast

from oncebus.amqp.limits import OldestFirst

_LOG = logging.getLogger(__name__)

AMQP, TLS, HTTP = "amqp", "tls", "http"
ALL_KINDS = frozenset({AMQP, TLS, HTTP})
HTTP_METHODS = (b"GET", b"PUT", b"POST", b"DELETE", b"HEAD", b"OPTIONS", b"PATCH")
PEEK_BYTES = 8
POLL_SECONDS = 0.02


def classify(data: bytes) -> str | None:
    """The kind of a connection from its first bytes: AMQP, TLS, HTTP, "" (unknown), None (undecided)."""
    if not data:
        return None
    if data[:4] == b"AMQP":
        return AMQP
    if len(data) < 4 and b"AMQP".startswith(data):
        return None
    if data[0] == 0x16:
        if len(data) == 1:
            return None
        return TLS if data[1] == 0x03 else ""
    for method in HTTP_METHODS:
        token = method + b" "
        if data.startswith(token):
            return HTTP
        if token.startswith(data[: len(token)]):
            return None
    return ""


@dataclass(frozen=True)
class Doors:
    """What a listener hands a decided connection to."""

    amqp: Callable[[], asyncio.Protocol]
    http: Callable[[str], asyncio.Protocol]  # scheme "http" or "https"
    tls: ssl.SSLContext | None
    sniff_timeout: float = 10.0
    handshake_timeout: float = 10.0
    max_pending: int = 256
    max_pending_per_peer: int = 64
    pressure_sniff_timeout: float = 2.0  # the sniff timeout of a connection accepted while half of max_pending wait


class _TlsSniffer(asyncio.Protocol):
    """Inside TLS: buffer the first decrypted bytes, then hand the transport to AMQP or HTTP."""

    def __init__(self, doors: Doors, timeout: float, decided: Callable[[], None] = lambda: None) -> None:
        self.doors = doors
        self.timeout = timeout
        self.decided = decided  # called once, when the connection is handed over or closed
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # (uvloop's transports are not asyncio.Transport's subclasses)
        self.transport = transport
        self.timer = asyncio.get_running_loop().call_later(self.timeout, self._give_up)

    def _give_up(self) -> None:
        if self.transport is not None:
            self.transport.abort()
        self._decided()

    def _decided(self) -> None:
        decided, self.decided = self.decided, lambda: None
        decided()

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.buffer += data
        kind = classify(self.buffer[:PEEK_BYTES])
        if kind is None and len(self.buffer) < PEEK_BYTES:
            return
        if self.timer is not None:
            self.timer.cancel()
        self._decided()
        if kind == AMQP:
            protocol = self.doors.amqp()
        elif kind == HTTP:
            protocol = self.doors.http("https")
        else:
            _LOG.info("closing a TLS connection that speaks neither AMQP nor HTTP")
            self.transport.abort()
            return
        self.transport.set_protocol(protocol)
        protocol.connection_made(self.transport)
        protocol.data_received(self.buffer)
        self.buffer = b""

    def eof_received(self) -> bool | None:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self._decided()


def bind(host: str, port: int) -> list[socket.socket]:
    """Listening sockets for ``host:port`` (every address ``host`` resolves to; port 0 picks one for all)."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    seen: set[tuple[int, str | int]] = set()
    try:
        for family, kind, proto, _, address in infos:
            if (family, address[0]) in seen:
                continue
            seen.add((family, address[0]))
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(sockets) > 1:
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            try:
                sock.bind(address)
            except OSError as exc:
                where = ":".join(str(part) for part in address[:2])
                raise OSError(exc.errno, f"cannot listen on {where}: {exc.strerror}") from None
            sock.listen(512)
            sock.setblocking(False)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _peer_closed(fd: int) -> bool:
    """Has the client shut down its side (peeked bytes hide the end of the stream from ``recv``)?"""
    poller = select.poll()
    poller.register(fd, select.POLLRDHUP)
    return any(events & (select.POLLRDHUP | select.POLLHUP) for _, events in poller.poll(0))


def _peer_of(sock: socket.socket) -> str:
    try:
        return str(sock.getpeername()[0])
    except OSError:
        return ""


def _set_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Listener:
    """Accepts on its sockets and sniffs each connection; ``port`` is the bound port."""

    def __init__(self, sockets: Iterable[socket.socket], doors: Doors, kinds: frozenset[str] = ALL_KINDS) -> None:
        self.sockets = list(sockets)
        self.doors = doors
        self.kinds = kinds
        if TLS in kinds and doors.tls is None:
            raise ValueError("a listener that admits TLS needs a TLS context")
        self.port = int(self.sockets[0].getsockname()[1])
        self._accepting: list[asyncio.Task[None]] = []
        self._pending: set[asyncio.Task[None]] = set()
        self.undecided = OldestFirst()
        self.shed_count = 0  # undecided connections closed to make room (for tests and logs)

    @classmethod
    def open(cls, host: str, port: int, doors: Doors, kinds: frozenset[str] = ALL_KINDS) -> Listener:
        return cls(bind(host, port), doors, kinds)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._accepting = [loop.create_task(self._accept(sock)) for sock in self.sockets]

    async def close(self) -> None:
        for task in self._accepting:
            task.cancel()
        for sock in self.sockets:
            sock.close()
        for task in list(self._pending):
            task.cancel()
        await asyncio.gather(*self._accepting, *self._pending, return_exceptions=True)

    async def _accept(self, listening: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _ = await loop.sock_accept(listening)
            except asyncio.CancelledError:
                raise
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    _LOG.warning("accept failed (%s); pausing for a second", exc)
                    await asyncio.sleep(1.0)
                continue
            sock.setblocking(False)
            if self._decided_at_once(sock):  # its first bytes are there already: it never waits among the others
                continue
            peer = _peer_of(sock)
            self._make_room(peer)
            pressure = len(self.undecided) >= self.doors.max_pending // 2
            timeout = min(self.doors.sniff_timeout, self.doors.pressure_sniff_timeout) if pressure else None
            key = object()
            task = loop.create_task(self._sniff(sock, key, timeout or self.doors.sniff_timeout))
            self.undecided.add(key, peer, task.cancel)
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    def _decided_at_once(self, sock: socket.socket) -> bool:
        """Hand ``sock`` over now if its first bytes (already received) tell AMQP or HTTP."""
        try:
            kind = classify(sock.recv(PEEK_BYTES, socket.MSG_PEEK))
        except OSError:
            return False
        if kind not in (AMQP, HTTP) or kind not in self.kinds:
            return False
        loop = asyncio.get_running_loop()
        factory: Callable[[], asyncio.Protocol] = self.doors.amqp if kind == AMQP else lambda: self.doors.http("http")
        task = loop.create_task(self._connect(sock, factory))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return True

    async def _connect(self, sock: socket.socket, factory: Callable[[], asyncio.Protocol]) -> None:
        try:
            await asyncio.get_running_loop().connect_accepted_socket(factory, sock)
        except asyncio.CancelledError:
            sock.close()
            raise
        except OSError as exc:
            _LOG.info("closing a connection at its hand-over: %r", exc)
            sock.close()

    def _make_room(self, peer: str) -> None:
        """Past a bound, close the oldest undecided connection (the peer's own first), never the newcomer."""
        undecided = self.undecided
        if undecided.count(peer) >= self.doors.max_pending_per_peer:
            undecided.shed_oldest(peer)
            self._shed("from one address", self.doors.max_pending_per_peer)
        if len(undecided) >= self.doors.max_pending:
            undecided.shed_oldest()
            self._shed("in all", self.doors.max_pending)

    def _shed(self, where: str, bound: int) -> None:
        self.shed_count += 1
        if self.shed_count in (1, 10, 100) or self.shed_count % 1000 == 0:
            _LOG.warning(
                "%d connections undecided %s (the bound): closed the oldest; %d closed so far",
                bound,
                where,
                self.shed_count,
            )

    async def _sniff(self, sock: socket.socket, key: object, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        handed_over = False
        try:
            kind = await self._peek(sock, time.monotonic() + timeout)
            if kind not in self.kinds:
                _LOG.info("closing a connection of kind %r on a port that takes %s", kind, sorted(self.kinds))
                sock.close()
                return
            if kind == AMQP:
                self.undecided.remove(key)
                await loop.connect_accepted_socket(self.doors.amqp, sock)
            elif kind == HTTP:
                self.undecided.remove(key)
                await loop.connect_accepted_socket(lambda: self.doors.http("http"), sock)
            else:
                sniffer = _TlsSniffer(self.doors, timeout, lambda: self.undecided.remove(key))
                transport, _ = await loop.connect_accepted_socket(
                    lambda: sniffer,
                    sock,
                    ssl=self.doors.tls,
                    ssl_handshake_timeout=min(self.doors.handshake_timeout, timeout),
                )
                handed_over = True
                self.undecided.set_shed(key, transport.abort)  # still undecided until its first decrypted bytes
        except asyncio.CancelledError:
            sock.close()
            raise
        except (OSError, TimeoutError, ssl.SSLError, ConnectionError) as exc:
            _LOG.info("closing a connection during its first bytes or TLS handshake: %r", exc)
            sock.close()
        finally:
            if not handed_over:
                self.undecided.remove(key)

    async def _peek(self, sock: socket.socket, deadline: float) -> str:
        """Wait (bounded) until the first bytes tell the connection's kind; "" when unknown or closed."""
        loop = asyncio.get_running_loop()
        fd = sock.fileno()
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("the client sent no protocol header in time")
            readable: asyncio.Future[None] = loop.create_future()
            loop.add_reader(fd, _set_once, readable)
            try:
                await asyncio.wait_for(readable, remaining)
            finally:
                loop.remove_reader(fd)
            try:
                data = sock.recv(PEEK_BYTES, socket.MSG_PEEK)
            except (BlockingIOError, InterruptedError):
                continue
            if not data:
                return ""
            kind = classify(data)
            if kind is not None:
                return kind
            if _peer_closed(fd):  # a partial header that can never complete: the client has sent all it will
                return ""
            # a partial header: the peeked bytes keep the socket readable, so poll instead of spinning
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.sleep(POLL_SECONDS), remaining)
