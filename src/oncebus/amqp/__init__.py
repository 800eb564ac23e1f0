"""AMQP 1.0 front end: the azure-servicebus SDK talks to a Namespace through ``serve_amqp``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from oncebus.amqp.sas import DEFAULT_KEY, DEFAULT_KEY_NAME, DEFAULT_KEYS, connection_string, parse_keys

if TYPE_CHECKING:
    from oncebus.amqp.server import AmqpServer, serve_amqp

__all__ = [
    "DEFAULT_KEY",
    "DEFAULT_KEYS",
    "DEFAULT_KEY_NAME",
    "AmqpServer",
    "connection_string",
    "parse_keys",
    "serve_amqp",
]


def __getattr__(name: str) -> Any:
    # The listener is imported on first use, so that importing a part of the adapter
    # (a connection, the codec) does not import the listener that hosts it.
    if name in ("AmqpServer", "serve_amqp"):
        from oncebus.amqp import server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
