"""The ASGI app: routes /metrics, the dashboard page and its static files, and /api/dashboard."""

from __future__ import annotations

import asyncio
import gzip
import html
import json
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric

from oncebus.http.observe._dashboard import dashboard_state
from oncebus.http.observe._metrics import NamespaceCollector

if TYPE_CHECKING:
    from oncebus.broker import Observation

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

STATIC_PREFIX = "/dashboard/static/"
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}


def _static_files() -> dict[str, tuple[bytes, str]]:
    """The dashboard's files, read once from the package."""
    files = {}
    for item in resources.files("oncebus.http.observe").joinpath("static").iterdir():
        suffix = "." + item.name.rsplit(".", 1)[-1]
        if item.is_file() and suffix in _TYPES:
            files[item.name] = (item.read_bytes(), _TYPES[suffix])
    return files


async def _respond(
    send: Send, status: int, body: bytes, content_type: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type.encode()),
                (b"content-length", str(len(body)).encode()),
                (b"cache-control", b"no-cache"),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class _Collected:
    """Metric families already collected (on the broker's loop), for an encoder running in a worker thread."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def _encode(encoder: Callable[[_Collected], bytes], families: _Collected, compress: bool) -> bytes:
    output = encoder(families)
    return gzip.compress(output) if compress else output


def _without_body(send: Send) -> Send:
    """For HEAD: the same status and headers, no body bytes."""

    async def head_send(message: Message) -> None:
        if message["type"] == "http.response.body":
            message = {**message, "body": b""}
        await send(message)

    return head_send


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def make_observe_app(namespace: Observation) -> ASGIApp:
    """The ASGI app serving /metrics, the dashboard (/, /dashboard, /dashboard/static/*) and /api/dashboard.

    Run it on the namespace's event loop: handlers read the broker's counters directly
    (O(entities), no store I/O) and never await the broker. The open connections and links gauges are
    those the AMQP server serving the namespace reports to its observation port (``observer.transport``).
    Mounted under a prefix, it honours the scope's ``root_path``.
    """
    collector = NamespaceCollector(namespace)
    files = _static_files()
    page_template = files["index.html"][0].decode()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # websockets are not served here
        root = scope.get("root_path", "") or ""
        path = scope["path"]
        if root and path.startswith(root):
            path = path[len(root) :] or "/"
        if scope["method"] == "HEAD":
            send = _without_body(send)
        elif scope["method"] != "GET":
            await _respond(send, 405, b"only GET and HEAD are served here\n", "text/plain", [(b"allow", b"GET, HEAD")])
            return
        if path == "/metrics":
            await _metrics(scope, send)
        elif path in ("/", "/dashboard", "/dashboard/"):
            page = page_template.replace("{{ROOT}}", html.escape(root, quote=True))
            await _respond(send, 200, page.encode(), _TYPES[".html"])
        elif path.startswith(STATIC_PREFIX) and path[len(STATIC_PREFIX) :] in files:
            body, content_type = files[path[len(STATIC_PREFIX) :]]
            await _respond(send, 200, body, content_type)
        elif path == "/api/dashboard":
            await _dashboard(scope, send)
        else:
            await _respond(send, 404, f"not found: {path}\n".encode(), "text/plain; charset=utf-8")

    async def _metrics(scope: Scope, send: Send) -> None:
        """Collect on the loop (O(entities): reads counters), encode in a thread (prometheus-client encoders)."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        encoder, content_type = choose_encoder(headers.get("accept", ""))
        compress = "gzip" in headers.get("accept-encoding", "").lower()
        families = _Collected(list(collector.collect()))
        body = await asyncio.to_thread(_encode, encoder, families, compress)
        extra = [(b"content-encoding", b"gzip")] if compress else []
        await _respond(send, 200, body, content_type, extra)

    async def _dashboard(scope: Scope, send: Send) -> None:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        since_text = (query.get("since") or [""])[0]
        since = None
        if since_text:
            try:
                since = int(since_text)
            except ValueError:
                body = f"since must be an integer of microseconds, not {since_text!r}\n".encode()
                await _respond(send, 400, body, "text/plain; charset=utf-8")
                return
        state = dashboard_state(namespace, since_us=since)  # on the loop: reads counters
        body = await asyncio.to_thread(lambda: json.dumps(state, allow_nan=False).encode())
        await _respond(send, 200, body, "application/json")

    return app
