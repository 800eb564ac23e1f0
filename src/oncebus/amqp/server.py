"""The AMQP 1.0 listener: ``serve_amqp()`` and :class:`AmqpServer`, which hosts its connections.

``AmqpServer`` implements :class:`oncebus.amqp.host.AmqpHost`, the protocol connections and links depend on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from oncebus.amqp.connection import CONNECTION_FORCED, AmqpConnection
from oncebus.amqp.endpoints import LOCAL_ACTIVE
from oncebus.amqp.frames import RESOURCE_LIMIT
from oncebus.amqp.limits import AmqpLimits, OldestFirst
from oncebus.amqp.routing import Router
from oncebus.amqp.sas import DEFAULT_KEYS, KeyRing, connection_string
from oncebus.amqp.websocket import AmqpOverWebSocket
from oncebus.core.errors import EntityNotFoundError

if TYPE_CHECKING:
    from oncebus.amqp import engine
    from oncebus.broker import Broker

_LOG = logging.getLogger(__name__)


class NamespaceResolver(Protocol):
    def resolve(self, name: str | None) -> tuple[Broker, KeyRing]:
        """The namespace ``name`` (None: the default one) and its keys; an error naming an unknown one."""
        ...


class AmqpServer:
    """A running AMQP listener; ``port`` is the bound port, ``close()`` stops it."""

    def __init__(
        self,
        namespace: Broker,
        keys: Mapping[str, str],
        wall_time: Callable[[], float] = time.time,
        limits: AmqpLimits | None = None,
    ) -> None:
        self.namespace = namespace
        self.keys = KeyRing.of(keys)  # name -> key, with each key's rights
        self.wall_time = wall_time
        self.limits = limits if limits is not None else AmqpLimits()  # oncebus serve: Settings.amqp
        self.router = Router(self)
        self.connections: set[AmqpConnection] = set()
        self.authenticated: set[AmqpConnection] = set()  # holding an accepted token: what max_connections bounds
        self.unauthenticated = OldestFirst()  # the others, oldest first: bounded on their own
        self.host = "127.0.0.1"
        self.port = 0
        self._server: asyncio.Server | None = None
        self._token_checks: asyncio.Task[None] | None = None
        # the namespaces created at run time (oncebus.server.namespaces): None serves the default one alone
        self.namespaces: NamespaceResolver | None = None
        namespace.observer.transport = self  # the gauges below, reported through the observation port (/metrics)

    def namespace_named(self, name: str | None) -> tuple[Broker, Mapping[str, str]]:
        if name is None:
            return self.namespace, self.keys
        if self.namespaces is None:
            raise EntityNotFoundError(
                f"the key name names namespace {name!r}, but this server serves only its default namespace "
                "(use the key name without '@')"
            )
        return self.namespaces.resolve(name)

    def namespace_deleted(self, name: str) -> None:
        """The created namespace ``name`` is gone: close the connections bound to it."""
        for conn in list(self.connections):
            if conn.namespace_bound and conn.namespace_name == name and not conn.closed:
                conn.protocol_error(CONNECTION_FORCED, f"the namespace {name!r} was deleted")

    @property
    def connection_string(self) -> str:
        key = self.keys.printed()  # a key with Manage when there is one
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return connection_string(host, self.port, key.name, key.key)

    def connection_protocol(self) -> AmqpConnection:
        """A protocol for a transport accepted elsewhere (``oncebus.server``'s sniffing listener)."""
        return AmqpConnection(self)

    def websocket_protocol(
        self, target: bytes, headers: Sequence[tuple[bytes, bytes]], early_data: bytes = b""
    ) -> AmqpOverWebSocket:
        """A protocol for a WebSocket upgrade request parsed elsewhere (``oncebus.http``'s door): it answers the
        handshake, then serves the same AMQP connection a TCP transport gets (:mod:`oncebus.amqp.websocket`)."""
        return AmqpOverWebSocket(self.connection_protocol, self.limits, target, headers, early_data)

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: AmqpConnection(self), host, port)
        self.host = host
        self.port = int(self._server.sockets[0].getsockname()[1])

    def connection_opened(self, conn: AmqpConnection) -> None:
        """A connection started (on this server's socket or one accepted elsewhere): keep checking its tokens.

        Only connections holding a token count toward ``max_connections``; those without one yet are bounded
        apart (``max_unauthenticated``, in all and per peer address), by closing the one idle the longest: a
        flood of connections that never authenticate cannot keep a client with a key (busy with its handshake)
        out."""
        if len(self.authenticated) >= self.limits.max_connections:
            conn.refused = (
                f"oncebus serves at most {self.limits.max_connections} AMQP connections at once "
                "(ONCEBUS_AMQP_MAX_CONNECTIONS); close one or raise the limit"
            )
        self.connections.add(conn)
        peer = conn.peer
        waiting = self.unauthenticated
        if waiting.count(peer) >= self.limits.max_unauthenticated_per_peer:
            waiting.shed_oldest(peer)
        if len(waiting) >= self.limits.max_unauthenticated:
            waiting.shed_oldest()
        waiting.add(conn, peer, lambda: self._shed(conn))
        if self._token_checks is None or self._token_checks.done():
            self._token_checks = asyncio.get_running_loop().create_task(self._check_tokens())

    def _shed(self, conn: AmqpConnection) -> None:
        conn.protocol_error(
            RESOURCE_LIMIT,
            f"closed to make room: more than {self.limits.max_unauthenticated} connections (or "
            f"{self.limits.max_unauthenticated_per_peer} from one address) were waiting for a CBS token; put the "
            "token soon after the open (ONCEBUS_AMQP_MAX_UNAUTHENTICATED, ..._PER_PEER)",
        )

    def connection_active(self, conn: AmqpConnection) -> None:
        self.unauthenticated.touch(conn)

    def connection_authenticated(self, conn: AmqpConnection) -> None:
        """``conn``'s first token was accepted: it now counts toward ``max_connections``."""
        self.unauthenticated.remove(conn)
        if not conn.closed:
            self.authenticated.add(conn)

    def connection_closed(self, conn: AmqpConnection) -> None:
        self.connections.discard(conn)
        self.authenticated.discard(conn)
        self.unauthenticated.remove(conn)

    def attach(self, conn: AmqpConnection, link: engine.Link) -> None:
        self.router.attach(conn, link)

    async def _check_tokens(self) -> None:
        """Detach links whose CBS token lapsed without renewal, on every connection, every few moments."""
        while True:
            await asyncio.sleep(self.limits.token_check_interval)
            now = self.wall_time()
            for conn in list(self.connections):
                try:
                    conn.check_tokens(now)
                except Exception:
                    _LOG.exception("checking the tokens of a connection failed")

    def connections_open(self) -> int:
        """AMQP connections open (on this server's socket or handed over by a front door), every namespace's."""
        return sum(1 for conn in self.connections if not conn.closed)

    def links_open(self) -> int:
        """Links open on them (entity, ``$cbs`` and ``$management`` links), attached by both ends."""
        return sum(_links_open(conn) for conn in self.connections if not conn.closed)

    async def close(self) -> None:
        if self.namespace.observer.transport is self:
            self.namespace.observer.transport = None
        if self._token_checks is not None:
            self._token_checks.cancel()
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.close()
        if self._server is not None:
            await self._server.wait_closed()


def _links_open(conn: AmqpConnection) -> int:
    """The links open on our side of ``conn`` (what /metrics counts as open)."""
    return sum(1 for link in conn.connection.links if link.state & LOCAL_ACTIVE)


async def serve_amqp(
    namespace: Broker,
    host: str = "127.0.0.1",
    port: int = 5672,
    *,
    keys: Mapping[str, str] | None = None,
    ready: Callable[[AmqpServer], None] | None = None,
    limits: AmqpLimits | None = None,
) -> AmqpServer:
    """Listen for AMQP 1.0 clients on ``host:port`` (port 0 picks a free one) for ``namespace``.

    Runs on the caller's event loop, the namespace's loop. ``keys`` maps SAS key
    names to keys (default: ``RootManageSharedAccessKey`` = ``SAS_KEY_VALUE``).
    ``ready`` is called with the server once it listens. ``limits`` bounds what a
    client may make the server do (default: ``AmqpLimits()``; ``oncebus serve`` gives the ``ONCEBUS_AMQP_*`` settings).
    """
    server = AmqpServer(
        namespace,
        keys if keys is not None else DEFAULT_KEYS,
        limits=limits,
    )
    if not server.keys:
        raise ValueError("give at least one SAS key (name -> key)")
    await server.start(host, port)
    if ready is not None:
        ready(server)
    return server
