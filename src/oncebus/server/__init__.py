"""The ``oncebus serve`` process: data directory and its lock, control socket, listeners, timers.

``broker/`` is the engine; ``amqp/`` and ``http/`` are adapters beside each other;
this package wires them into one process (``run``), which the CLI calls and which
another program can also run in a thread of its own event loop.
"""

from __future__ import annotations

from oncebus.server.process import ServeError, ServeOptions, run

__all__ = ["ServeError", "ServeOptions", "run"]
