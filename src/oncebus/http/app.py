"""The top-level HTTP application (ASGI): health, the administration API, and an optional mounted app.

``GET /health`` answers without a key (for probes and ``curl``). ``/metrics``,
``/``, ``/dashboard...`` and ``/api/dashboard...`` go to the mounted ASGI app
when one is given (the dashboard and Prometheus exposition); everything else
is the administration API (:mod:`oncebus.http.admin`), which requires a key.

When the server listens beyond loopback (``observe_needs_key``), the mounted app
needs a key with the Manage right too: ``Authorization: SharedAccessSignature ...``
for the namespace root, or HTTP Basic with the key name as user and the key as
password (what a browser prompts for and Prometheus' ``basic_auth`` sends).
On loopback it stays open, as before.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol, cast

from oncebus import __version__
from oncebus.auth import KeyRing, header_namespace, refusal_text
from oncebus.broker import Broker
from oncebus.core.errors import OncebusError, UnauthorizedError, status_of
from oncebus.http.admin import AdminApi
from oncebus.http.faults import FaultsApi, authorize_root_manage, is_faults_path
from oncebus.http.messages import RestMessaging, match_route
from oncebus.http.rules import RuleBook
from oncebus.http.server import ASGIApp, Receive, Scope, Send

NAMESPACES_PATH = "/$namespaces"
MOUNTED_EXACT = ("/", "/metrics")
MOUNTED_PREFIXES = ("/dashboard", "/api/dashboard")


WEBSOCKET_TEXT = (
    "oncebus serves WebSockets on /$servicebus/websocket only (AMQP over WebSockets, subprotocol AMQPWSB10)\n"
)


async def _text(send: Send, status: int, text: str, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = text.encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra or [])})
    await send({"type": "http.response.body", "body": body})


class NamespaceRegistry(Protocol):
    """What the HTTP doors need of ``oncebus.server.namespaces.Namespaces``."""

    def get(self, name: str) -> Any: ...
    def names(self) -> list[str]: ...
    def describe(self, entry: Any) -> dict[str, Any]: ...
    async def create(self, name: str) -> Any: ...
    async def delete(self, name: str) -> None: ...


def _api_request(scope: Scope) -> bool:
    """An administration client's request (it always names an ``api-version``; a browser or a scraper never does):
    ``get_queue_runtime_properties("")`` asks for ``/`` and must get the API's answer, not the dashboard."""
    return b"api-version=" in bytes(scope.get("query_string") or b"").lower()


def is_mounted_path(path: str) -> bool:
    return path in MOUNTED_EXACT or any(path == p or path.startswith(p + "/") for p in MOUNTED_PREFIXES)


class HttpApp:
    def __init__(
        self,
        namespace: Broker,
        keys: Mapping[str, str],
        *,
        mounted: ASGIApp | None = None,
        rules: RuleBook | None = None,
        namespace_name: str = "oncebus",
        observe_needs_key: bool = False,
        namespaces: NamespaceRegistry | None = None,
        wall_time: Callable[[], float] = time.time,
    ) -> None:
        self.namespace = namespace
        self.wall_time = wall_time
        self.keys = KeyRing.of(keys)
        self.namespaces = namespaces  # created namespaces (oncebus.server.namespaces): key name "<key>@<name>"
        self.admin = AdminApi(namespace, self.keys, rules=rules, namespace_name=namespace_name, wall_time=wall_time)
        self.mounted = mounted
        self.faults = FaultsApi(namespace, self.keys, wall_time=wall_time)  # /$faults (oncebus.http.faults)
        self.messages = RestMessaging(namespace, self.keys, wall_time=wall_time)  # the REST data plane
        self.observe_needs_key = observe_needs_key  # beyond loopback: /metrics and the dashboard need a key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # HttpProtocol makes only http scopes; WebSocket upgrades it does not hand over get a 501 below
        path = str(scope["path"])
        if any(k.lower() == b"upgrade" and v.lower() == b"websocket" for k, v in scope["headers"]):
            await _text(send, 501, WEBSOCKET_TEXT)
        elif path == "/health" and scope["method"] in ("GET", "HEAD"):
            await self._health(scope, send)
        elif self.namespaces is not None and (path == NAMESPACES_PATH or path.startswith(NAMESPACES_PATH + "/")):
            await self._namespaces(scope, receive, send)
        elif self.namespaces is not None and (named := self._named_app(scope)) is not None:
            await named(scope, receive, send)
        elif is_faults_path(path):
            await self.faults(scope, receive, send)
        elif match_route(str(scope["method"]).upper(), path) is not None:
            await self.messages(scope, receive, send)
        elif self.mounted is not None and is_mounted_path(path) and not _api_request(scope):
            refused = self._observe_refused(scope) if self.observe_needs_key else None
            if refused is not None:
                await _text(send, 401, refused + "\n", [(b"www-authenticate", b'Basic realm="oncebus"')])
                return
            await self.mounted(scope, receive, send)
        else:
            await self.admin(scope, receive, send)

    def _observe_refused(self, scope: Scope) -> str | None:
        """None when the request carries a key with the Manage right (SAS token for the root, or Basic)."""
        return self._root_refused(
            scope,
            "this server listens beyond loopback, so /metrics and the dashboard need a key with the Manage right: "
            "HTTP Basic (user: the key name, password: the key) or a SharedAccessSignature",
        )

    def _root_refused(self, scope: Scope, missing: str) -> str | None:
        """None when the request carries a key of this namespace with the Manage right on its root (a SAS token
        for the namespace, or HTTP Basic); otherwise why not (``missing``: what to do without a key)."""
        try:
            authorize_root_manage(scope, self.keys, self.wall_time(), shown=str(scope["path"]), missing=missing)
        except UnauthorizedError as exc:
            return refusal_text(exc)
        return None

    def _named_app(self, scope: Scope) -> ASGIApp | None:
        """The app of the created namespace the request's key name selects (``key@name``); None: the default one."""
        assert self.namespaces is not None
        header = next((bytes(v) for k, v in scope["headers"] if bytes(k).lower() == b"authorization"), None)
        name = header_namespace(None if header is None else header.decode("latin-1"), self.keys)
        if name is None:
            return None
        try:
            entry = self.namespaces.get(name)
        except OncebusError as exc:
            text = f"Unauthorized: {exc}\n"

            async def refused(scope: Scope, receive: Receive, send: Send) -> None:
                await _text(send, 401, text)

            return refused
        app = entry.extras.get("http")
        if app is None:
            app = entry.extras["http"] = HttpApp(entry.namespace, entry.keys)
        return cast(ASGIApp, app)

    async def _namespaces(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``GET /$namespaces`` (list), ``PUT``/``GET``/``DELETE /$namespaces/<name>``: a Manage key of the default
        namespace, for its root (a SAS token or HTTP Basic); JSON answers."""
        assert self.namespaces is not None
        while (await receive()).get("more_body", False):  # a body is not needed: read and drop it
            pass
        path, method = str(scope["path"]), str(scope["method"]).upper()
        name = path[len(NAMESPACES_PATH) + 1 :] or None
        answer: Any
        try:
            refused = self._manage_refused(scope)
            if refused is not None:
                status, answer = 401, {"error": refused}
            elif name is None and method == "GET":
                registry = self.namespaces
                status, answer = 200, [registry.describe(registry.get(n)) for n in registry.names()]
            elif name is not None and method == "PUT":
                status, answer = 201, self.namespaces.describe(await self.namespaces.create(name))
            elif name is not None and method == "GET":
                status, answer = 200, self.namespaces.describe(self.namespaces.get(name))
            elif name is not None and method == "DELETE":
                await self.namespaces.delete(name)
                status, answer = 200, {"deleted": name}
            else:
                allowed = "GET" if name is None else "PUT, GET, DELETE"
                status, answer = 405, {"error": f"method {method} is not allowed on {path}; allowed: {allowed}"}
        except OncebusError as exc:
            status, answer = status_of(exc), {"error": str(exc)}
        body = json.dumps(answer).encode() + b"\n"
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _manage_refused(self, scope: Scope) -> str | None:
        """None when the request carries a Manage key of the default namespace for its root."""
        return self._root_refused(
            scope,
            "creating, listing or deleting namespaces needs a key with the Manage right of the default namespace: "
            "Authorization: SharedAccessSignature ... (for the namespace root) or HTTP Basic",
        )

    async def _health(self, scope: Scope, send: Send) -> None:
        body = json.dumps({"status": "ok", "version": __version__}).encode() + b"\n"
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
