"""The AMQP 1.0 listener: ``serve_amqp()`` and :class:`AmqpServer`, which hosts its connections.

``AmqpServer`` implements :class:`oncebus.amqp.host.AmqpHost`, the protocol connections and links depend on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from oncebus.amqp.connection import AmqpConnection
from oncebus.amqp.limits import AmqpLimits
from oncebus.amqp.routing import Router
from oncebus.amqp.sas import DEFAULT_KEYS, KeyRing, connection_string

if TYPE_CHECKING:
    import proton

    from oncebus.broker import Namespace

_LOG = logging.getLogger(__name__)


class AmqpServer:
    """A running AMQP listener; ``port`` is the bound port, ``close()`` stops it."""

    def __init__(
        self,
        namespace: Namespace,
        keys: Mapping[str, str],
        wall_time: Callable[[], float] = time.time,
        limits: AmqpLimits | None = None,
    ) -> None:
        self.namespace = namespace
        self.keys = KeyRing.of(keys)  # name -> key, with each key's rights
        self.wall_time = wall_time
        self.limits = limits if limits is not None else AmqpLimits.from_env()
        self.router = Router(self)
        self.connections: set[AmqpConnection] = set()
        self.host = "127.0.0.1"
        self.port = 0
        self._server: asyncio.Server | None = None
        self._token_checks: asyncio.Task[None] | None = None

    @property
    def connection_string(self) -> str:
        key = self.keys.printed()  # a key with Manage when there is one
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return connection_string(host, self.port, key.name, key.key)

    def connection_protocol(self) -> AmqpConnection:
        """A protocol for a transport accepted elsewhere (``oncebus.server``'s sniffing listener)."""
        return AmqpConnection(self)

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: AmqpConnection(self), host, port)
        self.host = host
        self.port = int(self._server.sockets[0].getsockname()[1])

    def connection_opened(self, conn: AmqpConnection) -> None:
        """A connection started (on this server's socket or one accepted elsewhere): keep checking its tokens."""
        served = sum(1 for other in self.connections if other.refused is None)
        if served >= self.limits.max_connections:
            conn.refused = (
                f"oncebus serves at most {self.limits.max_connections} AMQP connections at once "
                "(ONCEBUS_AMQP_MAX_CONNECTIONS); close one or raise the limit"
            )
        self.connections.add(conn)
        if self._token_checks is None or self._token_checks.done():
            self._token_checks = asyncio.get_running_loop().create_task(self._check_tokens())

    def connection_closed(self, conn: AmqpConnection) -> None:
        self.connections.discard(conn)

    def attach(self, conn: AmqpConnection, link: proton.Link) -> None:
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

    async def close(self) -> None:
        if self._token_checks is not None:
            self._token_checks.cancel()
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.close()
        if self._server is not None:
            await self._server.wait_closed()


async def serve_amqp(
    namespace: Namespace,
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
    client may make the server do (default: :meth:`AmqpLimits.from_env`).
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
