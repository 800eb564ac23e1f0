"""Service Bus's REST data plane: send, peek-lock, unlock, complete, renew and receive-and-delete over HTTP.

Routes (as Azure's REST API names them; ``{entity}`` is a queue, a topic for sends, or
``{topic}/subscriptions/{sub}`` for receives)::

    POST    /{entity}/messages                       send one message (201); batch with
                                                     Content-Type: application/vnd.microsoft.servicebus.json
    POST    /{entity}/messages/head?timeout=N        peek-lock: 201 with the message, Location = its lock URI; 204 none
    DELETE  /{entity}/messages/head?timeout=N        receive and delete: 200 with the message; 204 none
    PUT     /{entity}/messages/{seq}/{lock token}    unlock (abandon)           200
    DELETE  /{entity}/messages/{seq}/{lock token}    complete                   200
    POST    /{entity}/messages/{seq}/{lock token}    renew the lock             200

A message's system properties travel in the ``BrokerProperties`` header (JSON; names from
:mod:`oncebus.core.properties`, dates RFC 1123, ``TimeToLive`` in seconds); any other header that is not an
HTTP one is an application property (a JSON string, number or boolean, or the text as is; a JSON array or
object is refused, as AMQP carries none). Property values are checked by the core as every door's are
(:func:`oncebus.core.properties.check_application_properties`). ``Authorization: SharedAccessSignature ...``
must cover the entity and carry Send (sending) or Listen (receiving, settling). Azure's status codes, read from
each error's class (``data_plane_status``, else ``status``): 400 bad input, 401 no or wrong key or right, 403
message too large or entity disabled, 410 no such entity, 404 no such lock. Everything goes through the
Messaging port.
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime, parsedate_to_datetime
from typing import Any
from urllib.parse import parse_qs, quote

from oncebus.auth import LISTEN, SEND, KeyRing, authorize_request
from oncebus.broker import Messaging
from oncebus.core.errors import ArgumentOutOfRangeError, InvalidArgumentError, OncebusError, named, status_of
from oncebus.core.messages import Message, ServiceBusReceiveMode
from oncebus.core.properties import (
    APPLICATION_VALUES,
    BROKER_PROPERTIES,
    SENDER_PROPERTIES,
    SystemProperty,
    text_error,
)
from oncebus.core.received import ReceivedMessage
from oncebus.http.jsonbody import parse_json
from oncebus.http.server import Receive, Scope, Send

BATCH_CONTENT_TYPE = "application/vnd.microsoft.servicebus.json"
MAX_TIMEOUT = 60.0  # seconds a receive may wait (Azure's documented default and what we allow at most)

_ROUTE = re.compile(r"^(?P<entity>.+?)/messages(?:/(?P<head>head)|/(?P<id>[^/]+)/(?P<token>[^/]+))?$", re.IGNORECASE)

# headers that are HTTP's, not application properties
_HTTP_HEADERS = frozenset(
    {
        "accept",
        "accept-encoding",
        "accept-language",
        "authorization",
        "brokerproperties",
        "cache-control",
        "connection",
        "content-length",
        "content-type",
        "cookie",
        "expect",
        "host",
        "keep-alive",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "user-agent",
        "x-ms-retrypolicy",
        "x-ms-version",
        "x-ms-client-request-id",
        "traceparent",
        "tracestate",
    }
)

_BROKER_PROPERTIES_SHAPE = "a JSON object of system properties: MessageId, Label, TimeToLive, ..."
_BATCH_SHAPE = (
    "a non-empty JSON array of objects {Body: a string, BrokerProperties: an object, UserProperties: an object of "
    "strings, numbers and booleans}"
)

_BY_NAME: dict[str, SystemProperty] = {}
for _p in SENDER_PROPERTIES:
    for _n in (_p.name, *_p.aliases):
        _BY_NAME[_n.lower()] = _p


def match_route(method: str, path: str) -> re.Match[str] | None:
    """The REST data plane's route for this request, or None (then it is the administration API's)."""
    m = _ROUTE.match(path.strip("/"))
    if m is None:
        return None
    if m["head"] is not None:
        return m if method in ("POST", "DELETE") else None
    if m["token"] is not None:
        return m if method in ("PUT", "DELETE", "POST") else None
    return m if method == "POST" else None


class RestError(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status


def rfc1123(value: datetime) -> str:
    return format_datetime(value.astimezone(UTC), usegmt=True)


def _parse_date(name: str, value: Any) -> datetime:
    if not isinstance(value, str):
        raise InvalidArgumentError(f"BrokerProperties {name} must be an RFC 1123 date text, not {value!r}")
    try:
        parsed = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        parsed = None
    if parsed is None:
        raise InvalidArgumentError(
            f"BrokerProperties {name} {value!r} is not an RFC 1123 date (like 'Sun, 06 Nov 1994 08:49:37 GMT')"
        )
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _seconds(name: str, value: Any) -> timedelta:
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."  # JSON numbers run to 4300 digits
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value or value <= 0:
        raise InvalidArgumentError(f"BrokerProperties {name} must be a positive number of seconds, not {shown}")
    try:
        return timedelta(seconds=value)
    except OverflowError:
        raise ArgumentOutOfRangeError(
            f"BrokerProperties {name} is {shown} seconds, too large: at most {timedelta.max.total_seconds():.0f}"
        ) from None


def message_of(body: bytes, broker: Mapping[str, Any], user: Mapping[str, Any], content_type: str | None) -> Message:
    """A Message from a REST body, its BrokerProperties and its application properties (unknown broker
    properties are ignored, as Azure ignores them)."""
    fields: dict[str, Any] = {}
    if content_type:
        fields["content_type"] = content_type
    for key, value in broker.items():
        prop = _BY_NAME.get(str(key).lower())
        if prop is None or prop.field is None or value is None:
            continue
        if prop.kind is str:
            if not isinstance(value, str):
                raise InvalidArgumentError(f"BrokerProperties {key} must be a JSON string, not {value!r}")
            fields[prop.field] = value
        elif prop.kind is timedelta:
            fields[prop.field] = _seconds(str(key), value)
        elif prop.kind is datetime:
            fields[prop.field] = _parse_date(str(key), value)
    return Message(body=body, application_properties=dict(user), **fields)


def _user_value(name: str, text: str) -> Any:
    """A property header's value: the JSON string, number or boolean it holds, else its text as is (``null`` too).

    A JSON array or object is refused (no door carries one); so is one nested too deeply to read.
    """
    try:
        value = json.loads(text)
    except RecursionError:
        kind = "a JSON array or object nested too deeply to read"
    except ValueError:
        return text
    else:
        if not isinstance(value, list | dict):
            return value if isinstance(value, str | int | float | bool) else text
        kind = "a JSON array" if isinstance(value, list) else "a JSON object"
    raise InvalidArgumentError(
        f"property header {name}: its value is {kind}, which is not a property value; a property header holds "
        f"a JSON string, number or boolean (a value is {APPLICATION_VALUES}), or text"
    )


def broker_properties(message: ReceivedMessage) -> dict[str, Any]:
    """A received message's BrokerProperties, as Service Bus's REST API writes them."""
    out: dict[str, Any] = {}
    for prop in (*SENDER_PROPERTIES, *BROKER_PROPERTIES):
        if prop.field is None or prop.field in ("content_type",):
            continue
        value = getattr(message, prop.field, None)
        if value is None:
            continue
        name = prop.aliases[0] if prop.aliases else prop.name  # Subject: "Label" on REST
        if isinstance(value, datetime):
            out[name] = rfc1123(value)
        elif isinstance(value, timedelta):
            out[name] = value.total_seconds()
        elif isinstance(value, int) and not isinstance(value, bool):
            out[name] = value
        elif prop.field == "state":
            out[name] = {"0": "Active", "1": "Deferred", "2": "Scheduled", "3": "DeadLettered"}.get(
                str(int(value)), str(value)
            )
        else:
            out[name] = value if isinstance(value, str) else str(value)
    return out


def _header_value(value: Any) -> bytes:
    if value is None or isinstance(value, str | int | float | bool):
        return json.dumps(value).encode("latin-1")
    return json.dumps(str(value)).encode("latin-1")


class RestMessaging:
    """An ASGI application serving the REST data plane for one namespace, through the Messaging port."""

    def __init__(self, messaging: Messaging, keys: KeyRing, *, wall_time: Callable[[], float] = time.time) -> None:
        self.messaging = messaging
        self.keys = keys
        self.wall_time = wall_time

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = bytearray()
        while True:
            event = await receive()
            if event["type"] == "http.disconnect":
                return
            body += event.get("body", b"")
            if not event.get("more_body", False):
                break
        try:
            status, headers, payload = await self.handle(scope, bytes(body))
        except RestError as exc:
            status, headers, payload = exc.status, [], (str(exc) + "\n").encode()
            headers.append((b"content-type", b"text/plain; charset=utf-8"))
        except OncebusError as exc:
            status, headers, payload = status_of(exc, data_plane=True), [], (str(exc) + "\n").encode()
            headers.append((b"content-type", b"text/plain; charset=utf-8"))
        headers.append((b"content-length", str(len(payload)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    async def handle(self, scope: Scope, body: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        method = str(scope["method"]).upper()
        path = str(scope["path"]).strip("/")
        m = match_route(method, path)
        if m is None:
            raise RestError(405, f"{method} /{path} is not a REST messaging operation")
        entity = m["entity"]
        headers: dict[str, bytes] = {}
        for k, v in scope["headers"]:
            headers[bytes(k).decode("latin-1").lower()] = bytes(v)
        query = parse_qs(bytes(scope.get("query_string", b"")).decode("latin-1"))
        sending = m["head"] is None and m["token"] is None
        self._authorize(headers, entity, SEND if sending else LISTEN, scope)
        if sending:
            return await self._send(entity, headers, body)
        if m["head"] is not None:
            timeout = self._timeout(query)
            mode = ServiceBusReceiveMode.PEEK_LOCK if method == "POST" else ServiceBusReceiveMode.RECEIVE_AND_DELETE
            return await self._receive(scope, headers, entity, mode, timeout)
        token = m["token"]
        try:
            lock = uuid.UUID(token)
        except ValueError:
            raise RestError(404, f"the lock token {token!r} is not a lock token (a UUID)") from None
        if method == "PUT":
            await self.messaging.abandon(entity, lock)
            return 200, [], b""
        if method == "DELETE":
            await self.messaging.complete(entity, lock)
            return 200, [], b""
        until = await self.messaging.renew_lock(entity, lock)
        bp = json.dumps({"LockToken": str(lock), "LockedUntilUtc": rfc1123(until)}).encode("latin-1")
        return 200, [(b"brokerproperties", bp)], b""

    def _authorize(self, headers: Mapping[str, bytes], entity: str, right: str, scope: Scope) -> None:
        header, host = headers.get("authorization"), headers.get("host")
        authorize_request(
            None if header is None else header.decode("latin-1"),
            self.keys,
            entity,
            right,
            host=None if host is None else host.decode("latin-1"),
            now=self.wall_time(),
            missing=f"sign it with a SharedAccessSignature made with a key with the {right} right",
        )

    @staticmethod
    def _timeout(query: Mapping[str, list[str]]) -> float:
        values = query.get("timeout")
        if not values:
            return MAX_TIMEOUT
        try:
            value = float(values[0])
        except ValueError:
            raise InvalidArgumentError(f"timeout must be a number of seconds, not {values[0]!r}") from None
        if not math.isfinite(value) or value < 0:
            raise InvalidArgumentError(f"timeout must be from 0 to {MAX_TIMEOUT:g} seconds, not {values[0]!r}")
        return min(value, MAX_TIMEOUT)

    async def _send(
        self, entity: str, headers: Mapping[str, bytes], body: bytes
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        content_type = headers.get("content-type", b"").decode("latin-1").strip() or None
        if content_type is not None and content_type.split(";")[0].strip().lower() == BATCH_CONTENT_TYPE:
            messages = self._batch(body)
        else:
            raw = headers.get("brokerproperties")
            broker: Any = {}
            if raw is not None:
                broker = parse_json(raw, "the BrokerProperties header", _BROKER_PROPERTIES_SHAPE)
                if not isinstance(broker, dict):
                    raise InvalidArgumentError(f"the BrokerProperties header must be {_BROKER_PROPERTIES_SHAPE}")
            user = {k: _user_value(k, v.decode("latin-1")) for k, v in headers.items() if k not in _HTTP_HEADERS}
            messages = [message_of(body, broker, user, content_type)]
        await self.messaging.send(entity, messages)
        return 201, [], b""

    @staticmethod
    def _batch(body: bytes) -> list[Message]:
        items = parse_json(body, "the batch", _BATCH_SHAPE)
        if not isinstance(items, list) or not items:
            raise InvalidArgumentError(f"the batch must be {_BATCH_SHAPE}")
        messages = []
        for i, item in enumerate(items):
            where = f"message {i + 1} of {len(items)}"  # as the core names a batch's messages
            if not isinstance(item, dict) or not isinstance(item.get("Body", ""), str):
                raise InvalidArgumentError(f"{where} must be an object whose Body is a JSON string")
            broker = item.get("BrokerProperties") or {}
            user = item.get("UserProperties") or {}
            if not isinstance(broker, dict) or not isinstance(user, dict):
                raise InvalidArgumentError(f"{where}: BrokerProperties and UserProperties must be objects")
            text = str(item.get("Body", ""))
            problem = text_error(text)
            if problem is not None:
                raise InvalidArgumentError(f"{where}: its Body {problem}; a Body is Unicode text")
            try:
                messages.append(message_of(text.encode("utf-8"), broker, user, None))
            except InvalidArgumentError as exc:
                raise named(where, exc) from None
        return messages

    async def _receive(
        self, scope: Scope, headers: Mapping[str, bytes], entity: str, mode: ServiceBusReceiveMode, timeout: float
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        self.messaging.check_receivable(entity)
        got = await self.messaging.receive(entity, 1, receive_mode=mode, max_wait_time=timeout)
        if not got:
            return 204, [], b""
        message = got[0]
        out: list[tuple[bytes, bytes]] = [
            (b"brokerproperties", json.dumps(broker_properties(message)).encode("latin-1")),
            (b"content-type", (message.content_type or "application/octet-stream").encode("latin-1", "replace")),
        ]
        for key, value in message.application_properties.items():
            name = str(key)
            if name.isascii() and name.replace("-", "").replace("_", "").isalnum():
                out.append((name.encode("ascii"), _header_value(value)))
        if mode is ServiceBusReceiveMode.PEEK_LOCK:
            host = headers.get("host", b"localhost").decode("latin-1")
            base = f"{scope.get('scheme', 'https')}://{host}"
            location = f"{base}/{quote(entity)}/messages/{message.sequence_number}/{message.lock_token}"
            out.append((b"location", location.encode("latin-1")))
            return 201, out, message.body
        return 200, out, message.body


__all__ = ["RestError", "RestMessaging", "broker_properties", "match_route", "message_of"]
