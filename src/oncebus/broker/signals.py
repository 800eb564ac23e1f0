"""Change signals: waiters on the broker's loop woken when messages may have become available.

One way of waiting: ``wait(timeout, wake)`` returns on the next ``notify`` (a send
committed, an abandon, a tick), when ``wake`` completes, or after ``timeout``
seconds, whichever comes first. Callers loop and look again: a wake-up is a hint,
never a promise that something is there.
"""

from __future__ import annotations

import asyncio


class ChangeSignal:
    def __init__(self) -> None:
        self._waiters: set[asyncio.Future[None]] = set()

    def notify(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    async def wait(self, timeout: float | None, wake: asyncio.Future[None] | None = None) -> None:
        loop = asyncio.get_running_loop()
        change: asyncio.Future[None] = loop.create_future()
        self._waiters.add(change)
        try:
            waits: set[asyncio.Future[None]] = {change} if wake is None else {change, wake}
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._waiters.discard(change)
            if not change.done():
                change.cancel()

    async def wait_until(self, deadline: float | None, poll: float) -> bool:
        """Wait for a change, at most ``poll`` seconds and not past ``deadline`` (loop time; None: no deadline).

        False, without waiting, once the deadline has passed.
        """
        timeout = poll
        if deadline is not None:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return False
            timeout = min(timeout, remaining)
        await self.wait(timeout)
        return True
