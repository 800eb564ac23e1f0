"""Routing of attaching links: each gets its handler (entity sender/receiver, ``$cbs``, ``$management``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import proton

from oncebus.amqp import cbs, engine, management
from oncebus.amqp.coordinator import CoordinatorLink
from oncebus.amqp.crossentity import CrossEntityScope
from oncebus.amqp.errors import condition_of
from oncebus.amqp.links import (
    DEFAULT_SESSION_WAIT_SECONDS,
    OPERATION_TIMEOUT,
    SESSION_FILTER,
    TRANSFER_DESTINATION,
    ReceiveLink,
    RequestHandler,
    RequestLink,
    ResponseLink,
    SendLink,
    filter_value,
    read_filter,
    refuse,
)
from oncebus.amqp.values import text
from oncebus.auth import LISTEN, SEND
from oncebus.broker import address_path, parse_path
from oncebus.core.errors import EntityNotFoundError, InvalidArgumentError, OncebusError, UnauthorizedError
from oncebus.core.messages import ServiceBusReceiveMode

if TYPE_CHECKING:
    from oncebus.amqp.connection import AmqpConnection
    from oncebus.amqp.host import AmqpHost
    from oncebus.broker import Broker

__all__ = ["MIN_LINK_MESSAGE_SIZE", "Router"]

_LOG = logging.getLogger(__name__)

MIN_LINK_MESSAGE_SIZE = 1024


class Router:
    """Decides what an attaching link is (entity sender/receiver, $cbs, $management) and opens it."""

    def __init__(self, host: AmqpHost) -> None:
        self.host = host

    def attach(self, conn: AmqpConnection, link: engine.Link) -> None:
        coordinator = link.is_receiver and link.remote_target.type == engine.COORDINATOR
        # the session's cross-entity scope, set by its first link: a coordinator makes it a cross-entity session
        # (the send-via entity inferred, docs/amqp.md), any other link a plain one (None); kept by the connection
        # under the session's key until the session ends
        scope = conn.scopes.setdefault(link.session.key, CrossEntityScope() if coordinator else None)
        if coordinator:
            CoordinatorLink(conn, link).open()  # transactions
            return
        if link.is_receiver:
            address = address_path(link.remote_target.address)
        else:
            address = address_path(link.remote_source.address)
        if address.lower() == cbs.CBS_NODE:
            self._node(conn, link, cbs.CBS_NODE, self._put_token)
        elif address.lower().endswith(management.MANAGEMENT_SUFFIX):
            self._node(conn, link, address, _management)
        elif link.is_receiver:
            self._sender(conn, link, address, scope)
        else:
            claimed = None  # the cross-entity scope whose send-via entity this receiver set
            if scope is not None:
                try:
                    claimed = scope if scope.receiver(address) else None
                except Exception as exc:
                    refuse(link, condition_of(exc))
                    return
            conn.spawn(self._receiver(conn, link, address, claimed))

    def _node(self, conn: AmqpConnection, link: engine.Link, node: str, handler: RequestHandler) -> None:
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
            size = max(size, self._max_message_size(parse_path(entity).entity, conn.namespace))
        RequestLink(
            conn,
            link,
            node,
            handler,
            max_message_size=size,
            entity=entity,
            covered=address_path(node),
        ).open()

    def _properties(self, entity: str, namespace: Broker) -> Any:
        try:
            return namespace.get_queue(entity)
        except EntityNotFoundError:
            return namespace.get_topic(entity)

    def _max_message_size(self, entity: str, namespace: Broker) -> int:
        props = self._properties(entity, namespace)
        return max(namespace.quotas.message_limit_kb(props) * 1024, MIN_LINK_MESSAGE_SIZE)  # the tier's cap

    def _batch_size(self, entity: str, namespace: Broker) -> int:
        return max(namespace.quotas.batch_limit_bytes(self._properties(entity, namespace)), MIN_LINK_MESSAGE_SIZE)

    async def _put_token(
        self, conn: AmqpConnection, link: engine.Link, request: proton.Message, txn_id: bytes | None
    ) -> proton.Message:
        now = self.host.wall_time()
        result = _bind_namespace(conn, cbs.request_namespace(request.body, self.host.keys))
        if result is None:
            result = cbs.put_token(
                request.properties, request.body, conn.bound_keys, now, conn.client_hostname, conn.namespace_name
            )
        if result.grant is not None:
            refused = conn.add_grant(result.grant, now)
            if refused is not None:
                result = cbs.PutTokenResult(403, f"Forbidden: {refused}", None)
            else:
                conn.namespace_bound = True
        if result.grant is None:
            _LOG.info("CBS put-token refused: %s", result.status_description)
        return proton.Message(
            properties={
                "status-code": proton.int32(result.status_code),
                "status-description": result.status_description,
            }
        )

    def _check_access(self, conn: AmqpConnection, link: engine.Link, path: str, right: str) -> None:
        denied = conn.access_denied(path, right)
        if denied is not None:
            raise UnauthorizedError(denied)
        link.token_covered = True  # a token covered it: a forced detach later says that token expired

    def _sender(self, conn: AmqpConnection, link: engine.Link, address: str, scope: CrossEntityScope | None) -> None:
        try:
            self._check_access(conn, link, address, SEND)
            where = parse_path(address)
            if where.subscription is not None or where.dead_letter:
                raise InvalidArgumentError(
                    f"cannot send to {address!r}: send to a queue or a topic, not a subscription or dead-letter queue"
                )
            entity = destination = where.entity
            transfer_to = (link.remote_properties or {}).get(TRANSFER_DESTINATION)
            if transfer_to is not None:  # send-via: to ``transfer_to`` through this entity (both must be covered)
                destination = self._send_via(conn, link, text(transfer_to, errors="strict") or "")
            elif scope is not None and (via := scope.through(entity)) is not None:
                # a cross-entity session: to this entity through the session's first one, as with send-via
                self._check_access(conn, link, via, SEND)
                self._properties(via, conn.namespace)  # it still exists
                entity = via
            size = self._max_message_size(destination, conn.namespace)
        except Exception as exc:
            refuse(link, condition_of(exc))
            return
        if scope is not None:
            scope.claim(entity)
        sending = SendLink(conn, link, conn.namespace, entity, size)
        sending.destination = destination
        # the SDK sizes a batch by com.microsoft:max-message-batch-size: the tier's (256 KB Standard, 1 MB Premium)
        sending.max_batch_size = self._batch_size(destination, conn.namespace)
        sending.open()

    def _send_via(self, conn: AmqpConnection, link: engine.Link, address: str) -> str:
        """The destination of a send-via link (``com.microsoft:transfer-destination-address``): a queue or topic."""
        destination = address_path(address)
        where = parse_path(destination)
        if not destination or where.subscription is not None or where.dead_letter:
            raise InvalidArgumentError(
                f"cannot send through this link to {address!r} (its com.microsoft:transfer-destination-address): "
                "the transfer destination must be a queue or a topic"
            )
        self._check_access(conn, link, destination, SEND)
        self._properties(where.entity, conn.namespace)  # it exists
        return where.entity

    async def _receiver(
        self, conn: AmqpConnection, link: engine.Link, address: str, claimed: CrossEntityScope | None
    ) -> None:
        """``claimed``: the cross-entity scope whose send-via entity this link set (unset again if it is refused)."""
        namespace = conn.namespace
        release: Callable[[], None] | None = None
        try:
            self._check_access(conn, link, address, LISTEN)
            filters = read_filter(link.remote_source)
            namespace.check_receivable(address, sessionful=SESSION_FILTER in filters)
            release = namespace.open_receiver(address)  # the tier's concurrent receive requests
            mode = (
                ServiceBusReceiveMode.RECEIVE_AND_DELETE
                if link.remote_snd_settle_mode == engine.SND_SETTLED
                else ServiceBusReceiveMode.PEEK_LOCK
            )
            session = None
            if SESSION_FILTER in filters:
                session_id = _session_filter(filter_value(filters[SESSION_FILTER]))
                wait = DEFAULT_SESSION_WAIT_SECONDS
                timeout_ms = (link.remote_properties or {}).get(OPERATION_TIMEOUT)
                if timeout_ms is not None:
                    wait = max(int(timeout_ms) / 1000.0, 0.0)
                session = await namespace.accept_session(address, session_id, max_wait_time=wait)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if release is not None:
                release()
            if claimed is not None:
                claimed.release()
            if not conn.closed and link.state & engine.REMOTE_ACTIVE:
                refuse(link, condition_of(exc))
            return
        if conn.closed or not link.state & engine.REMOTE_ACTIVE:
            release()
            if session is not None:
                await namespace.close_session(session)
            return
        receiving = ReceiveLink(conn, link, namespace, address, mode, session)
        receiving.release = release  # counted until the link closes
        receiving.open()


def _session_filter(value: Any) -> str | None:
    """The session a receiver asks for (``com.microsoft:session-filter``): a string (or UTF-8 binary), or null for the
    next available one. Anything else is refused, never stringified, as Service Bus refuses it (the Python SDK's
    test_sessions.py opens a receiver with ``session_id=1`` and expects an error)."""
    if value is None or isinstance(value, str | bytes | bytearray | memoryview):
        return text(value, errors="strict")
    raise InvalidArgumentError(
        f"the session filter ({SESSION_FILTER}) must be a string (the session id) or null (the next available "
        f"session), not {type(value).__name__} {value!r}"
    )


def _management(conn: AmqpConnection, link: engine.Link, request: proton.Message, txn_id: bytes | None) -> Any:
    """A ``$management`` request runs on the namespace the connection is bound to (at its first CBS token)."""
    return management.handle_request(conn.namespace, conn, link, request, txn_id)


def _bind_namespace(conn: AmqpConnection, name: str | None) -> cbs.PutTokenResult | None:
    """Point ``conn`` at the namespace its token's key name selects (bound for good once a token is accepted);
    a refusal when that namespace is unknown, or another than the one the connection is bound to."""
    if conn.namespace_bound:
        if name == conn.namespace_name:
            return None
        bound = conn.namespace_name or "(the default one)"
        return cbs.PutTokenResult(
            403,
            f"Forbidden: this connection is bound to namespace {bound!r} (by its first token); a token for namespace "
            f"{name or '(the default one)'!r} needs a connection of its own",
            None,
        )
    try:
        namespace, keys = conn.host.namespace_named(name)
    except OncebusError as exc:
        return cbs.PutTokenResult(401, f"Unauthorized: {exc}", None)
    conn.namespace, conn.bound_keys, conn.namespace_name = namespace, keys, name
    return None
