"""Messages as the broker sees them: what a sender gives, what is stored, what a receiver gets."""

from __future__ import annotations

import dataclasses
import enum
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any, ClassVar, Protocol

from oncebus.core.errors import InvalidArgumentError
from oncebus.core.keys import MessageId, id_type, service_bus_text
from oncebus.core.properties import TEXT_FIELDS, check_application_properties, text_error
from oncebus.core.timeutil import us_to_datetime_or_max


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
    message_id: MessageId | None = None  # str, bytes (AMQP binary), uuid.UUID or int (AMQP ulong)
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
        return _size(self.body, self.application_properties)


def _size(body: bytes, application_properties: dict[str, Any]) -> int:
    props = json.dumps(application_properties, default=str) if application_properties else ""
    return len(body) + len(props.encode())


_ALL_TEXT_FIELDS = ("message_id", *TEXT_FIELDS)  # the session id is one of the text fields


def check_message(message: Message) -> None:
    """Refuse a message whose fields have the wrong type (what a front end may hand over unchecked).

    Ids are checked by ``keys.validate_ids``; this checks the body, the text fields (ids too: Unicode text),
    the application properties (``properties.check_application_properties``: values every door carries), the
    time to live (a positive ``timedelta``) and the scheduled enqueue time (a ``datetime``).
    """
    if not isinstance(message.body, bytes | bytearray | memoryview):
        raise InvalidArgumentError(f"body must be bytes, not {type(message.body).__name__}")
    for name in _ALL_TEXT_FIELDS:
        value = getattr(message, name)
        if value is None:
            continue
        if isinstance(value, str):
            if not value.isascii() and (problem := text_error(value)) is not None:
                raise InvalidArgumentError(f"{name} {problem}; it must be Unicode text")
        elif name != "message_id":  # an id may be binary, a uuid or a ulong (keys.validate_ids checks it)
            raise InvalidArgumentError(f"{name} must be text (a string), not {type(value).__name__}")
    properties = message.application_properties
    if properties:
        check_application_properties(properties)
    elif not isinstance(properties, dict):
        raise InvalidArgumentError(f"application_properties must be a map, not {type(properties).__name__}")
    ttl = message.time_to_live
    if ttl is not None:
        if not isinstance(ttl, timedelta):
            raise InvalidArgumentError(
                f"time_to_live must be a duration (timedelta; on AMQP the header's ttl, a uint of milliseconds), "
                f"not {type(ttl).__name__}"
            )
        if ttl <= timedelta(0):
            raise InvalidArgumentError("time_to_live must be positive")
    when = message.scheduled_enqueue_time_utc
    if when is not None and not isinstance(when, datetime):
        raise InvalidArgumentError(
            f"scheduled_enqueue_time_utc must be a UTC time (datetime) before year 10000, not {type(when).__name__}"
        )


# what a store keeps in a message's metadata: the sender's properties but the id and the session id (columns)
_STORED_META = (
    *(name for name in TEXT_FIELDS if name != "session_id"),
    "application_properties",
    "time_to_live_us",
    "scheduled_enqueue_time_us",
)
_dumps = json.JSONEncoder(separators=(",", ":"), default=str).encode
_quote = json.encoder.encode_basestring_ascii


@dataclass
class StoredMessage:
    """A message as held by one queue or subscription (topic messages are copied per subscription)."""

    path: str  # receivable path, lower case: "orders" or "events/subscriptions/audit"
    sequence_number: int
    message_id: MessageId
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
    # the fields a rule action changed since ``wire`` was encoded (the application properties are then
    # taken from this record too): the door that delivers it encodes them again, the broker never does
    rewritten: frozenset[str] = frozenset()
    hops: int = 0  # how many times auto-forwarding transferred it (Service Bus allows 4)

    @property
    def size(self) -> int:
        """Bytes this message counts against its entity's size: once, as on the wire (as ``Message.size``)."""
        if self.wire is not None:
            return len(self.wire)
        return _size(self.body, self.application_properties)

    def meta_json(self) -> str:
        """The fields a store keeps as one JSON text (not those it keeps in columns: the times, state,
        delivery count, session id and dead-letter fields)."""
        message_id = self.message_id
        if (
            type(message_id) is str
            and not self.application_properties
            and self.time_to_live_us is None
            and self.scheduled_enqueue_time_us is None
            and self.partition_key is None
            and self.correlation_id is None
            and self.subject is None
            and self.content_type is None
            and self.reply_to is None
            and self.reply_to_session_id is None
            and self.to is None
            and not self.rewritten
            and not self.hops
        ):  # the usual message: its id alone, without a JSON encoder
            return '{"message_id":' + _quote(message_id) + "}"
        meta = {name: value for name in _STORED_META if (value := getattr(self, name)) is not None}
        if not self.application_properties:
            meta.pop("application_properties", None)
        if self.rewritten:
            meta["rewritten"] = sorted(self.rewritten)
        if self.hops:
            meta["hops"] = self.hops
        message_id = self.message_id
        if isinstance(message_id, str):
            meta["message_id"] = message_id
        else:  # typed: kept with its type, returned with it
            meta["message_id"] = message_id.hex() if isinstance(message_id, bytes) else str(message_id)
            meta["message_id_type"] = id_type(message_id)
        # default=str: a value JSON cannot hold is kept as text rather than failing the store's write
        return _dumps(meta)

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
        session_id: str | None = None,
        dead_letter_reason: str | None = None,
        dead_letter_error_description: str | None = None,
        dead_letter_source: str | None = None,
    ) -> StoredMessage:
        values = json.loads(meta)
        if "rewritten" in values:
            values["rewritten"] = frozenset(values["rewritten"])
        kind = values.pop("message_id_type", None)
        if kind is not None:
            values["message_id"] = _typed_id(kind, values["message_id"])
        for name, value in (
            ("session_id", session_id),
            ("dead_letter_reason", dead_letter_reason),
            ("dead_letter_error_description", dead_letter_error_description),
            ("dead_letter_source", dead_letter_source),
        ):
            if value is not None:
                values[name] = value
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


def _typed_id(kind: str, text: str) -> MessageId:
    if kind == "binary":
        return bytes.fromhex(text)
    if kind == "uuid":
        return uuid.UUID(text)
    if kind == "ulong":
        return int(text)
    raise ValueError(f"unknown message id type {kind!r}")


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

    # the broker's state, as delivered
    @property
    def delivery_count(self) -> int:
        """Deliveries so far, this one included (1 on the first receive)."""
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
