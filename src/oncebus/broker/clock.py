"""Clocks for the broker: the real one and a manual one for tests.

The broker never reads the time itself; it asks its clock. The system clock
never runs backwards (a step back of the wall clock holds the time still), as
the dedup index requires non-decreasing times.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Protocol

from oncebus.core.timeutil import MAX_US, datetime_to_us, us_to_datetime

_LOG = logging.getLogger("oncebus.clock")

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
    A value that is neither (or lies past year 9999) is ignored: the clock keeps its last
    good time and logs the bad value once, until a good one comes.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._stamp: tuple[int, int, int] | None = None  # mtime, inode, size: a replaced file is always read
        self._fixed: int | None = None
        self._offset = 0
        self._value = 0
        self._bad: str | None = None  # the bad text last logged

    def now_us(self) -> int:
        try:
            st = os.stat(self.path)
            stamp: tuple[int, int, int] | None = (st.st_mtime_ns, st.st_ino, st.st_size)
        except FileNotFoundError:
            stamp = self._stamp = self._fixed = None
            self._offset = 0
        if stamp is not None and stamp != self._stamp:
            try:
                text = self.path.read_text().strip()
            except FileNotFoundError:
                text = ""
            except (OSError, UnicodeDecodeError) as exc:
                text = f"<unreadable: {exc}>"
            if text:  # empty: being written, read it again next time
                self._stamp = stamp
                self._take(text)
        now = self._fixed if self._fixed is not None else time.time_ns() // 1_000 + self._offset
        self._value = max(self._value, min(now, MAX_US))
        return self._value

    def _take(self, text: str) -> None:
        try:
            value = int(text[1:] if text.startswith("+") else text)
            if not 0 <= value <= MAX_US:
                raise ValueError
        except ValueError:
            if text != self._bad:
                self._bad = text
                _LOG.error(
                    "the clock file %s holds %r, not an integer of microseconds since 1970 (before year 10000) "
                    "nor +N (microseconds ahead of the system time); keeping the last good time",
                    self.path,
                    text[:80],
                )
            return
        self._bad = None
        if text.startswith("+"):
            if value < self._offset:
                self._value = 0
            self._fixed, self._offset = None, value
        else:
            self._fixed = value


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
