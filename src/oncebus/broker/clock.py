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
    """For tests of ``oncebus serve`` (and ``oncebus.testing``): the time is read from a file the test writes.

    The file holds either an integer of microseconds since the epoch (the time stands
    still at that value), or ``+N``: the system time plus N microseconds (the time runs,
    N ahead; what ``oncebus.testing``'s ``advance()`` writes). Until the file exists the
    system time is used. Enabled by ``ONCEBUS_CLOCK_FILE``. Never runs backwards, except
    when a new ``+N`` lowers the offset: that rewinds on purpose (the testing API's fresh
    namespace; the namespace's own floor still holds the time until it is reset too).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._stamp: tuple[int, int, int] | None = None
        self._fixed: int | None = None
        self._offset = 0
        self._value = 0

    def now_us(self) -> int:
        try:
            st = os.stat(self.path)
            stamp: tuple[int, int, int] | None = (st.st_mtime_ns, st.st_ino, st.st_size)
        except FileNotFoundError:
            stamp = self._stamp = self._fixed = None
            self._offset = 0
        if stamp is not None and stamp != self._stamp:
            self._read(stamp)
        now = self._fixed if self._fixed is not None else time.time_ns() // 1_000 + self._offset
        self._value = max(self._value, now)
        return self._value

    def _read(self, stamp: tuple[int, int, int]) -> None:
        try:
            text = self.path.read_text().strip()
        except FileNotFoundError:
            return
        if not text:  # being written: read it again next time
            return
        self._stamp = stamp
        if text.startswith("+"):
            offset = int(text[1:])
            if offset < self._offset:
                self._value = 0
            self._fixed, self._offset = None, offset
        else:
            self._fixed = int(text)


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
