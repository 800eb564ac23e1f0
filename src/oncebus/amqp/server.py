"""The AMQP 1.0 listener: ``serve_amqp()`` and the router that gives each attached link its handler."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import proton

from oncebus.amqp import cbs, management
from oncebus.amqp.connection import AmqpConnection
from oncebus.amqp.errors import condition_of
from oncebus.amqp.limits import AmqpLimits
from oncebus.amqp.links import (
    DEFAULT_SESSION_WAIT_SECONDS,
    OPERATION_TIMEOUT,
    SESSION_FILTER,
    ReceiveLink,
    RequestLink,
    ResponseLink,
    SendLink,
    read_filter,
    refuse,
)
from oncebus.amqp.sas import DEFAULT_KEYS, connection_string
from oncebus.broker.paths import parse_path
from oncebus.core.errors import EntityNotFoundError, InvalidArgumentError, UnauthorizedError
from oncebus.core.messages import ServiceBusReceiveMode

if TYPE_CHECKING:
    from oncebus.broker import Namespace

_LOG = logging.getLogger(__name__)

MIN_LINK_MESSAGE_SIZE = 1024


def _address_path(address: str | None) -> str:
    """``amqps://host:port/orders`` -> ``orders``; a bare path is kept."""
    if not address:
        return ""
    if "://" in address:
        rest = address.split("://", 1)[1]
        return rest.split("/", 1)[1].strip("/") if "/" in rest else ""
    return address.strip("/")


class Router:
    """Decides what an attaching link is (entity sender/receiver, $cbs, $management) and opens it."""

    def __init__(self, server: AmqpServer) -> None:
        self.server = server

    def attach(self, conn: AmqpConnection, link: proton.Link) -> None:
        if link.is_receiver:
            address = _address_path(link.remote_target.address)
        else:
            address = _address_path(link.remote_source.address)
        if address.lower() == cbs.CBS_NODE:
            self._node(conn, link, cbs.CBS_NODE, self._put_token)
        elif address.lower().endswith(management.MANAGEMENT_SUFFIX):
            self._node(conn, link, address, management.handle_request)
        elif link.is_receiver:
            self._sender(conn, link, address)
        else:
            conn.spawn(self._receiver(conn, link, address))

    def _node(self, conn: AmqpConnection, link: proton.Link, node: str, handler: Any) -> None:
        if not link.is_receiver:
            ResponseLink(conn, link, node).open()
            return
        limits = conn.limits
        if node == cbs.CBS_NODE:
            RequestLink(conn, link, node, handler, max_message_size=limits.cbs_message_size).open()
            return
        entity = management.entity_of_node(node)
        size = limits.management_message_size
        with contextlib.suppress(Exception):  # an unknown entity is reported per request
            size = max(size, self._max_message_size(parse_path(entity).entity))
        RequestLink(conn, link, node, handler, max_message_size=size, entity=entity).open()

    def _max_message_size(self, entity: str) -> int:
        namespace = self.server.namespace
        try:
            props: Any = namespace.get_queue(entity)
        except EntityNotFoundError:
            props = namespace.get_topic(entity)
        return max(int(props.max_message_size_in_kilobytes) * 1024, MIN_LINK_MESSAGE_SIZE)

    async def _put_token(self, conn: AmqpConnection, link: proton.Link, request: proton.Message) -> proton.Message:
        result = cbs.put_token(request.properties, request.body, self.server.keys, self.server.wall_time())
        if result.grant is not None:
            conn.grants.append(result.grant)
        else:
            _LOG.info("CBS put-token refused: %s", result.status_description)
        return proton.Message(
            properties={
                "status-code": proton.int32(result.status_code),
                "status-description": result.status_description,
            }
        )

    def _check_access(self, conn: AmqpConnection, path: str) -> None:
        if not conn.authorized(path):
            raise UnauthorizedError(
                f"Unauthorized access to {path!r}: no valid token covers it; put a token on $cbs before attaching"
            )

    def _sender(self, conn: AmqpConnection, link: proton.Link, address: str) -> None:
        try:
            self._check_access(conn, address)
            where = parse_path(address)
            if where.subscription is not None or where.dead_letter:
                raise InvalidArgumentError(
                    f"cannot send to {address!r}: send to a queue or a topic, not a subscription or dead-letter queue"
                )
            size = self._max_message_size(where.entity)
        except Exception as exc:
            refuse(link, condition_of(exc))
            return
        SendLink(conn, link, where.entity, size).open()

    async def _receiver(self, conn: AmqpConnection, link: proton.Link, address: str) -> None:
        namespace = self.server.namespace
        try:
            self._check_access(conn, address)
            namespace.receivable(address)
            filters = read_filter(link.remote_source)
            mode = (
                ServiceBusReceiveMode.RECEIVE_AND_DELETE
                if link.remote_snd_settle_mode == proton.Link.SND_SETTLED
                else ServiceBusReceiveMode.PEEK_LOCK
            )
            session = None
            if SESSION_FILTER in filters:
                session_id = filters[SESSION_FILTER]
                if isinstance(session_id, bytes | memoryview):
                    session_id = bytes(session_id).decode("utf-8")
                wait = DEFAULT_SESSION_WAIT_SECONDS
                timeout_ms = (link.remote_properties or {}).get(OPERATION_TIMEOUT)
                if timeout_ms is not None:
                    wait = max(int(timeout_ms) / 1000.0, 0.0)
                session = await namespace.accept_session(
                    address, None if session_id is None else str(session_id), max_wait_time=wait
                )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not conn.closed and link.state & proton.Endpoint.REMOTE_ACTIVE:
                refuse(link, condition_of(exc))
            return
        if conn.closed or not link.state & proton.Endpoint.REMOTE_ACTIVE:
            if session is not None:
                await namespace.close_session(session)
            return
        ReceiveLink(conn, link, address, mode, session).open()


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
        self.keys = dict(keys)
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
        name, key = next(iter(self.keys.items()))
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return connection_string(host, self.port, name, key)

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
        self.connections.add(conn)
        if self._token_checks is None or self._token_checks.done():
            self._token_checks = asyncio.get_running_loop().create_task(self._check_tokens())

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
