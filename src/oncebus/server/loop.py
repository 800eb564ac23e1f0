"""The event loop ``oncebus serve`` runs on: uvloop where it is installed (Linux and macOS), else asyncio's own.

uvloop (libuv's loop and transports, in C) takes a socket's bytes to the protocol and a write to the socket
without the Python of asyncio's selector loop: on the receive + complete path, where each completion is one read,
one answer and one loop turn, that is most of what the loop thread spends outside oncebus
(``bench/amqp_send.py``, docs/performance-log.md). Nothing in oncebus depends on which loop runs it: every
transport is used through ``asyncio.Transport``'s methods. ``ONCEBUS_EVENT_LOOP=asyncio`` picks asyncio's loop
(the test suite runs its AMQP round trips on both).
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar

__all__ = ["EVENT_LOOPS", "EventLoop", "available", "default", "run", "running"]

EventLoop = Literal["uvloop", "asyncio"]
EVENT_LOOPS: tuple[EventLoop, ...] = ("uvloop", "asyncio")

T = TypeVar("T")


def available(name: EventLoop) -> bool:
    """True when ``name`` can run here (asyncio always can; uvloop when it is installed)."""
    return name == "asyncio" or importlib.util.find_spec("uvloop") is not None


def default() -> EventLoop:
    """uvloop where it is installed (oncebus depends on it off Windows), else asyncio."""
    return "uvloop" if available("uvloop") else "asyncio"


def run(main: Coroutine[Any, Any, T], name: EventLoop | None = None) -> T:
    """``asyncio.run(main)`` on the loop ``name`` picks (None: :func:`default`)."""
    chosen = default() if name is None else name
    if chosen == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


def running() -> EventLoop:
    """The name of the running loop: ``uvloop`` or ``asyncio``."""
    loop = asyncio.get_running_loop()
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
