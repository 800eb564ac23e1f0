"""Change signals: waiters on the broker's loop woken when messages may have become available.

Each receivable (queue, subscription, dead-letter sub-queue) has its own signal, notified when one
of its messages becomes available (a committed send, an abandon, a lock or session released, a
scheduled message due); the namespace has one more for what concerns every receiver (an entity
deleted, the namespace reset or reloaded, the stored backlog loaded). A receiver waits on its
receivable's and the namespace's (``wait_any``), so traffic elsewhere never wakes it.

``wait_any(signals, timeout, wake)`` returns on the next ``notify`` of any of them, when ``wake``
completes, or after ``timeout`` seconds, whichever comes first. Callers loop and look again: a
wake-up is a hint, never a promise that something is there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence


class ChangeSignal:
    def __init__(self) -> None:
        self._waiters: set[asyncio.Future[None]] = set()

    def notify(self) -> None:
        if not self._waiters:
            return
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def wait(self, timeout: float | None, wake: asyncio.Future[None] | None = None) -> None:
        await wait_any((self,), timeout, wake)


async def wait_any(
    signals: Sequence[ChangeSignal], timeout: float | None, wake: asyncio.Future[None] | None = None
) -> None:
    """Until any of ``signals`` is notified, ``wake`` completes, or ``timeout`` seconds pass."""
    loop = asyncio.get_running_loop()
    change: asyncio.Future[None] = loop.create_future()
    for signal in signals:
        signal._waiters.add(change)
    try:
        waits: set[asyncio.Future[None]] = {change} if wake is None else {change, wake}
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for signal in signals:
            signal._waiters.discard(change)
        if not change.done():
            change.cancel()


async def wait_until(signals: Sequence[ChangeSignal], deadline: float | None, poll: float) -> bool:
    """Wait for a change of any of ``signals``, at most ``poll`` seconds and not past ``deadline`` (loop
    time; None: no deadline). False, without waiting, once the deadline has passed."""
    timeout = poll
    if deadline is not None:
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining <= 0:
            return False
        timeout = min(timeout, remaining)
    await wait_any(signals, timeout)
    return True
