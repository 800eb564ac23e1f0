"""Conversions between integer microseconds since the epoch (UTC) and datetimes, and time arithmetic. No clock here.

Times run from year 1 to year 9999 (what a ``datetime`` and .NET's ``DateTime`` hold). A moment computed
past the end (an expiry from a huge time to live, a lock past year 9999) means *never*, as in Service Bus,
where ``ExpiresAtUtc`` of a message whose time to live is ``TimeSpan.MaxValue`` is ``DateTime.MaxValue``:
:func:`add_us` returns None for it and :func:`clamp_us` caps it. A moment *given* past the end (a scheduled
enqueue time) is refused with an :class:`ArgumentOutOfRangeError` by :func:`us_to_datetime`.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from oncebus.core.errors import ArgumentOutOfRangeError, InvalidArgumentError

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MAX_DATETIME = datetime.max.replace(tzinfo=UTC)  # 9999-12-31T23:59:59.999999Z
MIN_DATETIME = datetime.min.replace(tzinfo=UTC)


def datetime_to_us(value: datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    delta = value - EPOCH
    return delta.days * 86_400_000_000 + delta.seconds * 1_000_000 + delta.microseconds


MAX_US = datetime_to_us(MAX_DATETIME)
MIN_US = datetime_to_us(MIN_DATETIME)
_RANGE_TEXT = "times must lie between year 1 and year 9999 (UTC)"


def us_to_datetime(us: int | float, *, name: str = "time") -> datetime:
    """The UTC datetime of ``us``; ArgumentOutOfRangeError (naming ``name``) outside years 1 to 9999."""
    if isinstance(us, float) and not math.isfinite(us):
        raise InvalidArgumentError(f"{name}: {us!r} is not a time")
    if not MIN_US <= us <= MAX_US:
        raise ArgumentOutOfRangeError(f"{name}: {us} microseconds since 1970 is out of range; {_RANGE_TEXT}")
    return EPOCH + timedelta(microseconds=us)


def us_to_datetime_or_max(us: int) -> datetime:
    """For showing a stored moment: anything past year 9999 shows as its last microsecond (``DateTime.MaxValue``)."""
    if us >= MAX_US:
        return MAX_DATETIME
    if us <= MIN_US:
        return MIN_DATETIME
    return EPOCH + timedelta(microseconds=us)


def clamp_us(us: int) -> int:
    """``us`` capped at the last microsecond of year 9999 (for moments that must exist, such as a lock's end)."""
    return us if us < MAX_US else MAX_US


def add_us(base_us: int, delta_us: int | None) -> int | None:
    """``base_us + delta_us``, or None (never) when there is no delta or the sum falls after year 9999."""
    if delta_us is None:
        return None
    total = base_us + delta_us
    return None if total > MAX_US else total


def timestamp_ms_to_datetime(value: object, *, name: str) -> datetime:
    """An AMQP timestamp (integer milliseconds since 1970) as a UTC datetime.

    Refuses, naming ``name``, a value that is not an integer or lies outside years 1 to 9999.
    """
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{name} must be a timestamp (milliseconds since 1970), not {type(value).__name__}")
    return us_to_datetime(value * 1000, name=name)
