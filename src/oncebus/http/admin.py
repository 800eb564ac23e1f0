"""The Service Bus administration API (ATOM/XML REST) that ``ServiceBusAdministrationClient`` calls.

Routes (api-version 2017-04, 2021-05 and the SDK 7.15 default 2024-05)::

    GET    /$namespaceinfo
    GET    /$Resources/Queues | /$Resources/Topics        ?$skip=&$top=
    GET | PUT | DELETE  /{queue or topic}                  PUT creates; PUT with If-Match updates
    GET    /{topic}/Subscriptions                          ?$skip=&$top=
    GET | PUT | DELETE  /{topic}/Subscriptions/{sub}
    GET    /{topic}/Subscriptions/{sub}/Rules
    GET | PUT | DELETE  /{topic}/Subscriptions/{sub}/Rules/{rule}   (see rules.py)

Every request carries ``Authorization: SharedAccessSignature ...``, verified as
CBS tokens are (``oncebus.auth``); the token must cover the URL requested (its
resource is that URL, a parent of it, or the namespace root, as the SDKs sign
them) and its key must have the Manage right. Entities are the Namespace's: the
same as the CLI's, the config file's and AMQP's, validated by core.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, quote, urlencode

from oncebus.auth import MANAGE, KeyRing, authorize_request, normalize_path
from oncebus.broker import UNKNOWN_TIME, Administration
from oncebus.core.entities import QueueProperties, SubscriptionProperties, TopicProperties
from oncebus.core.errors import EntityNotFoundError, InvalidArgumentError, OncebusError, status_of
from oncebus.http import atom
from oncebus.http.rules import NamespaceRules, RuleBook
from oncebus.http.server import Receive, Scope, Send

API_VERSIONS = ("2017-04", "2021-05", "2024-05")
DEFAULT_API_VERSION = "2021-05"
MAX_TOP = 1000


@dataclass(frozen=True)
class Reply:
    status: int
    content_type: str
    body: bytes


@dataclass
class Request:
    method: str
    segments: list[str]
    query: dict[str, list[str]]
    headers: dict[bytes, bytes]
    body: bytes
    base: str  # scheme://host
    path: str
    api_version: str

    @property
    def host(self) -> str:
        return self.base.split("://", 1)[-1]

    def href(self, path: str | None = None, query: Mapping[str, Any] | None = None) -> str:
        params = {**(query or {}), "api-version": self.api_version}
        return f"{self.base}/{quote(path if path is not None else self.path, safe='/$')}?{urlencode(params)}"

    def page(self) -> tuple[int, int]:
        def number(name: str, default: int) -> int:
            values = self.query.get(name)
            if not values:
                return default
            try:
                value = int(values[0])
            except ValueError:
                raise InvalidArgumentError(f"{name} must be a whole number, not {values[0]!r}") from None
            if value < 0:
                raise InvalidArgumentError(f"{name} must not be negative")
            return value

        skip, top = number("$skip", 0), number("$top", 100)
        if not 1 <= top <= MAX_TOP:
            raise InvalidArgumentError(f"$top {top} is out of range: it must be from 1 to {MAX_TOP}")
        return skip, top


Handler = Callable[[Request], Awaitable[Reply]]


class AdminApi:
    """An ASGI application serving the administration API for one Namespace."""

    def __init__(
        self,
        namespace: Administration,
        keys: Mapping[str, str],
        *,
        rules: RuleBook | None = None,
        namespace_name: str = "oncebus",
        wall_time: Callable[[], float] = time.time,
    ) -> None:
        self.namespace = namespace
        self.keys = KeyRing.of(keys)  # name -> key, with each key's rights
        self.rules: RuleBook = rules if rules is not None else NamespaceRules(namespace)
        self.namespace_name = namespace_name
        self.wall_time = wall_time

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        reply = await self.handle(scope, bytes(body))
        await send(
            {
                "type": "http.response.start",
                "status": reply.status,
                "headers": [
                    (b"content-type", reply.content_type.encode()),
                    (b"content-length", str(len(reply.body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": reply.body})

    # --- dispatch -------------------------------------------------------------------------------
    async def handle(self, scope: Scope, body: bytes) -> Reply:
        try:
            request = self._request(scope, body)
            handler, _ = self._route(request)
            self._authorize(request)
            return await handler(request)
        except OncebusError as exc:
            status = status_of(exc)
            return Reply(status, atom.XML, atom.error_document(status, str(exc)))

    def _request(self, scope: Scope, body: bytes) -> Request:
        headers: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:
            headers[bytes(name).lower()] = bytes(value)
        host = headers.get(b"host", b"localhost").decode("latin-1")
        query = parse_qs(bytes(scope.get("query_string", b"")).decode("latin-1"), keep_blank_values=True)
        path = str(scope["path"]).strip("/")
        versions = query.get("api-version")
        version = versions[0] if versions else DEFAULT_API_VERSION
        if version not in API_VERSIONS:
            raise InvalidArgumentError(
                f"api-version {version!r} is not supported; use one of {', '.join(API_VERSIONS)}"
            )
        return Request(
            method=str(scope["method"]).upper(),
            segments=path.split("/") if path else [],
            query=query,
            headers=headers,
            body=body,
            base=f"{scope.get('scheme', 'https')}://{host}",
            path=path,
            api_version=version,
        )

    def _route(self, request: Request) -> tuple[Handler, str]:
        """The handler and the entity path the request's token must cover ("" = the whole namespace)."""
        segments, method = request.segments, request.method
        lowered = [s.lower() for s in segments]
        if not segments:
            raise EntityNotFoundError("no resource at '/': see the administration API's routes")
        if lowered == ["$namespaceinfo"]:
            return self._only(method, GET=self._namespace_info), ""
        if len(segments) == 2 and lowered[0] == "$resources" and lowered[1] in ("queues", "topics"):
            return self._only(method, GET=self._list_queues if lowered[1] == "queues" else self._list_topics), ""
        if "subscriptions" not in lowered:
            return self._only(method, GET=self._get_entity, PUT=self._put_entity, DELETE=self._delete_entity), (
                "/".join(segments)
            )
        at = lowered.index("subscriptions")
        topic, rest = "/".join(segments[:at]), segments[at + 1 :]
        if not topic:
            raise EntityNotFoundError(f"no resource at '/{request.path}'")
        if not rest:
            return self._only(method, GET=self._list_subscriptions), topic
        scope = f"{topic}/subscriptions/{rest[0]}"
        if len(rest) == 1:
            handler = self._only(
                method, GET=self._get_subscription, PUT=self._put_subscription, DELETE=self._delete_subscription
            )
            return handler, scope
        if rest[1].lower() == "rules" and len(rest) == 2:
            return self._only(method, GET=self._list_rules), scope
        if rest[1].lower() == "rules" and len(rest) == 3:
            return self._only(method, GET=self._get_rule, PUT=self._put_rule, DELETE=self._delete_rule), scope
        raise EntityNotFoundError(f"no resource at '/{request.path}'")

    @staticmethod
    def _only(method: str, **handlers: Handler) -> Handler:
        handler = handlers.get(method)
        if handler is None:
            allowed = ", ".join(handlers)

            async def not_allowed(request: Request) -> Reply:
                text = f"method {method} is not allowed here; allowed: {allowed}"
                return Reply(405, atom.XML, atom.error_document(405, text))

            return not_allowed
        return handler

    def _authorize(self, request: Request) -> None:
        """The token must cover the URL used (as Azure checks it) and carry the Manage right."""
        header, host = request.headers.get(b"authorization"), request.headers.get(b"host")
        wanted = normalize_path(request.path)
        authorize_request(
            None if header is None else header.decode("latin-1"),
            self.keys,
            wanted,
            MANAGE,
            host=None if host is None else host.decode("latin-1"),
            now=self.wall_time(),
            shown=f"{request.base}/{wanted}",
        )

    # --- helpers --------------------------------------------------------------------------------
    def _now(self) -> datetime:
        return datetime.fromtimestamp(self.wall_time(), UTC)

    def _entry(self, request: Request, path: str, title: str, content: str, status: int = 200) -> Reply:
        xml = atom.entry(
            request.href(path), title, content, published=UNKNOWN_TIME, updated=self._now(), author=self.namespace_name
        )
        return Reply(status, atom.ATOM_ENTRY, atom.entry_document(xml))

    def _feed(self, request: Request, title: str, items: Sequence[tuple[str, str, str]]) -> Reply:
        """``items``: (path, title, content) of every entity; the page is cut here."""
        skip, top = request.page()
        page = items[skip : skip + top]
        entries = [
            atom.entry(request.href(p), t, c, published=UNKNOWN_TIME, updated=self._now(), author=self.namespace_name)
            for p, t, c in page
        ]
        more = skip + top < len(items)
        next_href = request.href(query={"$skip": skip + top, "$top": top}) if more else None
        self_href = request.href(query={"$skip": skip, "$top": top})
        return Reply(200, atom.ATOM_FEED, atom.feed_document(self_href, title, entries, next_href, self._now()))

    def _queue_content(self, props: QueueProperties, request: Request) -> str:
        runtime = self.namespace.queue_runtime_properties(props.name)
        return atom.queue_description(props, runtime, request.api_version, request.host)

    def _topic_content(self, props: TopicProperties, request: Request) -> str:
        return atom.topic_description(props, self.namespace.topic_runtime_properties(props.name), request.api_version)

    def _subscription_content(self, topic: str, props: SubscriptionProperties, request: Request) -> str:
        runtime = self.namespace.subscription_runtime_properties(topic, props.name)
        return atom.subscription_description(props, runtime, request.host)

    # --- namespace ------------------------------------------------------------------------------
    async def _namespace_info(self, request: Request) -> Reply:
        quotas = self.namespace.quotas
        units = quotas.messaging_units if quotas.premium else None
        content = atom.namespace_info(self.namespace_name, UNKNOWN_TIME, UNKNOWN_TIME, quotas.tier.value, units)
        return self._entry(request, "$namespaceinfo", self.namespace_name, content)

    async def _list_queues(self, request: Request) -> Reply:
        queues = sorted(self.namespace.list_queues(), key=lambda p: p.name.lower())
        skip, top = request.page()
        items = [(q.name, q.name, "") for q in queues]
        for i in range(skip, min(skip + top, len(items))):  # runtime counts only for the page served
            q = queues[i]
            items[i] = (q.name, q.name, self._queue_content(q, request))
        return self._feed(request, "Queues", items)

    async def _list_topics(self, request: Request) -> Reply:
        topics = sorted(self.namespace.list_topics(), key=lambda p: p.name.lower())
        skip, top = request.page()
        items = [(t.name, t.name, "") for t in topics]
        for i in range(skip, min(skip + top, len(items))):
            t = topics[i]
            items[i] = (t.name, t.name, self._topic_content(t, request))
        return self._feed(request, "Topics", items)

    # --- queues and topics ----------------------------------------------------------------------
    def _entity_name(self, request: Request) -> str:
        return "/".join(request.segments)

    async def _get_entity(self, request: Request) -> Reply:
        name = self._entity_name(request)
        try:
            queue = self.namespace.get_queue(name)
        except EntityNotFoundError:
            pass
        else:
            return self._entry(request, queue.name, queue.name, self._queue_content(queue, request))
        try:
            topic = self.namespace.get_topic(name)
        except EntityNotFoundError:
            raise EntityNotFoundError(
                f"The messaging entity '{name}' could not be found: no queue or topic has that name"
            ) from None
        return self._entry(request, topic.name, topic.name, self._topic_content(topic, request))

    async def _put_entity(self, request: Request) -> Reply:
        name = self._entity_name(request)
        description = atom.parse_description(request.body)
        update = b"if-match" in request.headers
        if description.kind == "Queue":
            changes = atom.entity_changes(description, "Queue", update=update)
            if update:
                queue = await self.namespace.update_queue(name, **changes)
            else:
                queue = await self.namespace.create_queue(name, **changes)
            content = self._queue_content(queue, request)
            return self._entry(request, queue.name, queue.name, content, 200 if update else 201)
        if description.kind == "Topic":
            changes = atom.entity_changes(description, "Topic", update=update)
            if update:
                topic = await self.namespace.update_topic(name, **changes)
            else:
                topic = await self.namespace.create_topic(name, **changes)
            content = self._topic_content(topic, request)
            return self._entry(request, topic.name, topic.name, content, 200 if update else 201)
        raise InvalidArgumentError(
            f"PUT /{request.path} takes a QueueDescription or a TopicDescription, not a {description.kind}Description"
        )

    async def _delete_entity(self, request: Request) -> Reply:
        name = self._entity_name(request)
        try:
            await self.namespace.delete_queue(name)
        except EntityNotFoundError:
            try:
                await self.namespace.delete_topic(name)
            except EntityNotFoundError:
                raise EntityNotFoundError(
                    f"The messaging entity '{name}' could not be found: no queue or topic has that name"
                ) from None
        return Reply(200, atom.XML, b"")

    # --- subscriptions --------------------------------------------------------------------------
    def _topic_and_subscription(self, request: Request) -> tuple[str, str | None]:
        lowered = [s.lower() for s in request.segments]
        at = lowered.index("subscriptions")
        topic = "/".join(request.segments[:at])
        rest = request.segments[at + 1 :]
        return topic, (rest[0] if rest else None)

    async def _list_subscriptions(self, request: Request) -> Reply:
        topic, _ = self._topic_and_subscription(request)
        subscriptions = sorted(self.namespace.list_subscriptions(topic), key=lambda p: p.name.lower())
        skip, top = request.page()
        items = [(f"{topic}/Subscriptions/{s.name}", s.name, "") for s in subscriptions]
        for i in range(skip, min(skip + top, len(items))):
            s = subscriptions[i]
            items[i] = (items[i][0], s.name, self._subscription_content(topic, s, request))
        return self._feed(request, "Subscriptions", items)

    async def _get_subscription(self, request: Request) -> Reply:
        topic, name = self._topic_and_subscription(request)
        assert name is not None
        props = self.namespace.get_subscription(topic, name)
        return self._entry(request, request.path, props.name, self._subscription_content(topic, props, request))

    async def _put_subscription(self, request: Request) -> Reply:
        topic, name = self._topic_and_subscription(request)
        assert name is not None
        description = atom.parse_description(request.body)
        if description.kind != "Subscription":
            raise InvalidArgumentError(
                f"PUT /{request.path} takes a SubscriptionDescription, not a {description.kind}Description"
            )
        update = b"if-match" in request.headers
        changes = atom.entity_changes(description, "Subscription", update=update)
        if update:  # a DefaultRuleDescription only counts at creation, as in Service Bus
            props = await self.namespace.update_subscription(topic, name, **changes)
            status = 200
        else:
            default = self.rules.default_rule(description.fields.get("DefaultRuleDescription"))
            props = await self.namespace.create_subscription(topic, name, default_rule=default, **changes)
            status = 201
        return self._entry(request, request.path, props.name, self._subscription_content(topic, props, request), status)

    async def _delete_subscription(self, request: Request) -> Reply:
        topic, name = self._topic_and_subscription(request)
        assert name is not None
        await self.namespace.delete_subscription(topic, name)
        return Reply(200, atom.XML, b"")

    # --- rules ----------------------------------------------------------------------------------
    def _rule_address(self, request: Request) -> tuple[str, str, str | None]:
        topic, subscription = self._topic_and_subscription(request)
        assert subscription is not None
        lowered = [s.lower() for s in request.segments]
        at = lowered.index("subscriptions")
        rest = request.segments[at + 1 :]
        return topic, subscription, (rest[2] if len(rest) > 2 else None)

    async def _list_rules(self, request: Request) -> Reply:
        topic, subscription, _ = self._rule_address(request)
        rules = self.rules.list_rules(topic, subscription)
        base = f"{topic}/Subscriptions/{subscription}/Rules"
        items = [(f"{base}/{r.name}", r.name, atom.rule_description(r)) for r in rules]
        return self._feed(request, "Rules", items)

    async def _get_rule(self, request: Request) -> Reply:
        topic, subscription, name = self._rule_address(request)
        assert name is not None
        rule = self.rules.get_rule(topic, subscription, name)
        return self._entry(request, request.path, rule.name, atom.rule_description(rule))

    async def _put_rule(self, request: Request) -> Reply:
        topic, subscription, name = self._rule_address(request)
        assert name is not None
        description = atom.parse_description(request.body)
        if description.kind != "Rule":
            raise InvalidArgumentError(
                f"PUT /{request.path} takes a RuleDescription, not a {description.kind}Description"
            )
        update = b"if-match" in request.headers
        rule = await self.rules.put_rule(topic, subscription, name, description, update=update)
        return self._entry(request, request.path, rule.name, atom.rule_description(rule), 200 if update else 201)

    async def _delete_rule(self, request: Request) -> Reply:
        topic, subscription, name = self._rule_address(request)
        assert name is not None
        await self.rules.delete_rule(topic, subscription, name)
        return Reply(200, atom.XML, b"")
