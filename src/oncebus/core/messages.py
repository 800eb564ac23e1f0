"""Messages as the broker sees them: what a sender gives, what is stored, what a receiver gets."""

from __future__ import annotations

import dataclasses
import enum
import json
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, overload

from oncebus.core.errors import InvalidArgumentError
from oncebus.core.keys import MessageId, id_type
from oncebus.core.properties import TEXT_FIELDS, check_application_properties, text_error


class ServiceBusReceiveMode(enum.Enum):
    PEEK_LOCK = "peeklock"
    RECEIVE_AND_DELETE = "receiveanddelete"


class MessageState(enum.IntEnum):
    ACTIVE = 0
    DEFERRED = 1
    SCHEDULED = 2
    DEAD_LETTERED = 3  # in the entity's $DeadLetterQueue


@dataclass(frozen=True, slots=True)
class WireSections:
    """Where the door that decoded a message found its sections in its ``wire`` bytes (offsets into them).

    Set by the door's reader (the AMQP codec) as it reads the message once at arrival, checking each value as it
    reads it (text fields and property values are what ``check_message`` accepts: ``check_message`` does not walk
    them again); with it the store addresses the body inside the wire without searching for it, and keeps the
    application properties where the wire holds them instead of writing them again (read back from the wire when
    asked, see :class:`WireProperties`). Only a door's reader sets it."""

    body_offset: int  # the body is wire[body_offset : body_offset + len(body)]
    # the application properties' encoded value (after the section's descriptor): wire[start:end]; None: none sent
    application_properties: tuple[int, int] | None = None
    # the properties section's encoded list (after its descriptor): wire[start:end], where the text fields (subject,
    # content type, correlation id, to, reply to...) are read back from; None: none sent
    properties: tuple[int, int] | None = None


# The door that owns the wire encoding reads a message's application properties and text fields from it
# (RabbitMQ's ``mc`` calls its protocol module the same way): ``reader(wire, start, end)`` -> the map, or the text
# fields by the model's names, as the door decoded them at arrival. core and the stores never read AMQP
# themselves; ``oncebus.amqp.codec`` registers its readers.
WireReader = Callable[[bytes, int, int], dict[str, Any]]
_wire_reader: list[WireReader] = []
_NO_READER = (
    "a stored message keeps its properties in its AMQP encoding, and no reader of it is registered: import "
    "oncebus.amqp (oncebus serve always does)"
)


def set_wire_reader(reader: WireReader, texts: WireReader) -> None:
    """Register the readers of application properties and of the text fields held in ``wire`` bytes (the AMQP
    codec does, on import)."""
    _wire_reader[:] = [reader, texts]


def read_wire_properties(wire: bytes, start: int, end: int) -> dict[str, Any]:
    """The application properties encoded at ``wire[start:end]`` (read by the registered door's reader)."""
    if not _wire_reader:
        raise RuntimeError(_NO_READER)
    return _wire_reader[0](wire, start, end)


def read_wire_texts(wire: bytes, start: int, end: int) -> dict[str, Any]:
    """The text fields (subject, content type, correlation id...: those set, by the model's names) of the
    properties encoded at ``wire[start:end]`` (read by the registered door's reader)."""
    if not _wire_reader:
        raise RuntimeError(_NO_READER)
    return _wire_reader[1](wire, start, end)


_UNREAD: Any = object()


class WireProperties(dict[str, Any]):
    """A stored message's application properties, read from its wire encoding the first time they are asked for
    (a delivery over AMQP sends the wire as it is and never asks). Behaves as the ``dict`` it becomes."""

    __slots__ = ("_span", "_wire")

    def __init__(self, wire: bytes, span: tuple[int, int]) -> None:
        # unread, it holds a placeholder: C code that looks at a dict's size before calling its methods (the json
        # encoder writes "{}" for an empty one) must not take it for empty
        super().__init__({_UNREAD: None})
        self._wire: bytes | None = wire
        self._span = span

    @property
    def read(self) -> bool:
        """Whether the properties have been read from the wire yet."""
        return self._wire is None

    def _read(self) -> None:
        wire = self._wire
        if wire is not None:
            read = read_wire_properties(wire, *self._span)
            self._wire = None
            dict.clear(self)
            dict.update(self, read)

    def __getitem__(self, key: str) -> Any:
        self._read()
        return dict.__getitem__(self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        self._read()
        dict.__setitem__(self, key, value)

    def __delitem__(self, key: str) -> None:
        self._read()
        dict.__delitem__(self, key)

    def __contains__(self, key: object) -> bool:
        self._read()
        return dict.__contains__(self, key)

    def __iter__(self) -> Iterator[str]:
        self._read()
        return dict.__iter__(self)

    def __reversed__(self) -> Iterator[str]:
        self._read()
        return dict.__reversed__(self)

    def __len__(self) -> int:
        self._read()
        return dict.__len__(self)

    def __eq__(self, other: object) -> bool:
        self._read()
        if isinstance(other, WireProperties):
            other._read()
        return dict.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = None

    def __repr__(self) -> str:
        self._read()
        return dict.__repr__(self)

    def __or__(self, other: Any) -> dict[str, Any]:  # type: ignore[override]
        self._read()
        return dict(dict.items(self)) | other  # type: ignore[no-any-return]

    def __ior__(self, other: Any) -> WireProperties:  # type: ignore[override]
        self._read()
        dict.update(self, other)
        return self

    def __reduce__(self) -> tuple[Any, ...]:  # copied or pickled as the plain dict it is
        self._read()
        return (dict, (dict(dict.items(self)),))

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return self.__reduce__()

    def copy(self) -> dict[str, Any]:
        self._read()
        return dict(dict.items(self))

    def keys(self) -> Any:
        self._read()
        return dict.keys(self)

    def values(self) -> Any:
        self._read()
        return dict.values(self)

    def items(self) -> Any:
        self._read()
        return dict.items(self)

    @overload
    def get(self, key: str, default: None = None, /) -> Any: ...
    @overload
    def get(self, key: str, default: Any, /) -> Any: ...
    def get(self, key: str, default: Any = None, /) -> Any:
        self._read()
        return dict.get(self, key, default)

    def pop(self, key: str, *default: Any) -> Any:
        self._read()
        return dict.pop(self, key, *default)

    def popitem(self) -> tuple[str, Any]:
        self._read()
        return dict.popitem(self)

    def setdefault(self, key: str, default: Any = None, /) -> Any:
        self._read()
        return dict.setdefault(self, key, default)

    def update(self, *args: Any, **kwargs: Any) -> None:
        self._read()
        dict.update(self, *args, **kwargs)

    def clear(self) -> None:
        self._wire = None
        dict.clear(self)


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
    # where the door found the body and properties in ``wire`` (an address, not content: not compared or shown)
    sections: WireSections | None = field(default=None, compare=False, repr=False)

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
    if message.sections is not None and message.wire is not None:
        return  # a door's reader made it from its wire, checking each value as it read it (``WireSections``)
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
_META_TEXTS = tuple(name for name in TEXT_FIELDS if name != "session_id")
_META_TIMES = ("time_to_live_us", "scheduled_enqueue_time_us")
# the text fields the properties section holds (the partition key is a message annotation, the session id a column)
_WIRE_TEXTS = frozenset(name for name in _META_TEXTS if name != "partition_key")
_META_NOT_IN_WIRE = tuple(name for name in _META_TEXTS if name not in _WIRE_TEXTS)
_dumps = json.JSONEncoder(separators=(",", ":"), default=str).encode
_quote = json.encoder.encode_basestring_ascii
# the meta ``meta_json`` writes for most messages: a text id (ASCII, nothing escaped), the wire's application
# properties and properties section; ``from_row`` reads it without the JSON decoder (anything else: with it)
_USUAL_META = re.compile(
    r'\{"message_id":"([^"\\]*)"(?:,"ap":\[(\d+),(\d+)\])?(?:,"pr":\[(\d+),(\d+)\])?\}\Z', re.ASCII
)
_STATES = tuple(MessageState)  # by value: 0, 1, 2, 3


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
    # where the body and the application properties are in ``wire`` (an address, not content: not compared or shown)
    sections: WireSections | None = field(default=None, compare=False, repr=False)

    @property
    def size(self) -> int:
        """Bytes this message counts against its entity's size: once, as on the wire (as ``Message.size``)."""
        if self.wire is not None:
            return len(self.wire)
        return _size(self.body, self.application_properties)

    def meta_json(self) -> str:
        """The fields a store keeps as one JSON text (not those it keeps in columns: the times, state,
        delivery count, session id and dead-letter fields). What the wire holds (``sections``, not rewritten since)
        is not written again: the application properties' place in the wire is (``"ap": [start, end]``), and the
        properties section's (``"pr": [start, end]``) instead of its text fields (subject, content type,
        correlation id, to, reply to, reply-to session id); ``from_row`` reads them back from there
        (:class:`WireProperties`, :func:`read_wire_texts`)."""
        sections = self.sections
        span = None
        texts_span = None
        in_wire = sections is not None and self.wire is not None and "application_properties" not in self.rewritten
        if in_wire and sections is not None:
            span = sections.application_properties
            # properties given beside a wire that holds none (changed in place, not marked rewritten): kept as JSON
            in_wire = span is not None or not self.application_properties
        if sections is not None and self.wire is not None and not self.rewritten.intersection(_WIRE_TEXTS):
            texts_span = sections.properties
        message_id = self.message_id
        if (
            type(message_id) is str
            and not self.rewritten
            and not self.hops
            and (in_wire or not self.application_properties)
        ):
            # the usual message: text fields and times, its properties in the wire: without a JSON encoder
            parts = ['{"message_id":', _quote(message_id)]
            for name in _META_TEXTS if texts_span is None else _META_NOT_IN_WIRE:
                value = getattr(self, name)
                if value is None:
                    continue
                if type(value) is not str:
                    break
                parts += (',"', name, '":', _quote(value))
            else:
                for name in _META_TIMES:
                    value = getattr(self, name)
                    if value is not None:
                        parts += (',"', name, '":', str(int(value)))
                if span is not None:
                    parts.append(f',"ap":[{span[0]},{span[1]}]')
                if texts_span is not None:
                    parts.append(f',"pr":[{texts_span[0]},{texts_span[1]}]')
                parts.append("}")
                return "".join(parts)
        meta = {name: value for name in _STORED_META if (value := getattr(self, name)) is not None}
        if not self.application_properties or in_wire:
            meta.pop("application_properties", None)
        if span is not None:
            meta["ap"] = list(span)
        if texts_span is not None:
            for name in _WIRE_TEXTS:
                meta.pop(name, None)
            meta["pr"] = list(texts_span)
        if self.rewritten:
            meta["rewritten"] = sorted(self.rewritten)
        if self.hops:
            meta["hops"] = self.hops
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
        body_offset: int | None = None,
    ) -> StoredMessage:
        """A stored message from a store's row (``meta``: what ``meta_json`` wrote; ``body_offset``: where the body
        is in ``wire``, None if it is not a slice of it)."""
        usual = _USUAL_META.match(meta)  # (most rows: a backlog's delivery read from the store)
        if usual is not None:
            message_id, ap_start, ap_end, pr_start, pr_end = usual.groups()
            values: dict[str, Any] = {"message_id": message_id}
            span: Any = None if ap_start is None else (int(ap_start), int(ap_end))
            texts_at: Any = None if pr_start is None else (int(pr_start), int(pr_end))
        else:
            values = json.loads(meta)
            span = values.pop("ap", None)
            texts_at = values.pop("pr", None)
        texts: tuple[int, int] | None = None
        if wire is not None:
            wire = bytes(wire)
            if span is not None:
                values["application_properties"] = WireProperties(wire, (span[0], span[1]))
            if texts_at is not None:
                texts = (texts_at[0], texts_at[1])
                for name, value in read_wire_texts(wire, *texts).items():
                    values.setdefault(name, value)
            if body_offset is not None:
                values["sections"] = WireSections(body_offset, None if span is None else (span[0], span[1]), texts)
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
            state=_STATES[state] if 0 <= state < len(_STATES) else MessageState(state),
            delivery_count=delivery_count,
            enqueued_time_us=enqueued_time_us,
            expires_at_us=expires_at_us,
            body=bytes(body),
            wire=wire,
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
