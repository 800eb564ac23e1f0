"""Observability over HTTP: Prometheus ``/metrics`` and the live duplicates dashboard at ``/``.

``make_observe_app(namespace)`` returns an ASGI app that serves, on the
broker's own event loop and without any store I/O:

- ``GET /metrics``: the Prometheus text format (OpenMetrics when asked), made
  by ``prometheus-client`` from ``NamespaceCollector``;
- ``GET /`` (and ``/dashboard``): the dashboard page; ``/dashboard/static/*``
  its files (shipped in the package, no build step);
- ``GET /api/dashboard[?since=<microseconds>]``: the page's JSON, polled every second.

Reading costs O(entities + subscriptions), never O(messages).
"""

from __future__ import annotations

from oncebus.http.observe._app import make_observe_app
from oncebus.http.observe._dashboard import dashboard_state
from oncebus.http.observe._metrics import NamespaceCollector, make_registry

__all__ = [
    "NamespaceCollector",
    "dashboard_state",
    "make_observe_app",
    "make_registry",
]
