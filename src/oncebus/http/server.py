"""HTTP/1.1 on an asyncio transport, parsed by ``h11``, serving an ASGI application.

Why not uvicorn or hypercorn: oncebus's listener sniffs each connection's first
bytes and then hands the (possibly TLS) transport to the right protocol object,
sometimes with bytes already read. ``h11`` is a maintained HTTP/1.1 parser with
no I/O of its own, so this protocol takes exactly such a hand-over
(:meth:`HttpProtocol.connection_made` then :meth:`data_received` with the
buffered bytes) with no private API of a server framework; the application
itself stays plain ASGI, so any ASGI server could serve it elsewhere.

Limits, for hostile clients: request head at most ``max_header_bytes`` (h11
refuses more with 431), body at most ``max_body_bytes`` (413), a request must
arrive completely within ``request_timeout`` seconds of its first byte, an
idle keep-alive connection is closed after ``keepalive_timeout``; reading
pauses while a request is being answered, so nothing piles up unbounded.

A WebSocket upgrade on a path given in ``upgrades`` is not the application's:
once its head (bounded and timed like any request) has arrived, the transport,
the request and the bytes that followed it go to that path's door (AMQP over
WebSockets, ``oncebus.amqp.websocket``), which answers the handshake itself and
from then on owns the connection; it no longer counts as an HTTP connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import re
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, cast
from urllib.parse import unquote

import h11

_LOG = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SERVER_HEADER = b"oncebus"


@dataclass(frozen=True)
class Upgrade:
    """A WebSocket upgrade request handed to another protocol (see ``HttpProtocol``'s ``upgrades``)."""

    target: bytes  # as the client sent it, in origin form: path and query
    headers: list[tuple[bytes, bytes]]
    scheme: str  # "http" or "https": the connection's, before the upgrade
    early_data: bytes  # what the client sent after the request, before any answer


UpgradeDoor = Callable[[Upgrade], asyncio.Protocol]


_ABSOLUTE_FORM = re.compile(rb"^[a-z][a-z0-9+.-]*://[^/?#]*", re.IGNORECASE)


def origin_form(target: bytes) -> bytes:
    """A request target in origin form (path and query): the absolute form (``GET https://host/path``, which a
    server must accept, RFC 9112 3.2.2; the Java SDK's WebSocket upgrade is sent so) loses its scheme and host."""
    if match := _ABSOLUTE_FORM.match(target):
        return target[match.end() :] or b"/"
    return target


def upgrade_path(target: bytes) -> str:
    """The path an upgrade request is routed by: decoded, without query, outer slashes or case
    (``//$ServiceBus/websocket/?x`` is ``/$servicebus/websocket``, and so is ``https://host/$servicebus/websocket``)."""
    return "/" + unquote(origin_form(target).partition(b"?")[0].decode("latin-1")).strip("/").lower()


@dataclass(frozen=True)
class HttpLimits:
    max_header_bytes: int = 32 * 1024
    max_body_bytes: int = 1024 * 1024
    request_timeout: float = 15.0
    keepalive_timeout: float = 30.0
    # HTTP connections served at once, in all and from one peer address: past either, the connection idle the
    # longest (between requests) is closed; when none is idle the newcomer is answered 503 and closed
    max_connections: int = 256
    max_connections_per_peer: int = 128


@dataclass(frozen=True)
class AllowedHosts:
    """The names an HTTP request's ``Host`` may carry, as development servers check against DNS rebinding.

    A page whose name an attacker rebinds to 127.0.0.1 reaches the server with its own name in ``Host``: such a
    request is answered 403 and does nothing. Always allowed: IP literals, ``localhost`` and ``*.localhost``.
    ``names`` adds exact names (lower case); a name starting with ``.`` allows that domain and every name under it;
    ``*`` allows every name. A request without a ``Host`` (HTTP/1.0) is allowed: browsers always send one.
    """

    names: frozenset[str] = frozenset()

    def allows(self, header: bytes | None) -> bool:
        if header is None or "*" in self.names:
            return True
        name = host_name(header)
        if not name:
            return False
        if name == "localhost" or name.endswith(".localhost") or _is_ip(name):
            return True
        if name in self.names:
            return True
        return any(n.startswith(".") and (name.endswith(n) or name == n[1:]) for n in self.names)


def host_name(header: bytes) -> str:
    """The name in a ``Host`` header, lower case, without its port, brackets or final dot."""
    text = header.decode("latin-1").strip().lower()
    if text.startswith("["):
        return text[1:].partition("]")[0]
    name, _, port = text.rpartition(":")
    if not name or not port.isdigit():
        name = text
    return name.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HttpProtocol(asyncio.Protocol):
    """One HTTP/1.1 connection: requests one at a time, each answered by ``app``."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        scheme: str = "http",
        limits: HttpLimits | None = None,
        connections: set[HttpProtocol] | None = None,
        hosts: AllowedHosts | None = None,
        upgrades: Mapping[str, UpgradeDoor] | None = None,
    ) -> None:
        self.app = app
        self.upgrades = {upgrade_path(path.encode("latin-1")): door for path, door in (upgrades or {}).items()}
        self.hosts = hosts  # None: any Host
        self.scheme = scheme
        self.limits = limits or HttpLimits()
        self.connections = connections
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=self.limits.max_header_bytes)
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._request: h11.Request | None = None
        self._body = bytearray()
        self._closed = False
        self._receiving = False
        self._write_paused = False  # the client does not read its answers: take no new request meanwhile
        self._cycle_waiting = False
        self.peer = ""
        self.idle_since: float | None = None  # loop time since which it waits between requests (None: busy)

    # --- asyncio protocol --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # (uvloop's transports are not asyncio.Transport's subclasses)
        self.transport = transport
        peername = transport.get_extra_info("peername")
        self.peer = str(peername[0]) if isinstance(peername, tuple) and peername else ""
        self.idle_since = self.loop.time()
        if self.connections is not None:
            if not self._make_room(self.connections):
                self._error(
                    503,
                    f"oncebus serves at most {self.limits.max_connections} HTTP connections at once "
                    f"({self.limits.max_connections_per_peer} from one address), all busy; try again",
                )
                return
            self.connections.add(self)
        self._arm(self.limits.keepalive_timeout)

    def _make_room(self, connections: set[HttpProtocol]) -> bool:
        """Past a bound, close the connection of this peer (then of any) idle the longest; False when none is."""
        same_peer = [c for c in connections if c.peer == self.peer]
        for crowd, bound in (
            (same_peer, self.limits.max_connections_per_peer),
            (connections, self.limits.max_connections),
        ):
            if len(crowd) < bound:
                continue
            idle = [c for c in crowd if c.idle_since is not None and not c._closed]
            if not idle:
                return False
            oldest = min(idle, key=lambda c: c.idle_since or 0.0)
            _LOG.info("HTTP connections at their bound (%d): closing the one idle the longest", bound)
            oldest.close()
            connections.discard(oldest)
        return True

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        if not self._receiving:
            self._receiving = True  # the first byte of a request starts its clock; later bytes do not
            self._arm(self.limits.request_timeout)
        self.h11.receive_data(data)
        self._process()

    def eof_received(self) -> bool | None:
        if not self._closed:
            self.h11.receive_data(b"")
            self._process()
        return None

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._cycle_waiting:
            self._cycle_waiting = False
            self._start_cycle()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._disarm()
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self.connections is not None:
            self.connections.discard(self)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._disarm()
        if self.transport is not None:
            self.transport.close()

    # --- timers ----------------------------------------------------------------------------------
    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, self._timed_out)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self) -> None:
        self._timer = None
        if self._task is not None and not self._task.done():
            return  # the application is answering; it has its own bounds
        if self.h11.their_state is h11.SEND_BODY or (self.h11.their_state is h11.IDLE and self.h11.trailing_data[0]):
            self._error(408, "the request did not arrive in time")
        else:
            self.close()

    # --- request parsing -------------------------------------------------------------------------
    def _process(self) -> None:
        while not self._closed and self._task is None:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError as exc:
                status = exc.error_status_hint
                self._error(status, f"bad HTTP request: {exc}")
                return
            if event is h11.NEED_DATA:
                if len(self.h11.trailing_data[0]) > self.limits.max_header_bytes + self.limits.max_body_bytes:
                    self._error(413, "too much data")
                return
            if event is h11.PAUSED:
                return
            if isinstance(event, h11.Request):
                head = len(event.target) + sum(len(k) + len(v) + 4 for k, v in event.headers)
                if head > self.limits.max_header_bytes:
                    self._error(431, f"the request head is {head} bytes; at most {self.limits.max_header_bytes}")
                    return
                if self.hosts is not None and not self.hosts.allows(_header(event, b"host")):
                    name = _header(event, b"host") or b""
                    self._error(
                        403,
                        f"this server does not answer to the name {name.decode('latin-1')!r} (a page whose name "
                        "points at this machine cannot use it); add the name to ONCEBUS_HTTP_ALLOWED_HOSTS "
                        "(comma-separated; '.example.org' allows a domain, '*' every name)",
                    )
                    return
                self._request = event
                self._body = bytearray()
                length = _content_length(event)
                if length is not None and length > self.limits.max_body_bytes:
                    self._error(413, f"the body is {length} bytes; at most {self.limits.max_body_bytes} are accepted")
                    return
                if self.h11.they_are_waiting_for_100_continue:
                    self._write(h11.InformationalResponse(status_code=100, headers=[]))
            elif isinstance(event, h11.Data):
                if len(self._body) + len(event.data) > self.limits.max_body_bytes:
                    self._error(413, f"the body is larger than {self.limits.max_body_bytes} bytes")
                    return
                self._body += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert self._request is not None
                door = self._upgrade_door(self._request)
                if door is not None:
                    self._switch(door, self._request)
                    return
                self._disarm()
                self.idle_since = None
                if self.transport is not None:
                    self.transport.pause_reading()
                self._task = self.loop.create_task(self._run(self._request, bytes(self._body)))
                self._body = bytearray()
            elif isinstance(event, h11.ConnectionClosed):
                self.close()
                return

    def _upgrade_door(self, request: h11.Request) -> UpgradeDoor | None:
        """The door of a WebSocket upgrade on one of ``upgrades``' paths (anything else: the application's)."""
        if not self.upgrades:
            return None
        upgrade = _header(request, b"upgrade") or b""
        if not any(token.strip().lower() == b"websocket" for token in upgrade.split(b",")):
            return None
        return self.upgrades.get(upgrade_path(request.target))

    def _switch(self, door: UpgradeDoor, request: h11.Request) -> None:
        """Hand the transport over to ``door``'s protocol: this one never touches it again."""
        transport = self.transport
        assert transport is not None
        early_data = bytes(self.h11.trailing_data[0])
        self._closed = True
        self._disarm()
        if self.connections is not None:
            self.connections.discard(self)
        upgrade = Upgrade(
            target=origin_form(bytes(request.target)),
            headers=[(bytes(name), bytes(value)) for name, value in request.headers],
            scheme=self.scheme,
            early_data=early_data,
        )
        protocol = door(upgrade)
        transport.set_protocol(protocol)
        protocol.connection_made(transport)

    def _write(self, event: h11.Event) -> None:
        data = self.h11.send(event)
        if data and self.transport is not None and not self._closed:
            self.transport.write(data)

    def _error(self, status: int, text: str) -> None:
        """Answer a request we could not parse or accept, then close."""
        _LOG.info("HTTP %d: %s", status, text)
        if self.h11.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            body = text.encode() + b"\n"
            with contextlib.suppress(h11.LocalProtocolError):
                self._write(
                    h11.Response(
                        status_code=status,
                        reason=_reason(status),
                        headers=[
                            (b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"),
                            (b"server", SERVER_HEADER),
                        ],
                    )
                )
                self._write(h11.Data(data=body))
                self._write(h11.EndOfMessage())
        self.close()

    # --- the application -------------------------------------------------------------------------
    def _scope(self, request: h11.Request) -> Scope:
        target = origin_form(request.target)
        raw_path, _, query = target.partition(b"?")
        transport = self.transport
        client = transport.get_extra_info("peername") if transport else None
        server = transport.get_extra_info("sockname") if transport else None
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": request.http_version.decode(),
            "method": request.method.decode("ascii"),
            "scheme": self.scheme,
            "path": unquote(raw_path.decode("latin-1")),
            "raw_path": raw_path,
            "query_string": query,
            "root_path": "",
            "headers": [(name.lower(), value) for name, value in request.headers],
            "client": tuple(client[:2]) if client else None,
            "server": tuple(server[:2]) if server else None,
            "state": {},
        }

    async def _run(self, request: h11.Request, body: bytes) -> None:
        scope = self._scope(request)
        sent_body = False
        started = False
        finished = False
        disconnected = asyncio.Event()

        async def receive() -> Message:
            nonlocal sent_body
            if not sent_body:
                sent_body = True
                return {"type": "http.request", "body": body, "more_body": False}
            await disconnected.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            nonlocal started, finished
            if self._closed or finished:
                return
            kind = message["type"]
            if kind == "http.response.start" and not started:
                started = True
                headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", [])]
                if not any(k.lower() == b"server" for k, _ in headers):
                    headers.append((b"server", SERVER_HEADER))
                status = int(message["status"])
                self._write(h11.Response(status_code=status, headers=headers, reason=_reason(status)))
            elif kind == "http.response.body" and started:
                data = bytes(message.get("body", b""))
                if data and request.method != b"HEAD":  # a HEAD response has the headers of GET, no body
                    self._write(h11.Data(data=data))
                if not message.get("more_body", False):
                    finished = True
                    self._write(h11.EndOfMessage())
            else:
                raise RuntimeError(f"unexpected ASGI message {kind!r} (response started: {started})")

        try:
            await self.app(scope, receive, send)
            if not started:
                raise RuntimeError("the application returned without a response")
            if not finished:
                finished = True
                self._write(h11.EndOfMessage())
        except asyncio.CancelledError:
            raise
        except Exception:
            _LOG.exception("the HTTP application failed on %s %s", scope["method"], scope["path"])
            if not started:
                self._task = None
                self._error(500, "internal error")
            else:
                self.close()
            return
        finally:
            disconnected.set()
        self._next_cycle()

    def _next_cycle(self) -> None:
        self._task = None
        self._request = None
        self._receiving = False
        if self._closed:
            return
        if self.h11.our_state is h11.MUST_CLOSE or self.h11.their_state is h11.MUST_CLOSE:
            self.close()
            return
        try:
            self.h11.start_next_cycle()
        except h11.LocalProtocolError:
            self.close()
            return
        if self._write_paused:
            self._cycle_waiting = True
            self._arm(self.limits.keepalive_timeout)  # a client that never reads its answers is dropped
            return
        self._start_cycle()

    def _start_cycle(self) -> None:
        if self._closed:
            return
        self.idle_since = self.loop.time()
        if self.transport is not None:
            self.transport.resume_reading()
        if self.h11.trailing_data[0]:  # a pipelined request has begun
            self._receiving = True
            self._arm(self.limits.request_timeout)
        else:
            self._arm(self.limits.keepalive_timeout)
        self._process()


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


def _header(request: h11.Request, wanted: bytes) -> bytes | None:
    for name, value in request.headers:
        if name.lower() == wanted:
            return bytes(value)
    return None


def _content_length(request: h11.Request) -> int | None:
    for name, value in request.headers:
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
