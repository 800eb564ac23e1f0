"""Messages as the broker sees them: what a sender gives, what is stored, what a receiver gets."""

from __future__ import annotations

import dataclasses
import enum
import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from oncebus.core.timeutil import us_to_datetime


class ServiceBusReceiveMode(enum.Enum):
    PEEK_LOCK = "peeklock"
    RECEIVE_AND_DELETE = "receiveanddelete"


class MessageState(enum.IntEnum):
    ACTIVE = 0
    DEFERRED = 1
    SCHEDULED = 2
    DEAD_LETTERED = 3  # in the entity's $DeadLetterQueue


@dataclass
class Message:
    """What a sender sends. Field names follow azure.servicebus.ServiceBusMessage."""

    body: bytes = b""
    message_id: str | None = None
    session_id: str | None = None
    partition_key: str | None = None
    correlation_id: str | None = None
    subject: str | None = None
    content_type: str | None = None
    reply_to: str | None = None
    reply_to_session_id: str | None = None
    to: str | None = None
    application_properties: dict[str, Any] = field(default_factory=dict)
    time_to_live: timedelta | None = None
    scheduled_enqueue_time_utc: datetime | None = None
    # the front end's own encoding of the whole message (AMQP bare message), kept verbatim
    wire: bytes | None = None

    @property
    def size(self) -> int:
        """Bytes counted against the entity's max_message_size_in_kilobytes."""
        if self.wire is not None:
            return len(self.wire)
        props = json.dumps(self.application_properties, default=str) if self.application_properties else ""
        return len(self.body) + len(props.encode())


_META_FIELDS = (
    "message_id",
    "session_id",
    "partition_key",
    "correlation_id",
    "subject",
    "content_type",
    "reply_to",
    "reply_to_session_id",
    "to",
)


@dataclass
class StoredMessage:
    """A message as held by one queue or subscription (topic messages are copied per subscription)."""

    path: str  # receivable path, lower case: "orders" or "events/subscriptions/audit"
    sequence_number: int
    message_id: str
    body: bytes
    enqueued_time_us: int
    expires_at_us: int | None
    state: MessageState = MessageState.ACTIVE
    delivery_count: int = 0
    session_id: str | None = None
    partition_key: str | None = None
    correlation_id: str | None = None
    subject: str | None = None
    content_type: str | None = None
    reply_to: str | None = None
    reply_to_session_id: str | None = None
    to: str | None = None
    application_properties: dict[str, Any] = field(default_factory=dict)
    time_to_live_us: int | None = None
    scheduled_enqueue_time_us: int | None = None
    dead_letter_reason: str | None = None
    dead_letter_error_description: str | None = None
    dead_letter_source: str | None = None
    wire: bytes | None = None
    # runtime only (not stored): the current peek-lock
    lock_token: uuid.UUID | None = None
    locked_until_us: int | None = None

    def meta_json(self) -> str:
        meta = {
            name: getattr(self, name)
            for name in (
                *_META_FIELDS,
                "application_properties",
                "time_to_live_us",
                "scheduled_enqueue_time_us",
                "dead_letter_reason",
                "dead_letter_error_description",
                "dead_letter_source",
            )
            if getattr(self, name) not in (None, {})
        }
        return json.dumps(meta, separators=(",", ":"))

    @classmethod
    def from_row(
        cls,
        *,
        path: str,
        sequence_number: int,
        state: int,
        delivery_count: int,
        enqueued_time_us: int,
        expires_at_us: int | None,
        body: bytes,
        wire: bytes | None,
        meta: str,
    ) -> StoredMessage:
        values = json.loads(meta)
        return cls(
            path=path,
            sequence_number=sequence_number,
            state=MessageState(state),
            delivery_count=delivery_count,
            enqueued_time_us=enqueued_time_us,
            expires_at_us=expires_at_us,
            body=bytes(body),
            wire=bytes(wire) if wire is not None else None,
            **values,
        )

    def copy_for(self, path: str) -> StoredMessage:
        return dataclasses.replace(self, path=path, application_properties=dict(self.application_properties))


@dataclass(frozen=True)
class ReceivedMessage:
    """What a receiver gets. Field names follow azure.servicebus.ServiceBusReceivedMessage."""

    body: bytes
    message_id: str
    sequence_number: int
    enqueued_time_utc: datetime
    delivery_count: int  # deliveries so far, this one included (1 on the first receive)
    state: MessageState
    lock_token: uuid.UUID | None
    locked_until_utc: datetime | None
    expires_at_utc: datetime | None
    session_id: str | None
    partition_key: str | None
    correlation_id: str | None
    subject: str | None
    content_type: str | None
    reply_to: str | None
    reply_to_session_id: str | None
    to: str | None
    application_properties: dict[str, Any]
    time_to_live: timedelta | None
    scheduled_enqueue_time_utc: datetime | None
    dead_letter_reason: str | None
    dead_letter_error_description: str | None
    dead_letter_source: str | None
    wire: bytes | None

    @classmethod
    def of(cls, stored: StoredMessage) -> ReceivedMessage:
        def dt(us: int | None) -> datetime | None:
            return None if us is None else us_to_datetime(us)

        return cls(
            body=stored.body,
            message_id=stored.message_id,
            sequence_number=stored.sequence_number,
            enqueued_time_utc=us_to_datetime(stored.enqueued_time_us),
            delivery_count=stored.delivery_count,
            state=stored.state,
            lock_token=stored.lock_token,
            locked_until_utc=dt(stored.locked_until_us),
            expires_at_utc=dt(stored.expires_at_us),
            session_id=stored.session_id,
            partition_key=stored.partition_key,
            correlation_id=stored.correlation_id,
            subject=stored.subject,
            content_type=stored.content_type,
            reply_to=stored.reply_to,
            reply_to_session_id=stored.reply_to_session_id,
            to=stored.to,
            application_properties=dict(stored.application_properties),
            time_to_live=None if stored.time_to_live_us is None else timedelta(microseconds=stored.time_to_live_us),
            scheduled_enqueue_time_utc=dt(stored.scheduled_enqueue_time_us),
            dead_letter_reason=stored.dead_letter_reason,
            dead_letter_error_description=stored.dead_letter_error_description,
            dead_letter_source=stored.dead_letter_source,
            wire=stored.wire,
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "wire":
                continue
            if isinstance(value, datetime):
                value = value.isoformat()
            elif isinstance(value, timedelta):
                value = value.total_seconds()
            elif isinstance(value, uuid.UUID):
                value = str(value)
            elif isinstance(value, MessageState):
                value = value.name.lower()
            elif isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
            out[f.name] = value
        return out
