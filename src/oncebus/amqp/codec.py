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
import struct
import uuid
from collections.abc import Mapping
from typing import Any

import proton

from oncebus.amqp.encoding import DEFAULT_MAX_DEPTH, DecodeError, Reader, decode
from oncebus.amqp.frames import BATCH_MESSAGE_FORMAT, PLAIN_MESSAGE_FORMAT
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
        """The section's value through proton (whose types the outgoing path re-encodes)."""
        data = proton.Data()
        data.decode(self.raw)
        data.rewind()
        data.next()
        described = data.get_object()
        return copy_value(described.value)

    def checked_value(self, what: str) -> Any:
        """:meth:`value` for a section a client sent: anything proton cannot take is refused, naming ``what``."""
        try:
            return self.value()
        except Exception as exc:  # proton's errors for odd-but-well-formed values (e.g. binary map keys)
            raise InvalidArgumentError(f"the message's {what} cannot be decoded: {type(exc).__name__}: {exc}") from None

    def binary(self) -> bytes:
        """The payload of a data section."""
        reader = Reader(memoryview(self.raw))
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


def split_sections(payload: bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> list[Section]:
    """The sections of an encoded message, in order (each checked to be well formed)."""
    view = memoryview(payload)
    sections: list[Section] = []
    position = 0
    try:
        while position < len(view):
            reader = Reader(view[position:], max_depth)
            code = reader.descriptor()
            if code is None or not HEADER <= code <= FOOTER:
                raise InvalidArgumentError("the message holds a section that is not an AMQP message section")
            reader.skip()
            sections.append(Section(code, bytes(view[position : position + reader.pos])))
            position += reader.pos
    except DecodeError as exc:
        raise InvalidArgumentError(f"the message cannot be decoded: {exc}") from None
    return sections


def check_sections(payload: bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> None:
    """Raise :class:`InvalidArgumentError` unless ``payload`` is a well-formed sequence of message sections."""
    split_sections(payload, max_depth)


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


def _amqp_type(value: Any) -> str:
    """The AMQP type name of a decoded value, for error messages."""
    names = {
        proton.symbol: "symbol",
        proton.ulong: "ulong",
        proton.uint: "uint",
        proton.timestamp: "timestamp",
        proton.int32: "int",
        proton.char: "char",
        proton.float32: "float",
        bytes: "binary",
        str: "string",
        bool: "boolean",
        int: "long",
        float: "double",
        uuid.UUID: "uuid",
        list: "list",
        dict: "map",
        type(None): "null",
    }
    return names.get(type(value), type(value).__name__)


def message_id_of(value: Any) -> str | bytes | uuid.UUID | int | None:
    """A message-id as AMQP allows it (3.2.11): string, binary, uuid or ulong, each kept as its own type."""
    if value is None or type(value) is str or isinstance(value, uuid.UUID):
        return value
    if isinstance(value, bytes | memoryview):
        return bytes(value)
    if isinstance(value, proton.ulong):
        return int(value)
    raise InvalidArgumentError(
        f"message-id must be a string, binary, uuid or ulong (AMQP 1.0, 3.2.11), not {_amqp_type(value)} {value!r}"
    )


def _string_field(value: Any, name: str) -> str | None:
    """A field Service Bus takes only as a string: anything else is refused, never stringified."""
    if value is None or type(value) is str:
        return value
    raise InvalidArgumentError(f"{name} must be a string, not {_amqp_type(value)} {value!r}")


def _ttl(value: Any) -> datetime.timedelta | None:
    if value is None:
        return None
    integer = isinstance(value, int) and not isinstance(value, bool | proton.timestamp)
    if not integer or not 0 <= value <= 0xFFFFFFFF:
        raise InvalidArgumentError(
            f"the header's ttl must be a uint (milliseconds, 0 to 4294967295), not {_amqp_type(value)} {value!r}"
        )
    return datetime.timedelta(milliseconds=int(value)) if value else None


_LAST_MS = datetime_to_us(datetime.datetime.max.replace(tzinfo=datetime.UTC)) // 1000
_FIRST_MS = datetime_to_us(datetime.datetime.min.replace(tzinfo=datetime.UTC)) // 1000


def _scheduled_time(value: Any) -> datetime.datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime.datetime):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(
            f"x-opt-scheduled-enqueue-time must be a timestamp, not {_amqp_type(value)} {value!r}"
        )
    if not _FIRST_MS <= value <= _LAST_MS:
        raise InvalidArgumentError(
            f"x-opt-scheduled-enqueue-time {value} ms since 1970 is outside the years 1 to 9999 "
            "that Service Bus accepts"
        )
    return us_to_datetime(int(value) * 1000)


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
        return {str(_json_safe(k)): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return str(value)


class _Unusual(Exception):
    """The fast decoder met something it leaves to the general path (same result, just slower)."""


_UNPACK_U32 = struct.Struct(">I").unpack_from
_UNPACK_U64 = struct.Struct(">Q").unpack_from
_UNPACK_I64 = struct.Struct(">q").unpack_from


def _scalar(data: bytes, pos: int) -> tuple[Any, int]:
    """A null, string, symbol, binary, uuid, uint, ulong or timestamp at ``pos`` (anything else is unusual)."""
    code = data[pos]
    pos += 1
    if code == 0x40:
        return None, pos
    if code == 0xA1:
        end = pos + 1 + data[pos]
        return data[pos + 1 : end].decode("utf-8"), end
    if code == 0xB1:
        end = pos + 4 + _UNPACK_U32(data, pos)[0]
        return data[pos + 4 : end].decode("utf-8"), end
    if code == 0xA0:
        end = pos + 1 + data[pos]
        return data[pos + 1 : end], end
    if code == 0xB0:
        end = pos + 4 + _UNPACK_U32(data, pos)[0]
        return data[pos + 4 : end], end
    if code == 0x98:
        return uuid.UUID(bytes=data[pos : pos + 16]), pos + 16
    if code == 0xA3:
        end = pos + 1 + data[pos]
        return proton.symbol(data[pos + 1 : end].decode("utf-8")), end
    if code == 0xB3:
        end = pos + 4 + _UNPACK_U32(data, pos)[0]
        return proton.symbol(data[pos + 4 : end].decode("utf-8")), end
    if code == 0x83:  # timestamps (creation-time, absolute-expiry-time)
        return _UNPACK_I64(data, pos)[0], pos + 8
    if code == 0x43:
        return proton.uint(0), pos
    if code == 0x52:
        return proton.uint(data[pos]), pos + 1
    if code == 0x70:
        return proton.uint(_UNPACK_U32(data, pos)[0]), pos + 4
    if code == 0x44:
        return proton.ulong(0), pos
    if code == 0x53:
        return proton.ulong(data[pos]), pos + 1
    if code == 0x80:
        return proton.ulong(_UNPACK_U64(data, pos)[0]), pos + 8
    raise _Unusual


def _compound(data: bytes, pos: int, list_codes: tuple[int, int, int]) -> tuple[int, int, int]:
    """(first item position, item count, end) of the list at ``pos``; ``list_codes`` = (list0, list8, list32)."""
    code = data[pos]
    if code == list_codes[0]:
        return pos + 1, 0, pos + 1
    if code == list_codes[1]:
        return pos + 3, data[pos + 2], pos + 2 + data[pos + 1]
    if code == list_codes[2]:
        return pos + 9, _UNPACK_U32(data, pos + 5)[0], pos + 5 + _UNPACK_U32(data, pos + 1)[0]
    raise _Unusual


_LIST_CODES = (0x45, 0xC0, 0xD0)


def _message(
    *,
    body: bytes,
    properties: list[Any],
    header: list[Any] | None,
    annotations: Mapping[Any, Any] | None,
    application: Mapping[Any, Any] | None,
    wire: bytes,
) -> Message:
    """The broker's message from the decoded sections; a field of a type Service Bus refuses refuses the message."""
    properties = list(properties) + [None] * (13 - len(properties))
    message_id, _user, to, subject, reply_to, correlation_id, content_type = properties[:7]
    group_id, reply_to_group_id = properties[10], properties[12]
    annotations = annotations or {}
    ttl = _ttl(header[2] if header and len(header) > 2 else None)
    if application:
        for key in application:
            if not isinstance(key, str):
                raise InvalidArgumentError(f"application property keys must be strings, not {_amqp_type(key)} {key!r}")
    _check_reencodable(header, annotations, application)
    return Message(
        body=body,
        message_id=message_id_of(message_id),  # type: ignore[arg-type]  (core takes str | bytes | UUID | int)
        session_id=_string_field(group_id, "the session id (properties group-id)"),
        partition_key=_string_field(annotations.get(PARTITION_KEY), "the partition key (x-opt-partition-key)"),
        correlation_id=_text(correlation_id),
        subject=_text(subject),
        content_type=_text(content_type),
        reply_to=_text(reply_to),
        reply_to_session_id=_text(reply_to_group_id),
        to=_text(to),
        application_properties={str(k): _json_safe(v) for k, v in (application or {}).items()},
        time_to_live=ttl,
        scheduled_enqueue_time_utc=_scheduled_time(annotations.get(SCHEDULED_ENQUEUE_TIME)),
        wire=wire,
    )


def _check_reencodable(
    header: list[Any] | None, annotations: Mapping[Any, Any], application: Mapping[Any, Any] | None
) -> None:
    """Refuse now what the delivery path could not encode again (it would be undeliverable after the ack).

    Receivers get a fresh header, the broker's message annotations merged into the sender's, and, for a
    dead-lettered message, the application properties with the reason added: all re-encoded by proton.
    """
    for code, what, build in (
        (HEADER, "header", lambda: list(header[:5]) if header else None),
        (
            MESSAGE_ANNOTATIONS,
            "message annotations",
            lambda: proton.AnnotationDict(annotations) if annotations else None,
        ),
        (
            APPLICATION_PROPERTIES,
            "application properties",
            lambda: proton.PropertyDict(application) if application else None,
        ),
    ):
        try:
            value = build()
            if value:
                _encode_section(code, value)
        except Exception as exc:
            raise InvalidArgumentError(
                f"the message's {what} hold a value AMQP does not allow there ({type(exc).__name__}: {exc}); "
                "message annotation keys are symbols or ulongs, application property keys strings, symbols ASCII"
            ) from None


def _decode_fast(payload: bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> Message:
    """:func:`decode_message` for the usual shape; raises :class:`_Unusual` otherwise.

    Reads the properties and the data sections itself (all a Service Bus batch's inner messages
    usually hold); the header, annotations and application properties, rarer and of many types,
    are checked here and decoded by proton (the outgoing path re-encodes them with proton).
    """
    data = payload
    end = len(data)
    pos = 0
    header: list[Any] | None = None
    annotations: dict[Any, Any] | None = None
    props: list[Any] = []
    application: dict[Any, Any] | None = None
    bodies: list[bytes] = []
    try:
        while pos < end:
            if data[pos] != 0x00 or data[pos + 1] != 0x53:
                raise _Unusual
            code = data[pos + 2]
            start = pos
            pos += 3
            if code == DATA:
                value, pos = _scalar(data, pos)
                if not isinstance(value, bytes):
                    raise _Unusual
                bodies.append(value)
            elif code == PROPERTIES:
                item, count, list_end = _compound(data, pos, _LIST_CODES)
                if count > 13:
                    raise _Unusual
                for _ in range(count):
                    value, item = _scalar(data, item)
                    props.append(value)
                if item != list_end:
                    raise _Unusual
                pos = list_end
            elif code in (HEADER, MESSAGE_ANNOTATIONS, APPLICATION_PROPERTIES, DELIVERY_ANNOTATIONS, FOOTER):
                reader = Reader(memoryview(data)[start:], max_depth)
                reader.descriptor()
                reader.skip()
                pos = start + reader.pos
                if code == DELIVERY_ANNOTATIONS or code == FOOTER:
                    continue
                value = Section(code, data[start:pos]).value()
                if code == HEADER:
                    header = value
                elif code == MESSAGE_ANNOTATIONS:
                    annotations = value
                else:
                    application = value
            else:  # an amqp-value or amqp-sequence body, or not a section at all
                raise _Unusual
    except (IndexError, struct.error, UnicodeDecodeError, ValueError, DecodeError, proton.DataException):
        raise _Unusual from None
    except Exception:  # whatever proton made of an odd value: the general path says what it is
        raise _Unusual from None
    if pos != end or not bodies:
        raise _Unusual
    if (header is not None and not isinstance(header, list)) or (
        annotations is not None and not isinstance(annotations, dict)
    ):
        raise _Unusual
    if application is not None and not isinstance(application, dict):
        raise _Unusual
    return _message(
        body=bodies[0] if len(bodies) == 1 else b"".join(bodies),
        properties=props,
        header=header,
        annotations=annotations,
        application=application,
        wire=payload,
    )


def decode_message(payload: bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> Message:
    """One encoded AMQP message as the broker's :class:`Message` (``wire`` = the encoding)."""
    payload = bytes(payload)
    try:
        return _decode_fast(payload, max_depth)
    except _Unusual:
        return decode_message_general(payload, max_depth)


def _section_of(sections: list[Section], code: int, what: str, kind: type) -> Any:
    found = [s for s in sections if s.code == code]
    if not found:
        return None
    if len(found) > 1:
        raise InvalidArgumentError(f"the message holds {len(found)} {what} sections; at most one is allowed")
    value = found[0].checked_value(what)
    if value is not None and not isinstance(value, kind):
        raise InvalidArgumentError(f"the message's {what} section is {_amqp_type(value)}, not a {kind.__name__}")
    return value


def decode_message_general(payload: bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> Message:
    """:func:`decode_message` for every shape, slower: each section checked, the body value decoded here."""
    sections = split_sections(payload, max_depth)
    bodies = [s for s in sections if s.code == DATA]
    values = [s for s in sections if s.code in (AMQP_VALUE, AMQP_SEQUENCE)]
    if bodies and values:
        raise InvalidArgumentError("the message holds both data sections and an amqp-value or amqp-sequence body")
    if bodies:
        body = b"".join(s.binary() for s in bodies)
    elif values:
        decoded = []
        for section in values:
            try:
                value = decode(section.raw, 0, len(section.raw), max_depth)[0].value  # our decoder: any map key
            except DecodeError as exc:
                raise InvalidArgumentError(f"the message body cannot be decoded: {exc}") from None
            decoded.append(value)
        value = decoded[0] if values[0].code == AMQP_VALUE else [v for part in decoded for v in part]
        if isinstance(value, bytes):
            body = value
        elif isinstance(value, str):
            body = value.encode("utf-8")
        elif value is None:
            body = b""
        else:
            body = json.dumps(_json_safe(value)).encode("utf-8")
    else:
        body = b""
    properties = _section_of(sections, PROPERTIES, "properties", list)
    properties = [_property(v) for v in (properties or [])]
    return _message(
        body=body,
        properties=properties,
        header=_section_of(sections, HEADER, "header", list),
        annotations=_section_of(sections, MESSAGE_ANNOTATIONS, "message annotations", dict),
        application=_section_of(sections, APPLICATION_PROPERTIES, "application properties", dict),
        wire=bytes(payload),
    )


def _property(value: Any) -> Any:
    """A field of the properties section as proton decodes it, with the types :func:`_message` checks."""
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, proton.timestamp):
        return int(value)
    return value


def _data_sections(payload: bytes, max_depth: int) -> list[bytes]:
    """The payloads of the data sections of an encoded message (a batch's inner messages)."""
    try:
        found = []
        pos = 0
        end = len(payload)
        while pos < end:
            if payload[pos] == 0x00 and payload[pos + 1] == 0x53 and payload[pos + 2] == DATA:
                value, pos = _scalar(payload, pos + 3)
                if not isinstance(value, bytes):
                    raise _Unusual
                found.append(value)
            else:
                reader = Reader(memoryview(payload)[pos:], max_depth)
                code = reader.descriptor()
                if code is None or not HEADER <= code <= FOOTER:
                    raise _Unusual
                reader.skip()
                pos += reader.pos
        if pos != end:
            raise _Unusual
        return found
    except (_Unusual, IndexError, struct.error, UnicodeDecodeError, DecodeError):
        return [s.binary() for s in split_sections(payload, max_depth) if s.code == DATA]  # reports what is wrong


def decode_transfer(payload: bytes, message_format: int, max_depth: int = DEFAULT_MAX_DEPTH) -> list[Message]:
    """The messages one transfer carries, judged by the message format read from the transfer frame."""
    if message_format == PLAIN_MESSAGE_FORMAT:
        return [decode_message(payload, max_depth)]
    if message_format == BATCH_MESSAGE_FORMAT:
        inner = _data_sections(payload, max_depth)
        if not inner:
            raise InvalidArgumentError("a batch transfer (message format 0x80013700) holds no messages")
        messages = []
        for position, encoded in enumerate(inner):
            try:
                messages.append(decode_message(encoded, max_depth))
            except InvalidArgumentError as exc:
                raise InvalidArgumentError(
                    f"message {position + 1} of the batch: {exc}; nothing of the batch was stored"
                ) from None
        return messages
    raise InvalidArgumentError(
        f"message format 0x{message_format:08x} is not supported: use 0 (a message) or 0x80013700 (a batch)"
    )


# ---------------------------------------------------------------------------------- outgoing
def _fields_encoding(message: ReceivedMessage) -> bytes:
    """An encoding for a message that arrived without one (from another front end)."""
    message_id: Any = message.message_id
    if isinstance(message_id, int):  # a ulong message-id goes back as a ulong, never a long
        message_id = proton.ulong(message_id)
    out = proton.Message(
        body=message.body,
        id=message_id,
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


def _symbol8(name: str) -> bytes:
    raw = name.encode("ascii")
    return bytes((0xA3, len(raw))) + raw


def _long(value: int) -> bytes:
    return b"\x55" + struct.pack(">b", value) if -128 <= value <= 127 else b"\x81" + struct.pack(">q", value)


def _string(value: str) -> bytes:
    raw = value.encode("utf-8")
    return bytes((0xA1, len(raw))) + raw if len(raw) < 256 else b"\xb1" + struct.pack(">I", len(raw)) + raw


def _timestamp(moment: datetime.datetime) -> bytes:
    return b"\x83" + struct.pack(">q", datetime_to_us(moment) // 1000)


def _uint(value: int) -> bytes:
    if value == 0:
        return b"\x43"
    return bytes((0x52, value)) if value < 256 else b"\x70" + struct.pack(">I", value)


def _described_list(code: int, fields: list[bytes]) -> bytes:
    body = b"".join(fields)
    return bytes((0x00, 0x53, code, 0xD0)) + struct.pack(">II", len(body) + 4, len(fields)) + body


def _described_map(code: int, pairs: list[bytes]) -> bytes:
    body = b"".join(pairs)
    return bytes((0x00, 0x53, code, 0xD1)) + struct.pack(">II", len(body) + 4, len(pairs)) + body


_SEQUENCE_NUMBER_KEY = _symbol8(str(SEQUENCE_NUMBER))
_ENQUEUED_TIME_KEY = _symbol8(str(ENQUEUED_TIME))
_SCHEDULED_KEY = _symbol8(str(SCHEDULED_ENQUEUE_TIME))
_PARTITION_KEY_KEY = _symbol8(str(PARTITION_KEY))
_DEAD_LETTER_SOURCE_KEY = _symbol8(str(DEAD_LETTER_SOURCE))
_MESSAGE_STATE_KEY = _symbol8(str(MESSAGE_STATE))
_LOCKED_UNTIL_KEY = _symbol8(str(LOCKED_UNTIL))
_LOCK_TOKEN_KEY = _symbol8(str(LOCK_TOKEN))


def _delivery_annotations(lock_token: uuid.UUID | None) -> bytes:
    """The lock token as Service Bus gives it with a message received by sequence number (SDK 7.14 reads it)."""
    if lock_token is None:
        return b""
    return _described_map(DELIVERY_ANNOTATIONS, [_LOCK_TOKEN_KEY, b"\x98" + lock_token.bytes])


def _encode_received_fast(
    message: ReceivedMessage, wire: bytes, *, lock_annotations: bool, lock_token: uuid.UUID | None = None
) -> bytes:
    """:func:`encode_received` without proton for a message that is not dead-lettered.

    The stored sections are copied as they are; the header's fields and the message annotations'
    entries are copied raw, with the broker's values put in (same entries, same order as proton's path).
    """
    header: list[bytes] = [b"\x40"] * 4
    original: list[tuple[bytes, bytes]] = []  # message annotations: (raw key, raw value)
    rest: list[bytes] = []
    view = memoryview(wire)
    pos, end = 0, len(wire)
    try:
        while pos < end:
            if wire[pos] != 0x00 or wire[pos + 1] != 0x53:
                raise _Unusual
            code = wire[pos + 2]
            start = pos
            reader = Reader(view[pos + 3 :])
            if code == HEADER or code == MESSAGE_ANNOTATIONS:
                spans = reader.field_spans() if code == HEADER else reader.map_spans()
                raw = [bytes(view[pos + 3 + a : pos + 3 + b]) for a, b in spans]
                if code == HEADER:
                    if len(raw) > 5:
                        raise _Unusual
                    header[: min(len(raw), 4)] = raw[:4]
                else:
                    original = list(zip(raw[0::2], raw[1::2], strict=True))
            else:
                reader.skip()
            pos += 3 + reader.pos
            if code == DELIVERY_ANNOTATIONS or code == HEADER or code == MESSAGE_ANNOTATIONS:
                continue
            if not HEADER <= code <= FOOTER:
                raise _Unusual
            rest.append(wire[start:pos])
    except (IndexError, struct.error, DecodeError):
        raise _Unusual from None
    if pos != end:
        raise _Unusual
    ours = {
        _SEQUENCE_NUMBER_KEY: _long(int(message.sequence_number)),
        _ENQUEUED_TIME_KEY: _timestamp(message.enqueued_time_utc),
    }
    if message.scheduled_enqueue_time_utc is not None:
        ours[_SCHEDULED_KEY] = _timestamp(message.scheduled_enqueue_time_utc)
    if message.partition_key is not None:
        ours[_PARTITION_KEY_KEY] = _string(message.partition_key)
    if message.dead_letter_source is not None:
        ours[_DEAD_LETTER_SOURCE_KEY] = _string(message.dead_letter_source)
    ours[_MESSAGE_STATE_KEY] = _long(int(_SDK_STATES.get(message.state, 0)))
    if lock_annotations and message.locked_until_utc is not None:
        ours[_LOCKED_UNTIL_KEY] = _timestamp(message.locked_until_utc)
    pairs: list[bytes] = []
    for key, value in original:  # a key the broker sets keeps its place, as in a dict
        name, _ = _scalar(key, 0) if key[0] in (0xA3, 0xB3) else (None, 0)
        mine = None if name is None else _symbol8(name)
        pairs += (key, ours.pop(mine, value) if mine is not None else value)
    for key, value in ours.items():
        pairs += (key, value)
    out = _described_list(HEADER, [*header, _uint(max(message.delivery_count - 1, 0))]) + _delivery_annotations(
        lock_token
    )
    return out + _described_map(MESSAGE_ANNOTATIONS, pairs) + b"".join(rest)


def encode_received(message: ReceivedMessage, *, lock_annotations: bool, lock_token: uuid.UUID | None = None) -> bytes:
    """The encoding a receiver gets: the stored message, a fresh header and the broker's annotations."""
    wire = message.wire if message.wire is not None else _fields_encoding(message)
    dead_lettered = message.dead_letter_reason is not None or message.dead_letter_error_description is not None
    if not dead_lettered:
        try:
            return _encode_received_fast(message, wire, lock_annotations=lock_annotations, lock_token=lock_token)
        except (_Unusual, UnicodeDecodeError):
            pass
    return encode_received_with_proton(message, wire, lock_annotations=lock_annotations, lock_token=lock_token)


def encode_received_with_proton(
    message: ReceivedMessage, wire: bytes, *, lock_annotations: bool, lock_token: uuid.UUID | None = None
) -> bytes:
    """:func:`encode_received` through proton: every case (dead-lettered messages get properties added)."""
    sections = split_sections(wire)
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
    out = bytearray(_encode_section(HEADER, header)) + _delivery_annotations(lock_token)
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
