"""Clocks for the broker: the real one and a manual one for tests.

The broker never reads the time itself; it asks its clock. The system clock
never runs backwards (a step back of the wall clock holds the time still), as
the dedup index requires non-decreasing times.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Protocol

from oncebus.core.timeutil import datetime_to_us, us_to_datetime

__all__ = ["Clock", "FileClock", "ManualClock", "SystemClock", "datetime_to_us", "us_to_datetime"]


class Clock(Protocol):
    def now_us(self) -> int:
        """Microseconds since the Unix epoch, UTC, never decreasing."""
        ...


class SystemClock:
    def __init__(self) -> None:
        self._last = 0
        self._lock = threading.Lock()

    def now_us(self) -> int:
        now = time.time_ns() // 1_000
        with self._lock:
            if now < self._last:
                return self._last
            self._last = now
            return now


class FileClock:
    """For end-to-end tests of ``oncebus serve``: the time is read from a file the test writes.

    The file holds an integer of microseconds since the epoch; until it exists the
    system time is used. Never runs backwards. Enabled by ``ONCEBUS_CLOCK_FILE``.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._stamp = -1
        self._value = 0

    def now_us(self) -> int:
        try:
            stamp = os.stat(self.path).st_mtime_ns
        except FileNotFoundError:
            self._value = max(self._value, time.time_ns() // 1_000)
            return self._value
        if stamp != self._stamp:
            text = self.path.read_text().strip()
            if text:
                self._stamp = stamp
                self._value = max(self._value, int(text))
        return self._value


class ManualClock:
    """A clock that moves only when told to."""

    def __init__(self, start_us: int = 1_700_000_000_000_000) -> None:
        self._now = start_us

    def now_us(self) -> int:
        return self._now

    def advance(self, seconds: float = 0.0, *, us: int = 0) -> int:
        self._now += round(seconds * 1_000_000) + us
        return self._now

    def set(self, us: int) -> None:
        if us < self._now:
            raise ValueError("a ManualClock does not go backwards")
        self._now = us
