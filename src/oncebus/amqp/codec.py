"""AMQP messages <-> the broker's messages.

Incoming: a transfer's payload becomes one :class:`Message` (message format 0)
or, for a Service Bus batch (message format ``0x80013700``, read from the
frame, never guessed from the payload), one message per data section, each
section being a whole encoded message. Every message keeps its own encoding
as ``wire`` so a receiver gets back exactly what was sent (property types,
value bodies, several data sections).

A field of a type Service Bus does not take refuses that message (an
``InvalidArgumentError`` naming the field), never the connection; so does a
value the delivery path could not encode again (a symbol that is not ASCII, a
message-annotation key that is not a symbol or ulong, an application-property
key that is not a string). Outgoing: :mod:`oncebus.amqp.outgoing`.

The message applications send (a header, message annotations, properties and
application properties of plain values, data sections) is read once, by
:func:`_decode_fast`, which checks each value as it reads it; any other shape
(a value or sequence body, compound, described or array values, chars and
decimals, a section twice) goes to :func:`decode_message_general`, which
decodes those sections with proton and encodes them again with proton to find
out what the delivery path could not encode (``_check_reencodable``): the
reference the fast path is tested against (``tests/fuzz/test_fuzz_codec.py``).
"""

from __future__ import annotations

import datetime
import json
import struct
import uuid
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import proton

from oncebus.amqp.encoding import DEFAULT_MAX_DEPTH, DecodeError, Reader, decode
from oncebus.amqp.performatives import BATCH_MESSAGE_FORMAT, PLAIN_MESSAGE_FORMAT
from oncebus.amqp.rules import value_from_amqp
from oncebus.amqp.values import text as _text
from oncebus.core.errors import InvalidArgumentError
from oncebus.core.messages import Message, MessageState, WireSections, set_wire_reader
from oncebus.core.properties import DEAD_LETTER_PROPERTIES, WIRE_PROPERTY_FIELDS, annotation_key
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

# the annotations Service Bus carries properties in (oncebus.core.properties names them)
PARTITION_KEY = proton.symbol(annotation_key("partition_key"))
SCHEDULED_ENQUEUE_TIME = proton.symbol(annotation_key("scheduled_enqueue_time_utc"))
SEQUENCE_NUMBER = proton.symbol(annotation_key("sequence_number"))
ENQUEUED_TIME = proton.symbol(annotation_key("enqueued_time_utc"))
LOCKED_UNTIL = proton.symbol(annotation_key("locked_until_utc"))
LOCK_TOKEN = proton.symbol(annotation_key("lock_token"))
MESSAGE_STATE = proton.symbol(annotation_key("state"))
DEAD_LETTER_SOURCE = proton.symbol(annotation_key("dead_letter_source"))
DEAD_LETTER_REASON, DEAD_LETTER_ERROR_DESCRIPTION = (name for _, name in DEAD_LETTER_PROPERTIES)

SDK_STATES = {MessageState.ACTIVE: 0, MessageState.DEFERRED: 1, MessageState.SCHEDULED: 2}


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
        if described is None:
            raise DecodeError("the section holds no value")
        # proton's binary values are memoryviews into this Data's buffer that do not keep the Data alive, and compiled
        # code (mypyc) drops a local after its last use: the copy is made while ``data`` is still used below
        value = copy_value(described.value)
        data.clear()
        return value

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


def encode_section(code: int, value: Any) -> bytes:
    data = proton.Data()
    data.put_object(proton.Described(proton.ulong(code), value))
    return bytes(data.encode())


# ---------------------------------------------------------------------------------- incoming
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


def _partition_key(value: Any) -> str | None:
    """``x-opt-partition-key``: a string, or binary holding one in UTF-8, taken as that string.

    The Python SDK reads a received message's strings as bytes and sends them back so when the message is sent
    again (its own tests do it, against Service Bus): the annotation then arrives as binary. Any other type is
    refused, never stringified (``5`` and ``"5"`` would share a dedup key)."""
    if isinstance(value, bytes | memoryview):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidArgumentError(
                f"the partition key (x-opt-partition-key) must be a string, not binary {bytes(value)!r} that is not "
                "UTF-8"
            ) from None
    return _string_field(value, "the partition key (x-opt-partition-key)")


def _ttl(value: Any) -> datetime.timedelta | None:
    if value is None:
        return None
    # proton's type first: compiled code (mypyc) keeps a small int narrowed to ``int`` as a plain int
    integer = not isinstance(value, bool | proton.timestamp) and isinstance(value, int)
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


def property_value(value: Any) -> Any:
    """A value a settlement merges into a message's application properties (its properties to modify) as the model
    holds one: copied out of proton's buffer; a timestamp and Service Bus's described TimeSpan and DateTimeOffset
    as times (the delivery encoder writes them back so); another described value as the value it describes (a
    .NET Uri as its text); the rest as it came, for the core to check as it checks a send's."""
    value = value_from_amqp(copy_value(value))
    if isinstance(value, proton.Described) and not isinstance(value.value, list | dict | proton.Described):
        return value_from_amqp(value.value)
    return value


_PLAIN_TYPES: tuple[type[Any], ...] = (bool, int, float, str)


def _json_safe(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        # proton's subclasses (ulong, float32, symbol...) made plain by a call on the type, not on a value narrowed
        # to ``int`` (compiled code, mypyc, takes ``int(value)`` of one as the value, keeping a large ulong a ulong)
        for plain in _PLAIN_TYPES:
            if isinstance(value, plain):
                return plain(value)
        return value
    if isinstance(value, bytes | memoryview):
        return bytes(value).hex()
    if isinstance(value, Mapping):
        return {str(_json_safe(k)): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return str(value)


class Unusual(Exception):
    """The fast decoder met something it leaves to the general path (same result, just slower)."""


_UNPACK_U32 = struct.Struct(">I").unpack_from
_UNPACK_U64 = struct.Struct(">Q").unpack_from
_UNPACK_I64 = struct.Struct(">q").unpack_from


def scalar(data: bytes, pos: int) -> tuple[Any, int]:
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
    if code == 0xA3:  # symbols are ASCII (proton reads them so: anything else is refused by the general path)
        end = pos + 1 + data[pos]
        return proton.symbol(data[pos + 1 : end].decode("ascii")), end
    if code == 0xB3:
        end = pos + 4 + _UNPACK_U32(data, pos)[0]
        return proton.symbol(data[pos + 4 : end].decode("ascii")), end
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
    raise Unusual


_LIST_CODES = (0x45, 0xC0, 0xD0)


_FIELD_AT = {field: at for at, field in WIRE_PROPERTY_FIELDS.items()}  # the properties section's fields
_MESSAGE_ID_AT, _SESSION_ID_AT = _FIELD_AT["message_id"], _FIELD_AT["session_id"]
_TEXT_AT = tuple((at, field) for at, field in WIRE_PROPERTY_FIELDS.items() if field not in ("message_id", "session_id"))
_TEXT_NAMES = tuple(dict(_TEXT_AT).get(at) for at in range(13))  # the text field a properties-section index holds


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
    annotations = annotations or {}
    ttl = _ttl(header[2] if header and len(header) > 2 else None)
    if application:
        for key in application:
            if not isinstance(key, str):
                raise InvalidArgumentError(f"application property keys must be strings, not {_amqp_type(key)} {key!r}")
    _check_reencodable(header, annotations, application)
    return Message(
        body=body,
        message_id=message_id_of(properties[_MESSAGE_ID_AT]),
        session_id=_string_field(properties[_SESSION_ID_AT], "the session id (properties group-id)"),
        partition_key=_partition_key(annotations.get(PARTITION_KEY)),
        **{field: _text(properties[at]) for at, field in _TEXT_AT},
        application_properties={str(k): _json_safe(v) for k, v in (application or {}).items()},
        time_to_live=ttl,
        scheduled_enqueue_time_utc=_scheduled_time(annotations.get(SCHEDULED_ENQUEUE_TIME)),
        wire=wire,
        sections=None,  # a rare shape: the store keeps its properties as it did
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
            lambda: dict(application) if application else None,
        ),
    ):
        try:
            value = build()
            if value:
                encode_section(code, value)
        except Exception as exc:
            raise InvalidArgumentError(
                f"the message's {what} hold a value AMQP does not allow there ({type(exc).__name__}: {exc}); "
                "message annotation keys are symbols or ulongs, application property keys strings, symbols ASCII"
            ) from None


# The fast path reads the sections applications send itself, once, and validates what it reads: what it
# accepts, proton (the delivery path's encoder for the header, the annotations and a dead-lettered message's
# application properties) can decode and encode again, so nothing is encoded here to find out. Values of the
# shapes it does not read (lists, maps, arrays, described values, chars, decimals) go to the general path.
_TYPE_NAMES = {
    0x40: "null",
    0x41: "boolean",
    0x42: "boolean",
    0x56: "boolean",
    0x50: "ubyte",
    0x51: "byte",
    0x60: "ushort",
    0x61: "short",
    0x43: "uint",
    0x52: "uint",
    0x70: "uint",
    0x54: "int",
    0x71: "int",
    0x44: "ulong",
    0x53: "ulong",
    0x80: "ulong",
    0x55: "long",
    0x81: "long",
    0x72: "float",
    0x82: "double",
    0x83: "timestamp",
    0x98: "uuid",
    0xA0: "binary",
    0xB0: "binary",
    0xA1: "string",
    0xB1: "string",
    0xA3: "symbol",
    0xB3: "symbol",
    0x45: "list",
    0xC0: "list",
    0xD0: "list",
    0xC1: "map",
    0xD1: "map",
    0xE0: "array",
    0xF0: "array",
    0x00: "described value",
}
# fixed-width numbers as JSON-safe Python values (what ``_json_safe`` makes of proton's): (unpack, width)
_NUMBERS = {
    code: (struct.Struct(fmt).unpack_from, struct.calcsize(fmt))
    for code, fmt in {
        0x50: ">B",
        0x51: ">b",
        0x52: ">B",
        0x53: ">B",
        0x54: ">b",
        0x55: ">b",
        0x60: ">H",
        0x61: ">h",
        0x70: ">I",
        0x71: ">i",
        0x72: ">f",
        0x80: ">Q",
        0x81: ">q",
        0x82: ">d",
        0x83: ">q",
    }.items()
}
_SCALARS = frozenset(_TYPE_NAMES) - {0x45, 0xC0, 0xD0, 0xC1, 0xD1, 0xE0, 0xF0, 0x00}
_MAP_CODES = (-1, 0xC1, 0xD1)  # no map0 in AMQP


def _type_name(code: int) -> str:
    return _TYPE_NAMES.get(code) or f"a value of constructor 0x{code:02x}"


def _span(data: bytes, pos: int, codes: tuple[int, int, int]) -> tuple[int, int, int]:
    """(first item, item count, end) of the list or map at ``pos`` (``codes``: its 0-, 8- and 32-bit forms),
    checked to lie within ``data`` and to have no more items than bytes; anything else is unusual."""
    code = data[pos]
    if code == codes[1]:
        first, count, stop = pos + 3, data[pos + 2], pos + 2 + data[pos + 1]
    elif code == codes[2]:
        first, count, stop = pos + 9, _UNPACK_U32(data, pos + 5)[0], pos + 5 + _UNPACK_U32(data, pos + 1)[0]
    elif code == codes[0]:
        return pos + 1, 0, pos + 1
    else:
        raise Unusual
    if stop > len(data) or first > stop or count > stop - first:
        raise Unusual
    return first, count, stop


def _ascii(data: bytes, start: int, end: int, what: str) -> str:
    """The symbol (or annotation key) in ``data[start:end]``: ASCII, or the message is refused."""
    raw = data[start:end]
    if not raw.isascii():
        raise InvalidArgumentError(f"a symbol in the message's {what} is not ASCII ({raw!r}): AMQP symbols are ASCII")
    return raw.decode("ascii")


def _plain(data: bytes, pos: int, what: str) -> tuple[Any, int]:
    """The scalar at ``pos`` as an application property's value is kept (JSON-safe, as ``_json_safe`` makes
    proton's values: a binary as hex, a uuid as text, every number a plain ``int`` or ``float``) and the position
    after it; also how a header field or annotation value is checked (``what`` names the section). A symbol that
    is not ASCII is refused; a value of another shape (compound, described, array, char, decimal) is
    :class:`Unusual`."""
    code = data[pos]
    if code == 0xA1:
        end = pos + 2 + data[pos + 1]
        return data[pos + 2 : end].decode("utf-8"), end
    number = _NUMBERS.get(code)
    if number is not None:
        unpack, width = number
        return unpack(data, pos + 1)[0], pos + 1 + width
    if code == 0x56:
        return data[pos + 1] != 0, pos + 2
    if code == 0x41:
        return True, pos + 1
    if code == 0x42:
        return False, pos + 1
    if code == 0x40:
        return None, pos + 1
    if code == 0x43 or code == 0x44:
        return 0, pos + 1
    if code == 0xB1:
        end = pos + 5 + _UNPACK_U32(data, pos + 1)[0]
        return data[pos + 5 : end].decode("utf-8"), end
    if code == 0xA3:
        end = pos + 2 + data[pos + 1]
        return _ascii(data, pos + 2, end, what), end
    if code == 0xB3:
        end = pos + 5 + _UNPACK_U32(data, pos + 1)[0]
        return _ascii(data, pos + 5, end, what), end
    if code == 0xA0:
        end = pos + 2 + data[pos + 1]
        return data[pos + 2 : end].hex(), end
    if code == 0xB0:
        end = pos + 5 + _UNPACK_U32(data, pos + 1)[0]
        return data[pos + 5 : end].hex(), end
    if code == 0x98:
        return str(uuid.UUID(bytes=data[pos + 1 : pos + 17])), pos + 17
    raise Unusual


def _typed(data: bytes, pos: int, stop: int, what: str) -> tuple[Any, int]:
    """A scalar at ``pos`` with proton's types (``symbol``, ``uint``, ``timestamp``...), for the fields checked
    by type (the header's ttl, the partition key, the scheduled time); other shapes are :class:`Unusual`."""
    code = data[pos]
    if code not in _SCALARS:
        raise Unusual
    if code == 0xA3 or code == 0xB3:
        _plain(data, pos, what)  # refuses a symbol that is not ASCII
    return decode(data, pos, stop, 1)


def _key(data: bytes, pos: int, what: str) -> tuple[str | None, int, int]:
    """(name, constructor, position after) of a map key here: a string's or ASCII symbol's text, or None."""
    code = data[pos]
    if code == 0xA3 or code == 0xA1:
        end = pos + 2 + data[pos + 1]
        return _ascii(data, pos + 2, end, what) if code == 0xA3 else data[pos + 2 : end].decode("utf-8"), code, end
    if code == 0xB3 or code == 0xB1:
        end = pos + 5 + _UNPACK_U32(data, pos + 1)[0]
        return _ascii(data, pos + 5, end, what) if code == 0xB3 else data[pos + 5 : end].decode("utf-8"), code, end
    if code == 0x73:  # a char: proton takes it as a string key (rare: the general path)
        raise Unusual
    return None, code, pos


def _application_properties(data: bytes, pos: int) -> tuple[dict[str, Any], int]:
    """The application properties section's map at ``pos``: string (or symbol) keys, plain values."""
    item, count, stop = _span(data, pos, _MAP_CODES)
    if count % 2:
        raise Unusual
    found: dict[str, Any] = {}
    for _ in range(count >> 1):
        if item >= stop:
            raise Unusual
        if data[item] == 0xA1:  # the usual key: a short string
            end = item + 2 + data[item + 1]
            key = data[item + 2 : end].decode("utf-8")
            item = end
        else:
            name, code, item = _key(data, item, "application properties")
            if name is None:
                raise InvalidArgumentError(f"application property keys must be strings, not {_type_name(code)}")
            key = name
        if item >= stop:
            raise Unusual
        if data[item] == 0xA1:
            end = item + 2 + data[item + 1]
            found[key] = data[item + 2 : end].decode("utf-8")
            item = end
        else:
            found[key], item = _plain(data, item, "application properties")
    if item != stop:
        raise Unusual
    return found, stop


_PARTITION_KEY_NAME, _SCHEDULED_NAME = str(PARTITION_KEY), str(SCHEDULED_ENQUEUE_TIME)
_ULONG_CODES = frozenset((0x44, 0x53, 0x80))


def _message_annotations(data: bytes, pos: int) -> tuple[Any, Any, int]:
    """(partition key, scheduled enqueue time, position after) of the message annotations' map at ``pos``, both
    with proton's types (None: absent); every key a symbol, an ASCII string (proton makes it a symbol) or a
    ulong, every value a scalar whose symbols are ASCII."""
    item, count, stop = _span(data, pos, _MAP_CODES)
    if count % 2:
        raise Unusual
    what = "message annotations"
    # Any: what ``_typed`` reads has proton's types, which compiled code (mypyc) would check against ``str | None``
    partition_key: Any = None
    scheduled: Any = None
    for _ in range(count >> 1):
        if item >= stop:
            raise Unusual
        name, code, item = _key(data, item, what)
        if name is None:
            if code not in _ULONG_CODES:
                raise InvalidArgumentError(f"message annotation keys must be symbols or ulongs, not {_type_name(code)}")
            _, item = _plain(data, item, what)  # the key
        elif (code == 0xA1 or code == 0xB1) and not name.isascii():  # a string key goes out as a symbol
            raise InvalidArgumentError(
                f"message annotation keys must be symbols or ulongs; the string key {name!r} is taken as a symbol, "
                "but it is not ASCII as AMQP symbols are"
            )
        if item >= stop:
            raise Unusual
        if name == _PARTITION_KEY_NAME:
            if data[item] == 0xA1:
                end = item + 2 + data[item + 1]
                partition_key, item = data[item + 2 : end].decode("utf-8"), end
            else:
                partition_key, item = _typed(data, item, stop, what)
        elif name == _SCHEDULED_NAME:
            if data[item] == 0x83:  # a timestamp: milliseconds since 1970
                scheduled, item = _UNPACK_I64(data, item + 1)[0], item + 9
            else:
                scheduled, item = _typed(data, item, stop, what)
        else:
            _, item = _plain(data, item, what)
    if item != stop:
        raise Unusual
    return partition_key, scheduled, stop


def _header(data: bytes, pos: int) -> tuple[timedelta | None, int]:
    """(the time to live, position after) of the header's list at ``pos``; a ttl that is not a uint (AMQP 1.0,
    3.2.1) is refused by ``_ttl``, naming its type."""
    item, count, stop = _span(data, pos, _LIST_CODES)
    ttl = None
    for index in range(count):
        if index != 2:
            _, item = _plain(data, item, "header")
            continue
        code = data[item]
        if code == 0x70 or code == 0x52:  # uint, smalluint: milliseconds
            if code == 0x70:
                milliseconds, item = _UNPACK_U32(data, item + 1)[0], item + 5
            else:
                milliseconds, item = data[item + 1], item + 2
            ttl = timedelta(milliseconds=milliseconds) if milliseconds else None
        else:
            value, item = _typed(data, item, stop, "header")
            ttl = _ttl(value)
    if item != stop:
        raise Unusual
    return ttl, stop


def _properties(data: bytes, pos: int) -> tuple[Any, Any, dict[str, str | None], int]:
    """The properties section's list at ``pos``: its message id and group id as encoded, its text fields (by the
    model's names: only those set), and where the list ends. Raises :class:`Unusual` for a shape it does not read."""
    message_id: Any = None
    session_id: Any = None
    texts: dict[str, str | None] = {}
    value: Any = None  # (any scalar: compiled, a first str assignment would fix its type)
    item, count, list_end = _span(data, pos, _LIST_CODES)
    if count > 13:
        raise Unusual
    for index in range(count):
        field = data[item]
        if field == 0x40:  # most of the thirteen fields are unset
            item += 1
            continue
        if field == 0xA1:
            after = item + 2 + data[item + 1]
            value = data[item + 2 : after].decode("utf-8")
            item = after
        elif field == 0xA3 and _TEXT_NAMES[index] is not None:  # a symbol (content-type) read as text
            after = item + 2 + data[item + 1]
            value = _ascii(data, item + 2, after, "properties")
            item = after
        else:
            value, item = scalar(data, item)
        if index == _MESSAGE_ID_AT:
            message_id = value
        elif index == _SESSION_ID_AT:
            session_id = value
        elif (name := _TEXT_NAMES[index]) is not None:
            texts[name] = value if type(value) is str else _text(value)
    if item != list_end:
        raise Unusual
    return message_id, session_id, texts, list_end


def _decode_fast(payload: bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> Message:
    """:func:`decode_message` for the shapes applications send; raises :class:`Unusual` otherwise.

    Reads the header, the message annotations, the properties, the application properties and the data
    sections itself, each value once, and refuses (:class:`InvalidArgumentError`) what the delivery path could
    not encode again; a message it does not read whole (a value or sequence body, a compound or described
    property value, a section twice...) goes to :func:`decode_message_general`, which decides.
    """
    data = payload
    end = len(data)
    pos = 0
    seen = 0  # the sections read so far, a bit each: a second one of a kind is the general path's to refuse
    ttl: timedelta | None = None
    partition_key = scheduled = message_id = session_id = None
    texts: dict[str, str | None] = {}
    application: dict[str, Any] = {}
    application_span: tuple[int, int] | None = None  # where the properties' map is: the record reads them there
    properties_span: tuple[int, int] | None = None  # where the properties section's list is (its text fields)
    bodies: list[bytes] = []
    body_offset = 0
    try:
        while pos < end:
            if data[pos] != 0x00 or data[pos + 1] != 0x53:
                raise Unusual
            code = data[pos + 2]
            start = pos
            pos += 3
            if code == DATA:
                value, pos = scalar(data, pos)
                if not isinstance(value, bytes):
                    raise Unusual
                bodies.append(value)
                body_offset = pos - len(value)
                continue
            bit = 1 << (code & 0x0F)
            if seen & bit:
                raise Unusual
            seen |= bit
            if code == PROPERTIES:
                properties_start = pos
                message_id, session_id, texts, pos = _properties(data, pos)
                properties_span = (properties_start, pos)
            elif code == APPLICATION_PROPERTIES:
                application_start = pos
                application, pos = _application_properties(data, pos)
                application_span = (application_start, pos)
            elif code == MESSAGE_ANNOTATIONS:
                partition_key, scheduled, pos = _message_annotations(data, pos)
            elif code == HEADER:
                ttl, pos = _header(data, pos)
            elif code == DELIVERY_ANNOTATIONS or code == FOOTER:
                reader = Reader(memoryview(data)[start:], max_depth)
                reader.descriptor()
                reader.skip()
                pos = start + reader.pos
            else:  # an amqp-value or amqp-sequence body, or not a section at all
                raise Unusual
    except InvalidArgumentError:
        raise
    except (IndexError, struct.error, UnicodeDecodeError, ValueError):  # DecodeError is a ValueError
        raise Unusual from None
    if pos != end or not bodies:
        raise Unusual
    return Message(
        body=bodies[0] if len(bodies) == 1 else b"".join(bodies),
        message_id=message_id if type(message_id) is str else message_id_of(message_id),
        session_id=None if session_id is None else _string_field(session_id, "the session id (properties group-id)"),
        partition_key=None if partition_key is None else _partition_key(partition_key),
        application_properties=application,
        time_to_live=ttl,
        scheduled_enqueue_time_utc=None if scheduled is None else _scheduled_time(scheduled),
        wire=payload,
        sections=WireSections(body_offset, application_span, properties_span) if len(bodies) == 1 else None,
        **texts,
    )


def read_application_properties(wire: bytes, start: int, end: int) -> dict[str, Any]:
    """The application properties whose map :func:`_decode_fast` read at ``wire[start:end]`` when the message
    arrived (``WireSections``), read again the same way: what a stored message's record gives when asked for them
    (its store kept the wire, not a copy of the properties)."""
    found, stop = _application_properties(wire, start)
    if stop != end:
        raise ValueError(f"the application properties end at {stop}, not at {end} as recorded")
    return found


def read_text_fields(wire: bytes, start: int, end: int) -> dict[str, str | None]:
    """The text fields of the properties section whose list :func:`_decode_fast` read at ``wire[start:end]``
    (``WireSections.properties``), read again the same way, by the model's names (those set): what a stored
    message's record gives for its subject, content type, correlation id... (its store kept the wire, not a copy)."""
    try:
        _, _, texts, stop = _properties(wire, start)
    except (Unusual, IndexError, struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"the properties recorded at {start} cannot be read again: {exc!r}") from None
    if stop != end:
        raise ValueError(f"the properties end at {stop}, not at {end} as recorded")
    return texts


set_wire_reader(read_application_properties, read_text_fields)


def decode_message(payload: bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> Message:
    """One encoded AMQP message as the broker's :class:`Message` (``wire`` = the encoding)."""
    payload = bytes(payload)
    try:
        return _decode_fast(payload, max_depth)
    except Unusual:
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
                value, pos = scalar(payload, pos + 3)
                if not isinstance(value, bytes):
                    raise Unusual
                found.append(value)
            else:
                reader = Reader(memoryview(payload)[pos:], max_depth)
                code = reader.descriptor()
                if code is None or not HEADER <= code <= FOOTER:
                    raise Unusual
                reader.skip()
                pos += reader.pos
        if pos != end:
            raise Unusual
        return found
    except (Unusual, IndexError, struct.error, UnicodeDecodeError, DecodeError):
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
