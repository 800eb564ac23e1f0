"""Shared access signatures for AMQP's CBS: the functions live in :mod:`oncebus.auth` (shared with HTTP)."""

from __future__ import annotations

from oncebus.auth import (
    ALL_RIGHTS,
    DEFAULT_KEY,
    DEFAULT_KEY_NAME,
    DEFAULT_KEYS,
    LISTEN,
    MANAGE,
    SEND,
    TOKEN_PREFIX,
    Grant,
    KeyRing,
    SasKey,
    authorize,
    connection_string,
    make_token,
    normalize_path,
    parse_keys,
    path_covers,
    resource_path,
    sign,
    verify_token,
)

__all__ = [
    "ALL_RIGHTS",
    "DEFAULT_KEY",
    "DEFAULT_KEYS",
    "DEFAULT_KEY_NAME",
    "LISTEN",
    "MANAGE",
    "SEND",
    "TOKEN_PREFIX",
    "Grant",
    "KeyRing",
    "SasKey",
    "authorize",
    "connection_string",
    "make_token",
    "normalize_path",
    "parse_keys",
    "path_covers",
    "resource_path",
    "sign",
    "verify_token",
]
