"""A received message with chosen fields, for tests of what a receiver gets (the encoder, the fuzz suite).

A ``ReceivedMessage`` is a view of a stored message and its delivery's envelope; this builds both from
the receiver's field names (times as datetimes, the time to live as a timedelta).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from oncebus.core.messages import MessageState, StoredMessage
from oncebus.core.received import ReceivedMessage
from oncebus.core.timeutil import datetime_to_us


def _us(moment: datetime | None) -> int | None:
    return None if moment is None else datetime_to_us(moment)


@dataclass
class DeliveryEnvelope:
    state: MessageState
    delivery_count: int
    enqueued_time_us: int
    expires_at_us: int | None
    lock_token: uuid.UUID | None
    locked_until_us: int | None


def received_of(**fields: Any) -> ReceivedMessage:
    ttl: timedelta | None = fields.pop("time_to_live", None)
    lock: uuid.UUID | None = fields.pop("lock_token", uuid.uuid4())
    until = _us(fields.pop("locked_until_utc", None))
    stored = StoredMessage(
        path=fields.pop("path", "q"),
        sequence_number=fields.pop("sequence_number", 1),
        message_id=fields.pop("message_id", "m"),
        body=fields.pop("body", b""),
        enqueued_time_us=_us(fields.pop("enqueued_time_utc")) or 0,
        expires_at_us=_us(fields.pop("expires_at_utc", None)),
        state=fields.pop("state", MessageState.ACTIVE),
        delivery_count=fields.pop("delivery_count", 1),
        time_to_live_us=None if ttl is None else ttl // timedelta(microseconds=1),
        scheduled_enqueue_time_us=_us(fields.pop("scheduled_enqueue_time_utc", None)),
        application_properties=dict(fields.pop("application_properties", None) or {}),
        **fields,
    )
    envelope = DeliveryEnvelope(
        stored.state, stored.delivery_count, stored.enqueued_time_us, stored.expires_at_us, lock, until
    )
    return ReceivedMessage.of(stored, envelope)
