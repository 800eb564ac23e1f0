"""What a receiver gets: a view of a stored message with the broker's envelope of one delivery.

Its own module, compiled with mypyc (``oncebus._compiled``): the AMQP encoder reads a dozen of its properties for
every message delivered, and a compiled class answers them without a Python call each. ``core.messages`` holds the
records it views (``StoredMessage``) and stays Python (a native dataclass would check its fields' types when built,
before ``check_message`` can refuse a bad value with a clear error).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any, ClassVar, Protocol

from oncebus.core.keys import MessageId, id_type, service_bus_text
from oncebus.core.messages import MessageState, StoredMessage
from oncebus.core.timeutil import us_to_datetime_or_max


class Envelope(Protocol):
    """The broker's state of one held message (the broker's ``Entry`` is one)."""

    state: MessageState
    delivery_count: int
    enqueued_time_us: int
    expires_at_us: int | None
    lock_token: uuid.UUID | None
    locked_until_us: int | None


def _dt(us: int | None) -> datetime | None:
    return None if us is None else us_to_datetime_or_max(us)


class ReceivedMessage:
    """What a receiver gets. Field names follow azure.servicebus.ServiceBusReceivedMessage.

    A view, not a copy: the sender's properties, body and encoding are read from the stored message
    (shared with the broker's content cache, never changed through the view), and the broker's state
    (state, delivery count, times, lock) is the envelope as it was when this delivery was made.
    """

    __slots__ = (
        "_delivery_count",
        "_enqueued_time_us",
        "_expires_at_us",
        "_lock_token",
        "_locked_until_us",
        "_state",
        "_stored",
    )

    FIELDS: ClassVar[tuple[str, ...]] = (
        "body",
        "message_id",
        "sequence_number",
        "enqueued_time_utc",
        "delivery_count",
        "state",
        "lock_token",
        "locked_until_utc",
        "expires_at_utc",
        "session_id",
        "partition_key",
        "correlation_id",
        "subject",
        "content_type",
        "reply_to",
        "reply_to_session_id",
        "to",
        "application_properties",
        "time_to_live",
        "scheduled_enqueue_time_utc",
        "dead_letter_reason",
        "dead_letter_error_description",
        "dead_letter_source",
        "wire",
    )
    """Every field a receiver reads, in the SDK's order."""

    def __init__(self, stored: StoredMessage, envelope: Envelope | None = None) -> None:
        """The delivery of ``stored`` with the broker's ``envelope`` (default: as stored, without a lock)."""
        self._stored = stored
        if envelope is None:  # as stored, not locked
            self._state = stored.state
            self._delivery_count = stored.delivery_count
            self._enqueued_time_us = stored.enqueued_time_us
            self._expires_at_us = stored.expires_at_us
            self._lock_token = None
            self._locked_until_us = None
        else:
            self._state = envelope.state
            self._delivery_count = envelope.delivery_count
            self._enqueued_time_us = envelope.enqueued_time_us
            self._expires_at_us = envelope.expires_at_us
            self._lock_token = envelope.lock_token
            self._locked_until_us = envelope.locked_until_us

    @classmethod
    def of(cls, stored: StoredMessage, envelope: Envelope | None = None) -> ReceivedMessage:
        return cls(stored, envelope)

    @classmethod
    def peeked(cls, stored: StoredMessage, envelope: Envelope) -> ReceivedMessage:
        """A peek of ``stored`` in the broker's ``envelope``: as Service Bus shows it, with the delivery count
        the next receive shows (the envelope counts a delivery when it is locked, so one more unless it is
        locked now: then the count its delivery showed). An abandon or an expired lock has counted an attempt."""
        message = cls(stored, envelope)
        if envelope.lock_token is None:
            message._delivery_count += 1
        return message

    # the broker's state, as delivered
    @property
    def delivery_count(self) -> int:
        """Deliveries so far, this one included (1 on the first receive; a peek: what the next receive shows).
        The AMQP header carries one less (0 on the first receive, as Service Bus sends it)."""
        return self._delivery_count

    @property
    def state(self) -> MessageState:
        return self._state

    @property
    def lock_token(self) -> uuid.UUID | None:
        return self._lock_token

    @property
    def sequence_number(self) -> int:
        return self._stored.sequence_number

    @property
    def enqueued_time_us(self) -> int:
        return self._enqueued_time_us

    @property
    def enqueued_time_utc(self) -> datetime:
        return us_to_datetime_or_max(self._enqueued_time_us)

    @property
    def locked_until_us(self) -> int | None:
        return self._locked_until_us

    @property
    def locked_until_utc(self) -> datetime | None:
        return _dt(self._locked_until_us)

    @property
    def expires_at_utc(self) -> datetime | None:
        return _dt(self._expires_at_us)

    @property
    def dead_letter_reason(self) -> str | None:
        return self._stored.dead_letter_reason

    @property
    def dead_letter_error_description(self) -> str | None:
        return self._stored.dead_letter_error_description

    @property
    def dead_letter_source(self) -> str | None:
        return self._stored.dead_letter_source

    # the sender's
    @property
    def body(self) -> bytes:
        return self._stored.body

    @property
    def message_id(self) -> MessageId:
        """With the type it was sent with."""
        return self._stored.message_id

    @property
    def session_id(self) -> str | None:
        return self._stored.session_id

    @property
    def partition_key(self) -> str | None:
        return self._stored.partition_key

    @property
    def correlation_id(self) -> str | None:
        return self._stored.correlation_id

    @property
    def subject(self) -> str | None:
        return self._stored.subject

    @property
    def content_type(self) -> str | None:
        return self._stored.content_type

    @property
    def reply_to(self) -> str | None:
        return self._stored.reply_to

    @property
    def reply_to_session_id(self) -> str | None:
        return self._stored.reply_to_session_id

    @property
    def to(self) -> str | None:
        return self._stored.to

    @property
    def application_properties(self) -> Mapping[str, Any]:
        """Read-only: the stored message's own map."""
        return MappingProxyType(self._stored.application_properties)

    @property
    def time_to_live(self) -> timedelta | None:
        ttl_us = self._stored.time_to_live_us
        return None if ttl_us is None else timedelta(microseconds=ttl_us)

    @property
    def time_to_live_us(self) -> int | None:
        return self._stored.time_to_live_us

    @property
    def rewritten(self) -> frozenset[str]:
        """The fields a rule action changed since ``wire`` was encoded (a door encodes them again)."""
        return self._stored.rewritten

    @property
    def scheduled_enqueue_time_us(self) -> int | None:
        return self._stored.scheduled_enqueue_time_us

    @property
    def scheduled_enqueue_time_utc(self) -> datetime | None:
        return _dt(self._stored.scheduled_enqueue_time_us)

    @property
    def wire(self) -> bytes | None:
        """The sender's AMQP encoding, as it came (None: sent through another door)."""
        return self._stored.wire

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ReceivedMessage):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in self.FIELDS)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ReceivedMessage({self.message_id!r}, sequence_number={self.sequence_number}, state={self.state.name})"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.FIELDS:
            if name == "wire":
                continue
            value = getattr(self, name)
            if name == "application_properties":
                value = dict(value)
            elif name == "message_id" and not isinstance(value, str):
                out["message_id_type"] = id_type(value)  # binary as upper-case hex, as Service Bus shows it
                value = value if isinstance(value, int) else service_bus_text(value)
            elif isinstance(value, datetime):
                value = value.isoformat()
            elif isinstance(value, timedelta):
                value = value.total_seconds()
            elif isinstance(value, uuid.UUID):
                value = str(value)
            elif isinstance(value, MessageState):
                value = value.name.lower()
            elif isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
            out[name] = value
        return out
