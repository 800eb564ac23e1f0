"""AMQP messages <-> the broker's messages.

Incoming: a transfer's payload becomes one :class:`Message` (message format 0)
or, for a Service Bus batch (message format ``0x80013700``, read from the
frame, never guessed from the payload), one message per data section, each
section being a whole encoded message. Every message keeps its own encoding
as ``wire`` so a receiver gets back exactly what was sent (property types,
value bodies, several data sections).

Outgoing: the stored encoding with a fresh header (delivery count) and
message annotations (sequence number, enqueued time, lock expiry, ...).
"""

from __future__ import annotations

import datetime
import json
import uuid
from collections.abc import Mapping
from typing import Any

import proton

from oncebus.amqp.frames import BATCH_MESSAGE_FORMAT, PLAIN_MESSAGE_FORMAT, FrameError, _Reader
from oncebus.core.errors import InvalidArgumentError
from oncebus.core.messages import Message, MessageState, ReceivedMessage
from oncebus.core.timeutil import datetime_to_us, us_to_datetime

HEADER = 0x70
DELIVERY_ANNOTATIONS = 0x71
MESSAGE_ANNOTATIONS = 0x72
PROPERTIES = 0x73
APPLICATION_PROPERTIES = 0x74
DATA = 0x75
AMQP_SEQUENCE = 0x76
AMQP_VALUE = 0x77
FOOTER = 0x78

PARTITION_KEY = proton.symbol("x-opt-partition-key")
SCHEDULED_ENQUEUE_TIME = proton.symbol("x-opt-scheduled-enqueue-time")
SEQUENCE_NUMBER = proton.symbol("x-opt-sequence-number")
ENQUEUED_TIME = proton.symbol("x-opt-enqueued-time")
LOCKED_UNTIL = proton.symbol("x-opt-locked-until")
LOCK_TOKEN = proton.symbol("x-opt-lock-token")
MESSAGE_STATE = proton.symbol("x-opt-message-state")
DEAD_LETTER_SOURCE = proton.symbol("x-opt-deadletter-source")
DEAD_LETTER_REASON = "DeadLetterReason"
DEAD_LETTER_ERROR_DESCRIPTION = "DeadLetterErrorDescription"

_SDK_STATES = {MessageState.ACTIVE: 0, MessageState.DEFERRED: 1, MessageState.SCHEDULED: 2}


class Section:
    """One section of an encoded message: its descriptor code and its whole encoding."""

    __slots__ = ("code", "raw")

    def __init__(self, code: int, raw: bytes) -> None:
        self.code = code
        self.raw = raw

    def value(self) -> Any:
        data = proton.Data()
        data.decode(self.raw)
        data.rewind()
        data.next()
        described = data.get_object()
        return copy_value(described.value)

    def binary(self) -> bytes:
        """The payload of a data section."""
        reader = _Reader(memoryview(self.raw))
        reader.descriptor()
        value = reader.value()
        if not isinstance(value, bytes):
            raise InvalidArgumentError("a data section does not hold binary data")
        return value


def copy_value(value: Any) -> Any:
    """proton hands out memoryviews into its own buffer: copy them out."""
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, dict):
        return {copy_value(k): copy_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [copy_value(v) for v in value]
    return value


def split_sections(payload: bytes) -> list[Section]:
    """The sections of an encoded message, in order."""
    view = memoryview(payload)
    sections: list[Section] = []
    position = 0
    try:
        while position < len(view):
            reader = _Reader(view[position:])
            code = reader.descriptor()
            if code is None or not HEADER <= code <= FOOTER:
                raise InvalidArgumentError("the message holds a section that is not an AMQP message section")
            reader.skip()
            sections.append(Section(code, bytes(view[position : position + reader.pos])))
            position += reader.pos
    except FrameError as exc:
        raise InvalidArgumentError(f"the message cannot be decoded: {exc}") from None
    return sections


def _encode_section(code: int, value: Any) -> bytes:
    data = proton.Data()
    data.put_object(proton.Described(proton.ulong(code), value))
    return bytes(data.encode())


# ---------------------------------------------------------------------------------- incoming
def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes | memoryview):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, uuid.UUID):
        return str(value)
    return str(value)


def _json_safe(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        if isinstance(value, int) and not isinstance(value, bool):
            return int(value)
        if isinstance(value, float):
            return float(value)
        if isinstance(value, str):
            return str(value)
        return value
    if isinstance(value, bytes | memoryview):
        return bytes(value).hex()
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return str(value)


def _timestamp_to_datetime(value: Any) -> datetime.datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime.datetime):
        return value
    if isinstance(value, int | float):
        return us_to_datetime(int(value) * 1000)
    raise InvalidArgumentError(f"x-opt-scheduled-enqueue-time must be a timestamp, not {type(value).__name__}")


def decode_message(payload: bytes) -> Message:
    """One encoded AMQP message as the broker's :class:`Message` (``wire`` = the encoding)."""
    sections = split_sections(payload)
    decoded = proton.Message()
    try:
        decoded.decode(payload)
    except proton.MessageException as exc:
        raise InvalidArgumentError(f"the message cannot be decoded: {exc}") from None
    annotations = decoded.annotations or {}
    bodies = [s for s in sections if s.code == DATA]
    if bodies:
        body = b"".join(s.binary() for s in bodies)
    else:
        value = decoded.body
        if value is None:
            body = b""
        elif isinstance(value, bytes | memoryview):
            body = bytes(value)
        elif isinstance(value, str):
            body = value.encode("utf-8")
        else:
            body = json.dumps(_json_safe(value)).encode("utf-8")
    ttl = decoded.ttl
    properties = decoded.properties or {}
    return Message(
        body=body,
        message_id=_text(decoded.id),
        session_id=_text(decoded.group_id),
        partition_key=_text(annotations.get(PARTITION_KEY)),
        correlation_id=_text(decoded.correlation_id),
        subject=_text(decoded.subject),
        content_type=_text(decoded.content_type),
        reply_to=_text(decoded.reply_to),
        reply_to_session_id=_text(decoded.reply_to_group_id),
        to=_text(decoded.address),
        application_properties={str(k): _json_safe(v) for k, v in properties.items()},
        time_to_live=datetime.timedelta(seconds=ttl) if ttl else None,
        scheduled_enqueue_time_utc=_timestamp_to_datetime(annotations.get(SCHEDULED_ENQUEUE_TIME)),
        wire=bytes(payload),
    )


def decode_transfer(payload: bytes, message_format: int) -> list[Message]:
    """The messages one transfer carries, judged by the message format read from the transfer frame."""
    if message_format == PLAIN_MESSAGE_FORMAT:
        return [decode_message(payload)]
    if message_format == BATCH_MESSAGE_FORMAT:
        inner = [s.binary() for s in split_sections(payload) if s.code == DATA]
        if not inner:
            raise InvalidArgumentError("a batch transfer (message format 0x80013700) holds no messages")
        return [decode_message(encoded) for encoded in inner]
    raise InvalidArgumentError(
        f"message format 0x{message_format:08x} is not supported: use 0 (a message) or 0x80013700 (a batch)"
    )


# ---------------------------------------------------------------------------------- outgoing
def _fields_encoding(message: ReceivedMessage) -> bytes:
    """An encoding for a message that arrived without one (from another front end)."""
    out = proton.Message(
        body=message.body,
        id=message.message_id,
        group_id=message.session_id,
        correlation_id=message.correlation_id,
        subject=message.subject,
        content_type=message.content_type,
        reply_to=message.reply_to,
        reply_to_group_id=message.reply_to_session_id,
        address=message.to,
        properties=dict(message.application_properties) or None,
    )
    out.inferred = True
    if message.time_to_live is not None:
        out.ttl = message.time_to_live.total_seconds()
    if message.partition_key is not None:
        out.annotations = {PARTITION_KEY: message.partition_key}
    return bytes(out.encode())


def _ms(moment: datetime.datetime) -> proton.timestamp:
    return proton.timestamp(datetime_to_us(moment) // 1000)


def encode_received(message: ReceivedMessage, *, lock_annotations: bool) -> bytes:
    """The encoding a receiver gets: the stored message, a fresh header and the broker's annotations."""
    sections = split_sections(message.wire if message.wire is not None else _fields_encoding(message))
    header: list[Any] = [None, None, None, None, None]
    annotations: dict[Any, Any] = {}
    properties: dict[Any, Any] | None = None
    rest: list[bytes] = []
    dead_lettered = message.dead_letter_reason is not None or message.dead_letter_error_description is not None
    for section in sections:
        if section.code == HEADER:
            original = list(section.value())
            header[: len(original)] = original[:5]
        elif section.code == MESSAGE_ANNOTATIONS:
            annotations = dict(section.value() or {})
        elif section.code == DELIVERY_ANNOTATIONS:
            continue
        elif section.code == APPLICATION_PROPERTIES and dead_lettered:
            properties = dict(section.value() or {})
        else:
            rest.append(section.raw)
    header[4] = proton.uint(max(message.delivery_count - 1, 0))
    annotations[SEQUENCE_NUMBER] = int(message.sequence_number)
    annotations[ENQUEUED_TIME] = _ms(message.enqueued_time_utc)
    if message.scheduled_enqueue_time_utc is not None:
        annotations[SCHEDULED_ENQUEUE_TIME] = _ms(message.scheduled_enqueue_time_utc)
    if message.partition_key is not None:
        annotations[PARTITION_KEY] = message.partition_key
    if message.dead_letter_source is not None:
        annotations[DEAD_LETTER_SOURCE] = message.dead_letter_source
    annotations[MESSAGE_STATE] = int(_SDK_STATES.get(message.state, 0))
    if lock_annotations and message.locked_until_utc is not None:
        annotations[LOCKED_UNTIL] = _ms(message.locked_until_utc)
    out = bytearray(_encode_section(HEADER, header))
    out += _encode_section(MESSAGE_ANNOTATIONS, proton.AnnotationDict(annotations))
    if dead_lettered:
        properties = properties if properties is not None else {}
        if message.dead_letter_reason is not None:
            properties[DEAD_LETTER_REASON] = message.dead_letter_reason
        if message.dead_letter_error_description is not None:
            properties[DEAD_LETTER_ERROR_DESCRIPTION] = message.dead_letter_error_description
        # the application properties go before the body, right after the properties section
        index = next((i for i, raw in enumerate(rest) if _code(raw) > APPLICATION_PROPERTIES), len(rest))
        rest.insert(index, _encode_section(APPLICATION_PROPERTIES, proton.PropertyDict(properties)))
    for raw in rest:
        out += raw
    return bytes(out)


def _code(raw: bytes) -> int:
    return raw[2] if raw[1] == 0x53 else raw[9]


def state_name(state: MessageState) -> int:
    return _SDK_STATES.get(state, 0)
