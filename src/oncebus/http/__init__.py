"""HTTP front end: the Service Bus administration API (ATOM/XML), health, and a mount point for the dashboard.

``HttpApp`` is a plain ASGI application; ``HttpProtocol`` serves it over HTTP/1.1
(``h11``) on any asyncio transport, plain or TLS, as handed over by
``oncebus.server``'s sniffing listener.
"""

from __future__ import annotations

from oncebus.http.app import HttpApp
from oncebus.http.server import ASGIApp, HttpLimits, HttpProtocol

__all__ = ["ASGIApp", "HttpApp", "HttpLimits", "HttpProtocol"]
