"""AMQP text values read in one place: a symbol, string or binary as ``str``.

Entity addresses are parsed in one place too: :func:`oncebus.broker.paths.address_path`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["string_or_binary", "text"]


def text(value: Any, errors: str = "replace") -> str | None:
    """A symbol, string or binary (UTF-8, undecodable bytes handled per ``errors``) as ``str``; ``None`` stays ``None``.

    Any other value becomes its ``str()``.
    """
    if value is None:
        return None
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", errors)
    return str(value)


def string_or_binary(value: Any) -> str | None:
    """Like :func:`text` but only for a symbol, string or binary: any other value is ``None``."""
    if isinstance(value, str | bytes | bytearray | memoryview):
        return text(value)
    return None
