"""ISO-8601 durations in and out, as Service Bus writes them (``PT10M``, ``P7D``).

Service Bus durations are .NET ``TimeSpan`` values: days, hours, minutes and
seconds, no years or months. ``TimeSpan.MaxValue`` (the default message time
to live) is written ``P10675199DT2H48M5.4775807S``; it is held here as
:data:`TIMESPAN_MAX` (microsecond precision) and formatted back exactly.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import timedelta

from oncebus.core.errors import ArgumentOutOfRangeError, InvalidArgumentError

TIMESPAN_MAX_TEXT = "P10675199DT2H48M5.4775807S"
TIMESPAN_MAX = timedelta(days=10675199, hours=2, minutes=48, seconds=5, microseconds=477580)

_ISO = re.compile(
    r"^(?P<sign>-)?P(?:(?P<weeks>\d+)W)?(?:(?P<days>\d+)D)?"
    r"(?:T(?:(?P<hours>\d+)H)?(?:(?P<minutes>\d+)M)?(?:(?P<seconds>\d+(?:[.,]\d+)?)S)?)?$"
)
# .NET TimeSpan text, as in Azure's messages: [d.]hh:mm:ss[.fffffff]
_TIMESPAN = re.compile(
    r"^(?:(?P<days>\d+)\.)?(?P<hours>\d{1,2}):(?P<minutes>\d{1,2}):(?P<seconds>\d{1,2}(?:\.\d{1,7})?)$"
)


def parse_duration(text: str | timedelta | int | float, *, name: str = "duration") -> timedelta:
    """Parse an ISO-8601 duration (``PT10M``), a TimeSpan (``00:10:00``) or seconds.

    A ``timedelta`` is returned unchanged. Raises InvalidArgumentError naming the
    field and the accepted forms; ArgumentOutOfRangeError for a duration longer than
    .NET's ``TimeSpan.MaxValue`` (about 29,227 years), the longest Service Bus holds.
    """
    if isinstance(text, timedelta):
        return text
    if isinstance(text, bool):
        raise InvalidArgumentError(f"{name}: {text!r} is not a duration")
    return _parse(text, name)


def _parse(text: str | int | float, name: str) -> timedelta:
    if isinstance(text, int | float):
        if isinstance(text, float) and not math.isfinite(text):
            raise InvalidArgumentError(f"{name}: {text!r} is not a duration; give a finite number of seconds")
        return _bounded(name, text, lambda: timedelta(seconds=text))
    if not isinstance(text, str):
        raise InvalidArgumentError(f"{name}: {text!r} is not a duration")
    raw = text.strip()
    if raw.upper() == TIMESPAN_MAX_TEXT:
        return TIMESPAN_MAX
    match = _ISO.match(raw.upper())
    if match and raw.upper() not in ("P", "PT") and not raw.upper().endswith("T"):
        parts = {k: v for k, v in match.groupdict().items() if v is not None}
        seconds = float(parts.get("seconds", "0").replace(",", "."))
        value = _bounded(
            name,
            text,
            lambda: timedelta(
                weeks=int(parts.get("weeks", 0)),
                days=int(parts.get("days", 0)),
                hours=int(parts.get("hours", 0)),
                minutes=int(parts.get("minutes", 0)),
                seconds=seconds,
            ),
        )
        return -value if parts.get("sign") else value
    match = _TIMESPAN.match(raw)
    if match:
        parts = {k: v for k, v in match.groupdict().items() if v is not None}
        return _bounded(
            name,
            text,
            lambda: timedelta(
                days=int(parts.get("days", 0)),
                hours=int(parts["hours"]),
                minutes=int(parts["minutes"]),
                seconds=float(parts["seconds"]),
            ),
        )
    raise InvalidArgumentError(
        f"{name}: {text!r} is not a valid duration; use ISO-8601 such as 'PT10M', 'PT20S', "
        f"'P7D' or 'P1DT2H30M' (days, hours, minutes, seconds; no years or months)"
    )


def _bounded(name: str, text: object, make: Callable[[], timedelta]) -> timedelta:
    """``make()``, refused when longer (either way) than TimeSpan.MaxValue."""
    too_long = ArgumentOutOfRangeError(
        f"{name}: {text!r} is out of range; the longest duration is {TIMESPAN_MAX_TEXT} (TimeSpan.MaxValue, "
        "which Service Bus reads as 'never')"
    )
    try:
        value = make()
    except (OverflowError, ValueError):
        raise too_long from None
    if abs(value) > TIMESPAN_MAX:
        raise too_long
    return value


def format_duration(value: timedelta) -> str:
    """Format as ISO-8601 the way Service Bus does: ``PT10M``, ``P7D``, ``PT0.5S``."""
    if value == TIMESPAN_MAX:
        return TIMESPAN_MAX_TEXT
    if value < timedelta(0):
        return "-" + format_duration(-value)
    total_us = value.days * 86_400_000_000 + value.seconds * 1_000_000 + value.microseconds
    days, rest = divmod(total_us, 86_400_000_000)
    hours, rest = divmod(rest, 3_600_000_000)
    minutes, rest = divmod(rest, 60_000_000)
    seconds, micros = divmod(rest, 1_000_000)
    out = "P"
    if days:
        out += f"{days}D"
    time_part = ""
    if hours:
        time_part += f"{hours}H"
    if minutes:
        time_part += f"{minutes}M"
    if seconds or micros:
        time_part += f"{seconds}.{micros:06d}".rstrip("0").rstrip(".") + "S"
    if time_part:
        out += "T" + time_part
    if out == "P":
        out = "PT0S"
    return out


def format_timespan(value: timedelta) -> str:
    """Format as .NET TimeSpan text (``7.00:00:00``, ``00:00:20``), as in Azure's messages."""
    total = int(value.total_seconds())
    days, rest = divmod(total, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, seconds = divmod(rest, 60)
    head = f"{days}." if days else ""
    frac = f".{value.microseconds:06d}0" if value.microseconds else ""
    return f"{head}{hours:02d}:{minutes:02d}:{seconds:02d}{frac}"


def to_micros(value: timedelta) -> int:
    return value.days * 86_400_000_000 + value.seconds * 1_000_000 + value.microseconds
