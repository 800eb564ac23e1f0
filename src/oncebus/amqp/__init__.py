"""AMQP 1.0 front end: the azure-servicebus SDK talks to a Namespace through ``serve_amqp``."""

from __future__ import annotations

from oncebus.amqp.sas import DEFAULT_KEY, DEFAULT_KEY_NAME, DEFAULT_KEYS, connection_string, parse_keys
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
