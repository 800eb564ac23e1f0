"""The ``<entity>/$management`` node: Service Bus request-response operations.

Requests carry ``operation`` in their application properties and an AMQP map
body; responses carry ``statusCode`` / ``statusDescription`` (and
``errorCondition`` on failure) and an AMQP map body.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import proton

from oncebus.amqp import codec, engine, outgoing
from oncebus.amqp.errors import condition_of, status_of
from oncebus.amqp.rules import rule_from_amqp, rule_to_amqp
from oncebus.amqp.values import text
from oncebus.auth import LISTEN, MANAGE, SEND
from oncebus.broker import PendingSettlement, address_path, parse_path
from oncebus.core.errors import InvalidArgumentError, SessionLockLostError, UnauthorizedError
from oncebus.core.messages import Message, ServiceBusReceiveMode
from oncebus.core.timeutil import datetime_to_us, us_to_datetime

if TYPE_CHECKING:
    from oncebus.amqp.connection import AmqpConnection
    from oncebus.broker import Broker, SessionLock

_LOG = logging.getLogger(__name__)
MANAGEMENT_SUFFIX = "$management"
OPERATION_PREFIX = "com.microsoft:"

Body = dict[str, Any]
Operation = Callable[["_Request"], Awaitable[Body | None]]


def entity_of_node(address: str) -> str:
    """``amqps://host/orders/$management`` or ``orders/$management`` -> ``orders``."""
    address = address_path(address)
    if address.lower().endswith(MANAGEMENT_SUFFIX):
        address = address[: -len(MANAGEMENT_SUFFIX)]
    return address.strip("/")


def _items(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, proton.Array):
        return list(value.elements)
    if isinstance(value, list | tuple):
        return list(value)
    return [value]


def _text(value: Any) -> str | None:
    return text(value, errors="strict")  # a request field that is not UTF-8 is refused, not guessed


def _uuid(value: Any) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(_text(value))
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{value!r} is not a lock token (a UUID)") from None


def _ms(moment: datetime.datetime) -> proton.timestamp:
    return proton.timestamp(datetime_to_us(moment) // 1000)


class _Request:
    def __init__(
        self,
        namespace: Broker,
        conn: AmqpConnection,
        entity: str,
        body: Body,
        properties: dict[str, Any],
        txn_id: bytes | None = None,
    ) -> None:
        self.namespace = namespace
        self.conn = conn
        self.entity = entity
        self.body = body
        self.properties = properties
        self.txn_id = txn_id  # the transaction the request was sent in (its transfer's transactional-state), if any

    def get(self, name: str, default: Any = None) -> Any:
        return self.body.get(name, default)

    def require(self, name: str) -> Any:
        if name not in self.body or self.body[name] is None:
            raise InvalidArgumentError(f"the request lacks {name!r}")
        return self.body[name]

    def session(self) -> SessionLock | None:
        session_id = _text(self.get("session-id"))
        if session_id is None:
            return None
        path = parse_path(self.entity).receivable
        lock = self.conn.sessions.get((path, session_id))
        if lock is None:
            raise SessionLockLostError(
                f"session {session_id!r} of {self.entity!r} is not locked by this client: accept the session first"
            )
        return lock


# ---------------------------------------------------------------------------------------- operations
async def _schedule(request: _Request) -> Body:
    entries = _items(request.require("messages"))
    by_time: dict[datetime.datetime, list[tuple[int, Message]]] = {}
    for position, entry in enumerate(entries):
        encoded = entry.get("message") if isinstance(entry, dict) else None
        if not isinstance(encoded, bytes | bytearray | memoryview):
            raise InvalidArgumentError(f"scheduled message {position + 1} lacks its encoded 'message'")
        message = codec.decode_message(bytes(encoded))
        when = message.scheduled_enqueue_time_utc
        if when is None:
            raise InvalidArgumentError(
                f"scheduled message {position + 1} has no x-opt-scheduled-enqueue-time: set schedule_time_utc"
            )
        by_time.setdefault(when, []).append((position, message))
    numbers: list[int] = [0] * len(entries)
    if request.txn_id is not None:  # held until the commit; the numbers are reserved now
        held = [(message, datetime_to_us(when)) for when, group in by_time.items() for _, message in group]
        order = [position for group in by_time.values() for position, _ in group]
        reserved = request.namespace.transactions.schedule(request.txn_id, request.conn, request.entity, held)
        for position, number in zip(order, reserved, strict=True):
            numbers[position] = number
    for when, group in by_time.items() if request.txn_id is None else ():
        sequence_numbers = await request.namespace.schedule_messages(
            request.entity, [message for _, message in group], when
        )
        for (position, _), number in zip(group, sequence_numbers, strict=True):
            numbers[position] = number
    return {
        "sequence-numbers": proton.Array(
            proton.UNDESCRIBED,  # type: ignore[arg-type]  # proton takes its UNDESCRIBED marker here
            proton.Data.LONG,
            *numbers,
        )
    }


async def _cancel(request: _Request) -> None:
    numbers = [int(n) for n in _items(request.require("sequence-numbers"))]
    if request.txn_id is not None:  # applied at the commit
        request.namespace.transactions.cancel(request.txn_id, request.conn, request.entity, numbers)
        return None
    await request.namespace.cancel_scheduled_messages(request.entity, numbers)
    return None


async def _peek(request: _Request) -> Body | None:
    start = int(request.get("from-sequence-number") or 0)
    count = int(request.get("message-count") or 1)
    session_id = _text(request.get("session-id"))
    messages = request.namespace.peek_messages(
        request.entity, max(count, 1), sequence_number=start, session_id=session_id
    )
    if not messages:
        return None
    encoded = []
    for number, message in enumerate(messages, 1):
        encoded.append({"message": outgoing.encode_received(message, lock_annotations=False)})
        if number % _PEEK_SLICE == 0:
            await asyncio.sleep(0)  # a large peek lets other clients' work run between slices
    return {"messages": encoded}


_PEEK_SLICE = 25  # messages a peek encodes before it lets the loop run other work


async def _renew_lock(request: _Request) -> Body:
    tokens = [_uuid(t) for t in _items(request.require("lock-tokens"))]
    expirations = [_ms(await request.namespace.renew_lock(request.entity, token)) for token in tokens]
    return {
        "expirations": proton.Array(
            proton.UNDESCRIBED,  # type: ignore[arg-type]  # proton takes its UNDESCRIBED marker here
            proton.Data.TIMESTAMP,
            *expirations,
        )
    }


async def _update_disposition(request: _Request) -> None:
    status = _text(request.require("disposition-status"))
    tokens = [_uuid(t) for t in _items(request.require("lock-tokens"))]
    namespace = request.namespace
    if request.txn_id is not None:  # held as the link settlements are: the locks checked now and at the commit
        settlements = [_settlement(request, status, token) for token in tokens]
        namespace.transactions.settle_many(request.txn_id, request.conn, settlements)
        return None
    modify = _properties_to_modify(request)
    for token in tokens:
        if status == "completed":
            await namespace.complete(request.entity, token)
        elif status == "abandoned":
            await namespace.abandon(request.entity, token, modify)
        elif status == "defered":
            await namespace.defer(request.entity, token, modify)
        elif status == "suspended":
            await namespace.dead_letter(
                request.entity,
                token,
                reason=_text(request.get("deadletter-reason")) or None,
                error_description=_text(request.get("deadletter-description")) or None,
                properties_to_modify=modify,
            )
        else:
            raise InvalidArgumentError(
                f"disposition-status {status!r} is not one of completed, abandoned, defered, suspended"
            )
    return None


def _properties_to_modify(request: _Request) -> dict[str, Any] | None:
    """An update-disposition's properties-to-modify as the model holds application properties (the core checks
    them as it checks a send's)."""
    modify = request.get("properties-to-modify")
    if not modify:
        return None
    if not isinstance(modify, dict):
        raise InvalidArgumentError(f"properties-to-modify must be a map, not {type(modify).__name__}")
    return {str(k): codec.property_value(v) for k, v in modify.items()}


def _settlement(request: _Request, status: str | None, token: uuid.UUID) -> PendingSettlement:
    """An update-disposition of ``token`` inside a transaction, as the settlement it holds until the commit."""
    modify = _properties_to_modify(request)
    if status == "completed":
        return PendingSettlement(request.entity, token, "complete")
    if status == "abandoned":
        return PendingSettlement(request.entity, token, "abandon", modify)
    if status == "defered":
        return PendingSettlement(request.entity, token, "defer", modify)
    if status == "suspended":
        return PendingSettlement(
            request.entity,
            token,
            "dead_letter",
            modify,
            reason=_text(request.get("deadletter-reason")) or None,
            error_description=_text(request.get("deadletter-description")) or None,
        )
    raise InvalidArgumentError(f"disposition-status {status!r} is not one of completed, abandoned, defered, suspended")


async def _receive_by_sequence_number(request: _Request) -> Body | None:
    numbers = [int(n) for n in _items(request.require("sequence-numbers"))]
    settle_mode = int(request.get("receiver-settle-mode") or 0)
    mode = ServiceBusReceiveMode.RECEIVE_AND_DELETE if settle_mode == 0 else ServiceBusReceiveMode.PEEK_LOCK
    messages = await request.namespace.receive_deferred_messages(
        request.entity, numbers, receive_mode=mode, session=request.session()
    )
    if not messages:
        return None
    out = []
    for message in messages:
        locked = message.lock_token is not None and mode == ServiceBusReceiveMode.PEEK_LOCK
        token = message.lock_token if locked else None
        entry: dict[str, Any] = {"message": outgoing.encode_received(message, lock_annotations=True, lock_token=token)}
        if token is not None:
            entry["lock-token"] = token
        out.append(entry)
    return {"messages": out}


def _required_session(request: _Request) -> SessionLock:
    session = request.session()
    if session is None:
        raise InvalidArgumentError("the request lacks 'session-id'")
    return session


async def _get_session_state(request: _Request) -> Body:
    state = await request.namespace.get_session_state(_required_session(request))
    return {"session-state": None if state is None else bytes(state)}


async def _set_session_state(request: _Request) -> None:
    state = request.get("session-state")
    if isinstance(state, str):
        state = state.encode("utf-8")
    if request.txn_id is not None:  # set at the commit
        request.namespace.transactions.set_session_state(
            request.txn_id, request.conn, _required_session(request), None if state is None else bytes(state)
        )
        return None
    await request.namespace.set_session_state(_required_session(request), None if state is None else bytes(state))
    return None


async def _renew_session_lock(request: _Request) -> Body:
    expiry = await request.namespace.renew_session_lock(_required_session(request))
    return {"expiration": _ms(expiry)}


async def _get_message_sessions(request: _Request) -> Body | None:
    skip = int(request.get("skip") or 0)
    top = int(request.get("top") or 100)
    after = _state_updated_after(request.get("last-updated-time"))
    sessions = request.namespace.list_sessions(request.entity, state_updated_after=after)[skip : skip + top]
    if not sessions:
        return None
    return {"skip": proton.int32(skip + len(sessions)), "sessions-ids": sessions}


# the last-updated-time the SDKs send for "no filter" (.NET's DateTime.MaxValue, encoded as 10000-01-01T00:00:00Z)
_NO_SESSION_FILTER_MS = 253_402_300_800_000


def _state_updated_after(value: Any) -> datetime.datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime.datetime):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"last-updated-time must be a timestamp, got {value!r}")
    if value >= _NO_SESSION_FILTER_MS:
        return None
    if value < -62_135_596_800_000:  # before 0001-01-01: every state was set after it
        return datetime.datetime.min.replace(tzinfo=datetime.UTC)
    return us_to_datetime(int(value) * 1000)


# ---------------------------------------------------------------------------------------- purge
async def _batch_delete(request: _Request) -> Body:
    count = request.require("message-count")
    if isinstance(count, bool) or not isinstance(count, int):
        raise InvalidArgumentError(f"message-count must be an int, got {count!r}")
    before = request.get("enqueued-time-utc")
    if before is not None and (isinstance(before, bool) or not isinstance(before, int | datetime.datetime)):
        raise InvalidArgumentError(f"enqueued-time-utc must be a timestamp, got {before!r}")
    cutoff = us_to_datetime(int(before) * 1000, name="enqueued-time-utc") if isinstance(before, int) else before
    session = request.session()
    deleted = await request.namespace.delete_messages(
        request.entity,
        int(count),
        before_enqueued_time=cutoff,
        session_id=None if session is None else session.session_id,
    )
    return {"message-count": proton.int32(deleted)}


# ---------------------------------------------------------------------------------------- rules
async def _add_rule(request: _Request) -> None:
    topic, subscription = _subscription_of(request)
    name = _text(request.require("rule-name"))
    description = request.require("rule-description")
    rule = rule_from_amqp(name, description)
    await request.namespace.create_rule(topic, subscription, rule)
    return None


async def _remove_rule(request: _Request) -> None:
    topic, subscription = _subscription_of(request)
    name = _text(request.require("rule-name"))
    await request.namespace.delete_rule(topic, subscription, name or "")
    return None


async def _enumerate_rules(request: _Request) -> Body | None:
    topic, subscription = _subscription_of(request)
    top = _count(request.get("top"), "top", 2**31 - 1)
    skip = _count(request.get("skip"), "skip", 0)
    rules = request.namespace.list_rules(topic, subscription)[skip : skip + top] if top else []
    if not rules:
        return None
    return {"rules": [{"rule-description": rule_to_amqp(rule)} for rule in rules]}


def _count(value: Any, name: str, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgumentError(f"{name} must be a non-negative int, got {value!r}")
    return int(value)


def _subscription_of(request: _Request) -> tuple[str, str]:
    where = parse_path(request.entity)
    if where.subscription is None or where.dead_letter:
        raise InvalidArgumentError(
            f"rules belong to a subscription: use the $management node of <topic>/Subscriptions/<subscription>, "
            f"not of {request.entity!r}"
        )
    return where.entity, where.subscription


OPERATIONS: dict[str, Operation] = {
    "schedule-message": _schedule,
    "cancel-scheduled-message": _cancel,
    "peek-message": _peek,
    "renew-lock": _renew_lock,
    "update-disposition": _update_disposition,
    "receive-by-sequence-number": _receive_by_sequence_number,
    "get-session-state": _get_session_state,
    "set-session-state": _set_session_state,
    "renew-session-lock": _renew_session_lock,
    "get-message-sessions": _get_message_sessions,
    "batch-delete-messages": _batch_delete,
    "add-rule": _add_rule,
    "remove-rule": _remove_rule,
    "enumerate-rules": _enumerate_rules,
}


# the right each operation needs, as in Service Bus: scheduling is sending, rules are managing, everything else here
# reads or settles
OPERATION_RIGHTS: dict[str, str] = {
    "schedule-message": SEND,
    "cancel-scheduled-message": SEND,
    "peek-message": LISTEN,
    "renew-lock": LISTEN,
    "update-disposition": LISTEN,
    "receive-by-sequence-number": LISTEN,
    "get-session-state": LISTEN,
    "set-session-state": LISTEN,
    "renew-session-lock": LISTEN,
    "get-message-sessions": LISTEN,
    "batch-delete-messages": LISTEN,
    "add-rule": MANAGE,
    "remove-rule": MANAGE,
    "enumerate-rules": MANAGE,
}


_NO_CONTENT = ("peek-message", "receive-by-sequence-number", "get-message-sessions", "enumerate-rules")


def _response(status: int, description: str, body: Body | None, condition: str | None = None) -> proton.Message:
    properties: dict[str, Any] = {"statusCode": proton.int32(status), "statusDescription": description}
    if condition is not None:
        properties["errorCondition"] = proton.symbol(condition)
    return proton.Message(body=body if body is not None else None, properties=properties)


def error_response(exc: BaseException) -> proton.Message:
    """The response to a request that failed with ``exc``: its class's status code and condition."""
    condition = condition_of(exc)
    return _response(status_of(exc), condition.description or "", None, condition.name)


async def handle_request(
    namespace: Broker, conn: AmqpConnection, link: engine.Link, request: proton.Message, txn_id: bytes | None = None
) -> proton.Message:
    """Run one management request on ``namespace`` and build its response (errors become status codes and conditions).

    The router binds ``namespace`` when it opens the ``$management`` link. ``txn_id``: the transaction the request
    runs in (its transfer's transactional-state; None outside any).
    """
    raw_properties: dict[Any, Any] = request.properties or {}
    properties = {str(k): v for k, v in raw_properties.items()}
    node = address_path(link.remote_target.address or "")
    entity = entity_of_node(node)
    operation = _text(properties.get("operation")) or ""
    name = operation[len(OPERATION_PREFIX) :] if operation.startswith(OPERATION_PREFIX) else operation
    try:
        # the token must cover the node used (a token for the entity or for entity/$management does)
        denied = conn.access_denied(node, OPERATION_RIGHTS.get(name))
        if denied is not None:
            raise UnauthorizedError(denied)
        handler = OPERATIONS.get(name)
        if handler is None:
            raise InvalidArgumentError(
                f"operation {operation!r} is not supported; supported: "
                + ", ".join(OPERATION_PREFIX + n for n in OPERATIONS)
            )
        body = codec.copy_value(request.body) if isinstance(request.body, dict) else {}
        body = {str(k): v for k, v in body.items()}
        result = await handler(_Request(namespace, conn, entity, body, properties, txn_id))
    except Exception as exc:
        _LOG.info("management %s on %r failed: %s", operation, entity, exc)
        return error_response(exc)
    if result is None:
        status = 204 if name in _NO_CONTENT else 200
        return _response(status, "No Content" if status == 204 else "OK", None)
    return _response(200, "OK", result)
