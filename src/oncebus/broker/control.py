"""The control protocol: JSON operations on a namespace, used by the CLI in-process and over a socket.

Every operation takes and returns plain JSON values, so the same ``dispatch``
serves a CLI command run against a stopped data directory (in-process) and
one forwarded to a running ``oncebus serve`` (one JSON object a line over a
loopback TCP connection, authenticated by a token kept in the data directory).
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from oncebus.broker.namespace import Namespace
from oncebus.core import errors
from oncebus.core.durations import parse_duration
from oncebus.core.errors import InvalidArgumentError, OncebusError
from oncebus.core.messages import Message, ServiceBusReceiveMode
from oncebus.core.timeutil import us_to_datetime

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


# ---------------------------------------------------------------------------------- messages
def message_from_json(data: dict[str, Any]) -> Message:
    body = base64.b64decode(data["body_b64"]) if "body_b64" in data else str(data.get("body", "")).encode()
    ttl = data.get("time_to_live")
    return Message(
        body=body,
        message_id=data.get("message_id"),
        session_id=data.get("session_id"),
        partition_key=data.get("partition_key"),
        correlation_id=data.get("correlation_id"),
        subject=data.get("subject"),
        content_type=data.get("content_type"),
        application_properties=dict(data.get("application_properties") or {}),
        time_to_live=None if ttl is None else parse_duration(ttl, name="time_to_live"),
        scheduled_enqueue_time_utc=None
        if data.get("scheduled_enqueue_time_us") is None
        else us_to_datetime(int(data["scheduled_enqueue_time_us"])),
    )


@operation("send")
async def _send(ns: Namespace, args: dict[str, Any]) -> Any:
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
    wait = float(args.get("max_wait_time", 0.0))
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
    return [ns.stats(name) for name in names]


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
class ControlServer:
    """Loopback JSON-lines server for CLI commands against a running broker."""

    def __init__(self, namespace: Namespace, token: str | None = None) -> None:
        self.namespace = namespace
        self.token = token or secrets.token_urlsafe(24)
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._server = await asyncio.start_server(self._serve, host, port, limit=64 * 1024 * 1024)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                try:
                    request = json.loads(line)
                    if not secrets.compare_digest(str(request.get("token", "")), self.token):
                        reply: dict[str, Any] = {
                            "ok": False,
                            "error": "UnauthorizedError",
                            "message": "bad control token: run the CLI with the server's data directory",
                        }
                    else:
                        result = await dispatch(self.namespace, request["op"], request.get("args") or {})
                        reply = {"ok": True, "result": result}
                except OncebusError as exc:
                    reply = error_to_json(exc)
                except (KeyError, TypeError, ValueError) as exc:
                    reply = {"ok": False, "error": "InvalidArgumentError", "message": f"bad request: {exc}"}
                writer.write(json.dumps(reply, default=str).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
