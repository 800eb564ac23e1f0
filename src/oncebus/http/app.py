"""The top-level HTTP application (ASGI): health, the administration API, and an optional mounted app.

``GET /health`` answers without a key (for probes and ``curl``). ``/metrics``,
``/``, ``/dashboard...`` and ``/api/dashboard...`` go to the mounted ASGI app
when one is given (the dashboard and Prometheus exposition); everything else
is the administration API (:mod:`oncebus.http.admin`), which requires a key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from oncebus import __version__
from oncebus.broker import Namespace
from oncebus.http.admin import AdminApi
from oncebus.http.rules import RuleBook
from oncebus.http.server import ASGIApp, Receive, Scope, Send

MOUNTED_EXACT = ("/", "/metrics")
MOUNTED_PREFIXES = ("/dashboard", "/api/dashboard")


WEBSOCKET_TEXT = (
    "AMQP over WebSockets is not served by oncebus: with an emulator connection string the SDK "
    "(azure-servicebus 7.15) drops the endpoint's port and opens ws://<host>/$servicebus/websocket on port 80 "
    "(sync) or 443 (aio); use the default TransportType.Amqp\n"
)


async def _text(send: Send, status: int, text: str) -> None:
    body = text.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


def is_mounted_path(path: str) -> bool:
    return path in MOUNTED_EXACT or any(path == p or path.startswith(p + "/") for p in MOUNTED_PREFIXES)


class HttpApp:
    def __init__(
        self,
        namespace: Namespace,
        keys: Mapping[str, str],
        *,
        mounted: ASGIApp | None = None,
        rules: RuleBook | None = None,
        namespace_name: str = "oncebus",
    ) -> None:
        self.namespace = namespace
        self.admin = AdminApi(namespace, keys, rules=rules, namespace_name=namespace_name)
        self.mounted = mounted

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # HttpProtocol makes only http scopes; WebSocket upgrades get a 501 below
        path = str(scope["path"])
        if any(k.lower() == b"upgrade" and v.lower() == b"websocket" for k, v in scope["headers"]):
            await _text(send, 501, WEBSOCKET_TEXT)
        elif path == "/health" and scope["method"] in ("GET", "HEAD"):
            await self._health(scope, send)
        elif self.mounted is not None and is_mounted_path(path):
            await self.mounted(scope, receive, send)
        else:
            await self.admin(scope, receive, send)

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
