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
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from oncebus.broker import Namespace
from oncebus.core import errors
from oncebus.core.durations import parse_duration
from oncebus.core.errors import ArgumentOutOfRangeError, InvalidArgumentError, OncebusError
from oncebus.core.messages import Message, ServiceBusReceiveMode
from oncebus.core.rules import RuleProperties
from oncebus.core.timeutil import datetime_to_us, us_to_datetime

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
def message_from_json(data: dict[str, Any]) -> Message:
    if not isinstance(data, dict):
        raise InvalidArgumentError(f"each message must be a JSON object, not {type(data).__name__}")
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
    ttl = data.get("time_to_live")
    return Message(
        body=body,
        message_id=data.get("message_id"),
        session_id=data.get("session_id"),
        partition_key=data.get("partition_key"),
        correlation_id=data.get("correlation_id"),
        subject=data.get("subject"),
        content_type=data.get("content_type"),
        application_properties=dict(properties),
        time_to_live=None if ttl is None else parse_duration(ttl, name="time_to_live"),
        scheduled_enqueue_time_utc=_scheduled(data.get("scheduled_enqueue_time_us")),
    )


def _scheduled(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"scheduled_enqueue_time_us must be an integer (microseconds), not {value!r}")
    if not 0 <= value <= LATEST_US:
        raise ArgumentOutOfRangeError(
            f"scheduled_enqueue_time_us {value} is out of range: a scheduled time must be between 1970 and "
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
    return {"now_us": ns.clock.now_us()}


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
    cls = getattr(errors, str(data.get("error")), OncebusError)
    if not (isinstance(cls, type) and issubclass(cls, OncebusError)):
        cls = OncebusError
    return cls(str(data.get("message")))


# ---------------------------------------------------------------------------------- the socket
MAX_REQUEST_LINE = 64 * 1024 * 1024
"""Longest request line the control socket reads (a send of base64 bodies); longer lines are refused."""

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


async def _read_line(reader: asyncio.StreamReader) -> bytes:
    """One line (b"" at the end); a line over the reader's limit is skipped whole and raises _LineTooLong."""
    try:
        return await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        return exc.partial  # the peer closed (a last line without its newline, or nothing)
    except asyncio.LimitOverrunError as exc:
        consumed = exc.consumed
    while True:  # discard up to and including the newline, a limit's worth at a time
        await reader.readexactly(consumed)
        try:
            await reader.readuntil(b"\n")
            raise _LineTooLong
        except asyncio.IncompleteReadError:
            raise _LineTooLong from None
        except asyncio.LimitOverrunError as exc:
            consumed = exc.consumed


class ControlServer:
    """Loopback JSON-lines server for CLI commands against a running broker.

    Every line gets one reply line, also a malformed one (an error naming what was wrong); a line longer
    than ``max_line`` bytes is skipped without being held and refused; the connection stays usable.
    """

    def __init__(self, namespace: Namespace, token: str | None = None, *, max_line: int = MAX_REQUEST_LINE) -> None:
        self.namespace = namespace
        self.token = token or secrets.token_urlsafe(24)
        self.max_line = max_line
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._server = await asyncio.start_server(self._serve, host, port, limit=self.max_line)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    line = await _read_line(reader)
                except _LineTooLong:
                    reply: dict[str, Any] = {
                        "ok": False,
                        "error": "InvalidArgumentError",
                        "message": f"bad request: a request line longer than {self.max_line} bytes was skipped",
                    }
                else:
                    if not line:
                        break
                    reply = await self._handle(line)
                try:
                    data = json.dumps(reply, default=str).encode() + b"\n"
                except _BAD_INPUT as exc:
                    data = json.dumps(error_to_json(OncebusError(f"the reply could not be encoded: {exc}"))).encode()
                    data += b"\n"
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _handle(self, line: bytes) -> dict[str, Any]:
        try:
            token, op, args = parse_request(line)
            if not secrets.compare_digest(token.encode(), self.token.encode()):
                return {
                    "ok": False,
                    "error": "UnauthorizedError",
                    "message": "bad control token: run the CLI with the server's data directory",
                }
            return {"ok": True, "result": await dispatch(self.namespace, op, args)}
        except OncebusError as exc:
            return error_to_json(exc)
        except _BAD_INPUT as exc:
            return {"ok": False, "error": "InvalidArgumentError", "message": f"bad request: {_one_line(exc)}"}
        except Exception as exc:  # a bug: answer it, log it once, keep serving
            _log.exception("control operation failed")
            return {"ok": False, "error": "OncebusError", "message": f"internal error: {_one_line(exc)}"}

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, KeyError) and exc.args:
        return f"missing {exc.args[0]!r}"
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if isinstance(exc, AttributeError) else text
