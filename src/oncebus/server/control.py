"""The control protocol: JSON operations on a namespace, used by the CLI in-process and over a socket.

Every operation takes and returns plain JSON values, so the same ``dispatch``
serves a CLI command run against a stopped data directory (in-process) and
one forwarded to a running ``oncebus serve`` (one JSON object a line over a
loopback TCP connection, authenticated by a token kept in the data directory).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import math
import secrets
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from oncebus.auth import make_token, resource_path
from oncebus.broker import FaultsDisabledError, FaultSpec, Namespace, SystemClock
from oncebus.core import errors
from oncebus.core.durations import parse_duration
from oncebus.core.errors import ArgumentOutOfRangeError, InvalidArgumentError, OncebusError
from oncebus.core.messages import Message, ServiceBusReceiveMode
from oncebus.core.properties import SENDER_PROPERTIES
from oncebus.core.rules import RuleProperties
from oncebus.core.tiers import TierQuotas
from oncebus.core.timeutil import datetime_to_us, us_to_datetime
from oncebus.server.namespaces import Namespaces
from oncebus.store.base import Store

LATEST_US = datetime_to_us(datetime.max.replace(tzinfo=UTC))
"""The latest time a datetime holds (end of year 9999), in microseconds since the epoch."""

_log = logging.getLogger(__name__)

Handler = Callable[[Namespace, dict[str, Any]], Awaitable[Any]]
_HANDLERS: dict[str, Handler] = {}


def operation(name: str) -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        _HANDLERS[name] = handler
        return handler

    return register


async def open_local(store: Store, quotas: TierQuotas) -> Namespace:
    """The namespace of a data directory no server runs on, for the CLI to ``dispatch`` to in-process (this package
    is the one that builds namespaces; the CLI never names the engine's concrete class)."""
    return await Namespace.open(store, SystemClock(), quotas=quotas)


async def dispatch(namespace: Namespace, op: str, args: dict[str, Any]) -> Any:
    handler = _HANDLERS.get(op)
    if handler is None:
        raise InvalidArgumentError(f"unknown operation {op!r}; known: {', '.join(sorted(_HANDLERS))}")
    return await handler(namespace, args)


# ---------------------------------------------------------------------------------- entities
for _kind in ("queue", "topic"):

    def _register(kind: str) -> None:
        @operation(f"{kind}.create")
        async def create(ns: Namespace, args: dict[str, Any]) -> Any:
            props = await getattr(ns, f"create_{kind}")(args["name"], **args.get("properties", {}))
            return props.to_dict()

        @operation(f"{kind}.update")
        async def update(ns: Namespace, args: dict[str, Any]) -> Any:
            props = await getattr(ns, f"update_{kind}")(args["name"], **args.get("properties", {}))
            return props.to_dict()

        @operation(f"{kind}.delete")
        async def delete(ns: Namespace, args: dict[str, Any]) -> Any:
            await getattr(ns, f"delete_{kind}")(args["name"])
            return None

        @operation(f"{kind}.show")
        async def show(ns: Namespace, args: dict[str, Any]) -> Any:
            return getattr(ns, f"get_{kind}")(args["name"]).to_dict()

        @operation(f"{kind}.list")
        async def list_(ns: Namespace, args: dict[str, Any]) -> Any:
            return [p.to_dict() for p in getattr(ns, f"list_{kind}s")()]

    _register(_kind)


@operation("subscription.create")
async def _sub_create(ns: Namespace, args: dict[str, Any]) -> Any:
    return (await ns.create_subscription(args["topic"], args["name"], **args.get("properties", {}))).to_dict()


@operation("subscription.update")
async def _sub_update(ns: Namespace, args: dict[str, Any]) -> Any:
    return (await ns.update_subscription(args["topic"], args["name"], **args.get("properties", {}))).to_dict()


@operation("subscription.delete")
async def _sub_delete(ns: Namespace, args: dict[str, Any]) -> Any:
    await ns.delete_subscription(args["topic"], args["name"])
    return None


@operation("subscription.show")
async def _sub_show(ns: Namespace, args: dict[str, Any]) -> Any:
    return ns.get_subscription(args["topic"], args["name"]).to_dict()


@operation("subscription.list")
async def _sub_list(ns: Namespace, args: dict[str, Any]) -> Any:
    return [p.to_dict() for p in ns.list_subscriptions(args["topic"])]


# ---------------------------------------------------------------------------------- rules
def _rule(args: dict[str, Any]) -> RuleProperties:
    data = args.get("rule")
    if not isinstance(data, dict):
        raise InvalidArgumentError('a rule is a JSON object {"name": ..., "filter": {...}, "action": {...}}')
    return RuleProperties.from_dict(data)


@operation("rule.create")
async def _rule_create(ns: Namespace, args: dict[str, Any]) -> Any:
    return (await ns.create_rule(args["topic"], args["subscription"], _rule(args))).to_dict()


@operation("rule.update")
async def _rule_update(ns: Namespace, args: dict[str, Any]) -> Any:
    return (await ns.update_rule(args["topic"], args["subscription"], _rule(args))).to_dict()


@operation("rule.delete")
async def _rule_delete(ns: Namespace, args: dict[str, Any]) -> Any:
    await ns.delete_rule(args["topic"], args["subscription"], args["name"])
    return None


@operation("rule.show")
async def _rule_show(ns: Namespace, args: dict[str, Any]) -> Any:
    return ns.get_rule(args["topic"], args["subscription"], args["name"]).to_dict()


@operation("rule.list")
async def _rule_list(ns: Namespace, args: dict[str, Any]) -> Any:
    return [r.to_dict() for r in ns.list_rules(args["topic"], args["subscription"])]


# ---------------------------------------------------------------------------------- messages
_BODY_FIELDS = ("body", "body_b64", "application_properties")
_SENDER_FIELDS = {p.field: p for p in SENDER_PROPERTIES if p.field is not None}
_LEGACY = {"scheduled_enqueue_time_us": "scheduled_enqueue_time_utc"}  # the name earlier CLIs sent


def message_from_json(data: dict[str, Any]) -> Message:
    """A message of the control socket's ``send``: ``body`` (text) or ``body_b64``, ``application_properties``,
    and the sender's properties by their model names (``core.properties.SENDER_PROPERTIES``): text for the
    string ones, an ISO-8601 duration for ``time_to_live``, microseconds since the epoch for
    ``scheduled_enqueue_time_utc``. Anything else is refused, naming what is allowed."""
    if not isinstance(data, dict):
        raise InvalidArgumentError(f"each message must be a JSON object, not {type(data).__name__}")
    unknown = sorted(str(k) for k in data if k not in _SENDER_FIELDS and k not in _BODY_FIELDS and k not in _LEGACY)
    if unknown:
        allowed = ", ".join([*_BODY_FIELDS, *_SENDER_FIELDS])
        raise InvalidArgumentError(f"a message has no field {', '.join(unknown)}; its fields are {allowed}")
    if "body_b64" in data:
        try:
            body = base64.b64decode(str(data["body_b64"]), validate=True)
        except binascii.Error as exc:
            raise InvalidArgumentError(f"body_b64 is not base64: {exc}") from None
    else:
        body = str(data.get("body", "")).encode()
    properties = data.get("application_properties") or {}
    if not isinstance(properties, dict):
        raise InvalidArgumentError("application_properties must be a JSON object")
    fields: dict[str, Any] = {}
    for name, value in data.items():
        field = _LEGACY.get(name, name)
        prop = _SENDER_FIELDS.get(field)
        if prop is None or value is None:
            continue
        if prop.kind is str:
            if not isinstance(value, str):
                raise InvalidArgumentError(f"{name} must be a string, not {value!r}")
            fields[field] = value
        elif prop.kind is timedelta:
            fields[field] = parse_duration(value, name=name)
        elif prop.kind is datetime:
            fields[field] = _scheduled(name, value)
    return Message(body=body, application_properties=dict(properties), **fields)


def _scheduled(name: str, value: Any) -> datetime:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{name} must be an integer (microseconds since 1970), not {value!r}")
    if not 0 <= value <= LATEST_US:
        raise ArgumentOutOfRangeError(
            f"{name} {value} is out of range: a scheduled time must be between 1970 and "
            f"the end of year 9999 ({LATEST_US})"
        )
    return us_to_datetime(value)


def _seconds(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise InvalidArgumentError(f"{name} must be a finite number of seconds, 0 or more, not {value!r}")
    return float(value)


@operation("send")
async def _send(ns: Namespace, args: dict[str, Any]) -> Any:
    if not isinstance(args.get("messages"), list):
        raise InvalidArgumentError("send needs messages: a list of JSON objects")
    messages = [message_from_json(m) for m in args["messages"]]
    outcomes = await ns.send(args["entity"], messages)
    return [
        {
            "message_id": o.message_id,
            "sequence_number": o.sequence_number,
            "duplicate": o.duplicate,
            "late_resend_delay_seconds": None if o.late_resend_delay_us is None else o.late_resend_delay_us / 1e6,
        }
        for o in outcomes
    ]


@operation("receive")
async def _receive(ns: Namespace, args: dict[str, Any]) -> Any:
    wait = _seconds(args.get("max_wait_time", 0.0), "max_wait_time")
    path = args["path"]
    session = None
    if args.get("session_id") is not None or args.get("next_session"):
        session = await ns.accept_session(path, args.get("session_id"), max_wait_time=wait)
    try:
        got = await ns.receive(
            path,
            int(args.get("max_message_count", 1)),
            receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE,
            max_wait_time=wait,
            session=session,
        )
    finally:
        if session is not None:
            await ns.close_session(session)
    return [m.to_dict() for m in got]


@operation("peek")
async def _peek(ns: Namespace, args: dict[str, Any]) -> Any:
    got = ns.peek_messages(
        args["path"],
        int(args.get("max_message_count", 10)),
        sequence_number=int(args.get("sequence_number", 0)),
        session_id=args.get("session_id"),
    )
    return [m.to_dict() for m in got]


@operation("stats")
async def _stats(ns: Namespace, args: dict[str, Any]) -> Any:
    names = [args["name"]] if args.get("name") else ns.entity_names()
    return [ns.stats(name).to_dict() for name in names]


@operation("ping")
async def _ping(ns: Namespace, args: dict[str, Any]) -> Any:
    return {"entities": len(ns.entity_names())}


@operation("namespace.reset")
async def _reset(ns: Namespace, args: dict[str, Any]) -> Any:
    """A fresh namespace (oncebus.testing): every entity, message and dedup key deleted; the time starts again."""
    await ns.reset()
    ns.faults.clear()  # a fresh namespace has no fault armed either
    return {"now_us": ns.clock.now_us()}


# ---------------------------------------------------------------------------------- created namespaces
async def _ns_create(registry: Namespaces, args: dict[str, Any]) -> Any:
    return registry.describe(await registry.create(args["name"]))


async def _ns_delete(registry: Namespaces, args: dict[str, Any]) -> Any:
    await registry.delete(args["name"])
    return {"deleted": args["name"]}


async def _ns_list(registry: Namespaces, args: dict[str, Any]) -> Any:
    return [registry.describe(registry.get(name)) for name in registry.names()]


async def _ns_advance(registry: Namespaces, args: dict[str, Any]) -> Any:
    """Move a created namespace's clock ``us`` microseconds forward (its own: no other namespace's time moves)."""
    us = args.get("us")
    if not isinstance(us, int) or isinstance(us, bool):
        raise InvalidArgumentError(f"'us' is a whole number of microseconds, not {us!r}")
    return {"now_us": registry.advance(args["name"], us)}


_NAMESPACE_OPS: dict[str, Callable[[Namespaces, dict[str, Any]], Awaitable[Any]]] = {
    "namespaces.create": _ns_create,
    "namespaces.delete": _ns_delete,
    "namespaces.list": _ns_list,
    "namespaces.advance": _ns_advance,
}


@operation("fault.arm")
async def _fault_arm(ns: Namespace, args: dict[str, Any]) -> Any:
    """Arm a fault (``oncebus.broker.faults``): ``fault`` is its JSON spec (kind, entity, count or duration, ...)."""
    return ns.faults.arm(FaultSpec.from_dict(args.get("fault") or {})).to_dict()


@operation("fault.list")
async def _fault_list(ns: Namespace, args: dict[str, Any]) -> Any:
    return [fault.to_dict() for fault in ns.faults.list()]


@operation("fault.clear")
async def _fault_clear(ns: Namespace, args: dict[str, Any]) -> Any:
    """Disarm the fault ``id``, or every fault when no id is given."""
    fault_id = args.get("id")
    if fault_id is not None and not isinstance(fault_id, str):
        raise InvalidArgumentError(f"a fault id is a string such as 'f1', not {fault_id!r}")
    return {"cleared": ns.faults.clear(fault_id)}


@operation("entities.create")
async def _entities_create(ns: Namespace, args: dict[str, Any]) -> Any:
    """Create many entities (oncebus.testing's declared ones): queues and topics at once, then the subscriptions,
    so their writes share commits. ``queues``/``topics``: [[name, properties]]; ``subscriptions``: [[topic, name,
    properties]]."""
    await asyncio.gather(
        *(ns.create_queue(name, **props) for name, props in args.get("queues") or []),
        *(ns.create_topic(name, **props) for name, props in args.get("topics") or []),
    )
    await asyncio.gather(
        *(ns.create_subscription(t, name, **props) for t, name, props in args.get("subscriptions") or [])
    )
    return None


@operation("clock.tick")
async def _tick(ns: Namespace, args: dict[str, Any]) -> Any:
    """Apply now what is due at the clock's time (oncebus.testing's advance(): no wait for the next timer)."""
    ns.tick()
    return {"now_us": ns.clock.now_us()}


# ---------------------------------------------------------------------------------- errors on the wire
def error_to_json(exc: BaseException) -> dict[str, Any]:
    name = type(exc).__name__ if isinstance(exc, OncebusError) else "OncebusError"
    return {"ok": False, "error": name, "message": str(exc)}


def error_from_json(data: dict[str, Any]) -> OncebusError:
    name = str(data.get("error"))
    cls: object = getattr(errors, name, OncebusError)
    if name == FaultsDisabledError.__name__:
        cls = FaultsDisabledError
    if not (isinstance(cls, type) and issubclass(cls, OncebusError)):
        cls = OncebusError
    return cls(str(data.get("message")))


# ---------------------------------------------------------------------------------- the socket
MAX_REQUEST_LINE = 64 * 1024 * 1024
"""Longest request line the control socket reads (a send of base64 bodies); longer lines are refused."""
TOKEN_LINE = 4096
"""A request line longer than this must start with the control token, checked before the rest is read."""
MAX_CONTROL_CONNECTIONS = 32
"""Control connections served at once."""
DEFAULT_TOKEN_SECONDS = 3600  # a token's life when ``oncebus token`` is not told (the SDKs' own is an hour)
MAX_TOKEN_SECONDS = 365 * 24 * 3600


def _refusal(message: str) -> dict[str, Any]:
    return {
        "ok": False,
        "error": "UnauthorizedError",
        "message": f"refused: {message}; run the CLI with the server's data directory",
    }


_BAD_INPUT = (KeyError, TypeError, ValueError, AttributeError, OverflowError, RecursionError)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_request(line: bytes) -> tuple[str, str, dict[str, Any]]:
    """``{"token": ..., "op": ..., "args": {...}}`` from one line; InvalidArgumentError says what is wrong."""
    try:
        request = json.loads(line, parse_constant=_reject_constant)
    except RecursionError:
        raise InvalidArgumentError("bad request: nested too deeply") from None
    except ValueError as exc:  # not JSON, not UTF-8, NaN/Infinity
        raise InvalidArgumentError(f"bad request: not a JSON object: {exc}") from None
    if not isinstance(request, dict):
        raise InvalidArgumentError(
            f'bad request: expected a JSON object {{"token", "op", "args"}}, not {type(request).__name__}'
        )
    token, op, args = request.get("token"), request.get("op"), request.get("args")
    if not isinstance(op, str):
        raise InvalidArgumentError('bad request: "op" must be the name of an operation')
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise InvalidArgumentError('bad request: "args" must be a JSON object')
    return (token if isinstance(token, str) else ""), op, args


class _LineTooLong(Exception):
    pass


class _Unauthorized(Exception):
    """A long request line that does not start with the right token: refused before it is read."""


class _Connection:
    """One control connection: its unread bytes, and whether it has shown the token yet."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.buffer = bytearray()
        self.trusted = False  # a request with the right token was answered on it


class ControlServer:
    """Loopback JSON-lines server for CLI commands against a running broker.

    Every line gets one reply line, also a malformed one (an error naming what was wrong); a line longer
    than ``max_line`` bytes is skipped without being held and refused; the connection stays usable.

    Bounds, for a process on the machine that does not have the token: a line longer than ``token_line``
    bytes must start with ``{"token": "<the token>"`` (as the CLI writes it), checked before the rest is read,
    else it is refused and the connection closed; a connection that has not shown the token within
    ``idle_timeout`` seconds is closed; at most ``max_connections`` are served at once, the oldest one that has
    not shown the token closed to make room (a newcomer is refused only when every one has).
    """

    def __init__(
        self,
        namespace: Namespace,
        token: str | None = None,
        *,
        max_line: int = MAX_REQUEST_LINE,
        token_line: int = TOKEN_LINE,
        max_connections: int = MAX_CONTROL_CONNECTIONS,
        idle_timeout: float = 10.0,
        namespaces: Namespaces | None = None,
    ) -> None:
        self.namespace = namespace
        self.namespaces = namespaces  # created at run time: any operation with "namespace": "<name>" runs there
        self.token = token or secrets.token_urlsafe(24)
        self.max_line = max_line
        self.token_line = token_line
        self.max_connections = max_connections
        self.idle_timeout = idle_timeout
        self._prefix = b'{"token": ' + json.dumps(self.token).encode()
        self._connections: dict[_Connection, None] = {}  # oldest first
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._server = await asyncio.start_server(self._serve, host, port)
        self.port = self._server.sockets[0].getsockname()[1]

    def _admit(self, conn: _Connection) -> bool:
        if len(self._connections) >= self.max_connections:
            untrusted = next((c for c in self._connections if not c.trusted), None)
            if untrusted is None:
                return False
            _log.warning(
                "control connections at their bound (%d): closing the oldest without the token", len(self._connections)
            )
            self._connections.pop(untrusted, None)
            untrusted.writer.transport.abort()
        self._connections[conn] = None
        return True

    async def _read_line(self, conn: _Connection) -> bytes:
        """One line (b"" at the end); raises _LineTooLong (skipped whole) or _Unauthorized (nothing more read)."""
        buffer = conn.buffer
        skipping = False
        while True:
            end = buffer.find(b"\n")
            if end >= 0:
                line = bytes(buffer[: end + 1])
                del buffer[: end + 1]
                if skipping or len(line) > self.max_line:
                    raise _LineTooLong
                return line
            if skipping:
                buffer.clear()
            elif len(buffer) > self.token_line and not secrets.compare_digest(
                bytes(buffer[: len(self._prefix)]), self._prefix
            ):
                raise _Unauthorized
            elif len(buffer) > self.max_line:
                skipping = True
                buffer.clear()
            read = conn.reader.read(65536)
            chunk = await (read if conn.trusted else asyncio.wait_for(read, self.idle_timeout))
            if not chunk:
                if skipping:
                    raise _LineTooLong
                line = bytes(buffer)
                buffer.clear()
                return line  # the peer closed (a last line without its newline, or nothing)
            buffer += chunk

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Connection(reader, writer)
        try:
            if not self._admit(conn):
                writer.write(json.dumps(_refusal(f"at most {self.max_connections} control connections")).encode())
                writer.write(b"\n")
                await writer.drain()
                return
            while True:
                try:
                    line = await self._read_line(conn)
                except _LineTooLong:
                    reply: dict[str, Any] = {
                        "ok": False,
                        "error": "InvalidArgumentError",
                        "message": f"bad request: a request line longer than {self.max_line} bytes was skipped",
                    }
                except _Unauthorized:
                    message = f"a request line over {self.token_line} bytes must start with the control token"
                    writer.write(json.dumps(_refusal(message)).encode() + b"\n")
                    await writer.drain()
                    return
                else:
                    if not line:
                        break
                    reply = await self._handle(line, conn)
                try:
                    data = json.dumps(reply, default=str).encode() + b"\n"
                except _BAD_INPUT as exc:
                    data = json.dumps(error_to_json(OncebusError(f"the reply could not be encoded: {exc}"))).encode()
                    data += b"\n"
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            self._connections.pop(conn, None)
            writer.close()

    async def _handle(self, line: bytes, conn: _Connection | None = None) -> dict[str, Any]:
        try:
            token, op, args = parse_request(line)
            if not secrets.compare_digest(token.encode(), self.token.encode()):
                return {
                    "ok": False,
                    "error": "UnauthorizedError",
                    "message": "bad control token: run the CLI with the server's data directory",
                }
            if conn is not None:
                conn.trusted = True
            return {"ok": True, "result": await self._dispatch(op, args)}
        except OncebusError as exc:
            return error_to_json(exc)
        except _BAD_INPUT as exc:
            return {"ok": False, "error": "InvalidArgumentError", "message": f"bad request: {_one_line(exc)}"}
        except Exception as exc:  # a bug: answer it, log it once, keep serving
            _log.exception("control operation failed")
            return {"ok": False, "error": "OncebusError", "message": f"internal error: {_one_line(exc)}"}

    async def _dispatch(self, op: str, args: dict[str, Any]) -> Any:
        """``namespaces.*`` on the registry; any other operation on the default namespace, or on the created one
        named by ``args["namespace"]``."""
        if op == "token":
            return self._token(args)
        if op in _NAMESPACE_OPS or "namespace" in args:
            if self.namespaces is None:
                raise InvalidArgumentError("this control server has no namespaces created at run time")
            registry = self.namespaces
            if op in _NAMESPACE_OPS:
                return await _NAMESPACE_OPS[op](registry, args)
            name = args.pop("namespace")
            if name is not None:
                return await dispatch(registry.get(str(name)).namespace, op, args)
        return await dispatch(self.namespace, op, args)

    def _token(self, args: dict[str, Any]) -> dict[str, Any]:
        """A SAS token for ``resource`` (a URI), signed by the server with its key ``key_name`` (a namespace key,
        or an entity's own rule on the resource's entity) and valid ``ttl`` seconds: what ``oncebus token``
        prints, so the keys never leave the server."""
        if self.namespaces is None:
            raise InvalidArgumentError("this control server has no keys to sign with")
        keys = self.namespaces.keys
        resource = args.get("resource")
        if not isinstance(resource, str) or "://" not in resource:
            raise InvalidArgumentError(f"resource must be a URI like sb://127.0.0.1/orders, not {resource!r}")
        name = args.get("key_name") or keys.printed().name
        ttl = args.get("ttl", DEFAULT_TOKEN_SECONDS)
        if isinstance(ttl, bool) or not isinstance(ttl, int) or not 1 <= ttl <= MAX_TOKEN_SECONDS:
            raise InvalidArgumentError(f"ttl must be a whole number of seconds from 1 to {MAX_TOKEN_SECONDS}")
        candidates = keys.candidates(str(name), resource_path(resource))
        if not candidates:
            known = ", ".join(k.name for k in keys.entries())
            raise InvalidArgumentError(
                f"no key named {name!r} for {resource}: the namespace's keys are {known} (or an entity's own rule "
                "on that entity)"
            )
        key, rights, _ = candidates[0]
        expiry = int(time.time()) + ttl
        return {
            "token": make_token(resource, str(name), key, expiry),
            "expires_at": expiry,
            "rights": sorted(rights),
        }

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, KeyError) and exc.args:
        return f"missing {exc.args[0]!r}"
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if isinstance(exc, AttributeError) else text
