"""Conversions between integer microseconds since the epoch (UTC) and datetimes. No clock here."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def us_to_datetime(us: int) -> datetime:
    return EPOCH + timedelta(microseconds=us)


def datetime_to_us(value: datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    delta = value - EPOCH
    return delta.days * 86_400_000_000 + delta.seconds * 1_000_000 + delta.microseconds
