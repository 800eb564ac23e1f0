"""What a receiver gets: the stored encoding of a message, with a fresh header and the broker's annotations.

The sender's sections are copied as they came (property types, value bodies, several data sections);
the header gets the delivery count, the message annotations the broker's values (sequence number,
enqueued time, lock expiry, ...), a dead-lettered message's application properties its reason, and a
message received by sequence number its lock token in the delivery annotations. The fast path copies
raw bytes; proton's path (:func:`encode_received_with_proton`) handles every case and is the reference
the fast path is tested against byte for byte.
"""

from __future__ import annotations

import datetime
import struct
import uuid
from typing import Any

import proton

from oncebus.amqp.codec import (
    APPLICATION_PROPERTIES,
    DEAD_LETTER_ERROR_DESCRIPTION,
    DEAD_LETTER_REASON,
    DEAD_LETTER_SOURCE,
    DELIVERY_ANNOTATIONS,
    ENQUEUED_TIME,
    FOOTER,
    HEADER,
    LOCK_TOKEN,
    LOCKED_UNTIL,
    MESSAGE_ANNOTATIONS,
    MESSAGE_STATE,
    PARTITION_KEY,
    PROPERTIES,
    SCHEDULED_ENQUEUE_TIME,
    SDK_STATES,
    SEQUENCE_NUMBER,
    Unusual,
    encode_section,
    scalar,
    split_sections,
)
from oncebus.amqp.encoding import DecodeError, Reader, jump
from oncebus.amqp.reencode import amqp_value, reencode
from oncebus.core.messages import MessageState
from oncebus.core.received import ReceivedMessage
from oncebus.core.timeutil import MAX_US, MIN_US, datetime_to_us


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
        properties={name: amqp_value(value) for name, value in message.application_properties.items()} or None,
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


def _timestamp_us(us: int) -> bytes:
    """An AMQP timestamp (milliseconds) of a time in microseconds, as ``_ms`` of its datetime gives it."""
    return b"\x83" + struct.pack(">q", min(max(us, MIN_US), MAX_US) // 1000)


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


# an AMQP int, as Service Bus sends it: the Java SDK reads the state only from an int (a long reads as Active)
_STATES = {state: bytes((0x54, number)) for state, number in SDK_STATES.items()}  # smallint: 0, 1, 2
_STATE_ACTIVE = _STATES[MessageState.ACTIVE]
_NULL_FIELDS = (b"\x40",) * 4  # the header of a message sent without one: nulls before the delivery count


def lock_token_bytes(token: uuid.UUID) -> bytes:
    """``token.bytes`` (the AMQP uuid's 16 bytes, big-endian) read from its int: ``UUID.bytes`` is a Python call."""
    return token.int.to_bytes(16, "big")


def lock_token_tag(token: uuid.UUID) -> bytes:
    """``token.bytes_le``, the delivery tag of a locked message (the SDKs read the lock token from it as .NET's
    ``Guid`` bytes: the first three fields little-endian), without ``UUID``'s two Python property calls."""
    raw = lock_token_bytes(token)
    return raw[3::-1] + raw[5:3:-1] + raw[7:5:-1] + raw[8:]


def _delivery_annotations(
    lock_token: uuid.UUID | None, sender: list[tuple[bytes, bytes]] | None = None, *, always: bool = False
) -> bytes:
    """The delivery annotations a receiver gets: the sender's own (raw key, raw value) entries, as Service Bus keeps
    them, and a locked message's lock token (``x-opt-lock-token``; the SDK checks it against the delivery tag,
    and 7.14 reads it for a message received by sequence number). ``always``: the section even when empty, as
    Service Bus sends a receive-and-delete delivery (the SDK's test_message.py reads ``{}`` there)."""
    pairs: list[bytes] = []
    for key, value in sender or ():
        if key != _LOCK_TOKEN_KEY:  # the broker's own, never the sender's
            pairs += (key, value)
    if lock_token is not None:
        pairs += (_LOCK_TOKEN_KEY, b"\x98" + lock_token_bytes(lock_token))
    if not pairs and not always:
        return b""
    return _described_map(DELIVERY_ANNOTATIONS, pairs)


def _map_pairs(view: memoryview) -> list[tuple[bytes, bytes]]:
    """A map's entries as (raw key, raw value), read by their declared sizes (the codec checked them on arrival)."""
    reader = Reader(view)
    found = reader.map_spans()
    if reader.pos != len(view):
        raise Unusual
    raw = [bytes(view[a:b]) for a, b in found]
    return list(zip(raw[0::2], raw[1::2], strict=True))


def _encode_received_fast(
    message: ReceivedMessage,
    wire: bytes,
    *,
    lock_annotations: bool,
    lock_token: uuid.UUID | None = None,
    delivered_section: bool = False,
) -> bytes:
    """:func:`encode_received` without proton for a message that is not dead-lettered.

    The stored sections are copied as they are, stepped over by their declared sizes (the codec checked
    every value in them when the message arrived); only a header and message annotations the sender
    put in are read, field by field: the header's fields and the annotations' entries are copied raw,
    with the broker's values put in (same entries, same order as proton's path).
    """
    header: list[bytes] | None = None
    original: list[tuple[bytes, bytes]] | None = None  # message annotations: (raw key, raw value)
    delivered: list[tuple[bytes, bytes]] | None = None  # the sender's delivery annotations, the same way
    spans: list[list[int]] = []  # the sections copied as they are, runs of them merged
    pos, end = 0, len(wire)
    try:
        while pos < end:
            if wire[pos] != 0x00 or wire[pos + 1] != 0x53:
                raise Unusual
            code = wire[pos + 2]
            after = jump(wire, pos + 3)
            if PROPERTIES <= code <= FOOTER:
                if spans and spans[-1][1] == pos:
                    spans[-1][1] = after
                else:
                    spans.append([pos, after])
            elif code in (HEADER, MESSAGE_ANNOTATIONS, DELIVERY_ANNOTATIONS):
                view = memoryview(wire)[pos + 3 : after]
                reader = Reader(view)
                found = reader.field_spans() if code == HEADER else reader.map_spans()
                if reader.pos != len(view):
                    raise Unusual
                raw = [bytes(view[a:b]) for a, b in found]
                if code == HEADER:
                    if len(raw) > 5:
                        raise Unusual
                    header = [b"\x40"] * 4
                    header[: min(len(raw), 4)] = raw[:4]
                elif code == MESSAGE_ANNOTATIONS:
                    original = list(zip(raw[0::2], raw[1::2], strict=True))
                else:
                    delivered = list(zip(raw[0::2], raw[1::2], strict=True))
            else:
                raise Unusual
            pos = after
    except (IndexError, struct.error, DecodeError):
        raise Unusual from None
    if pos != end:
        raise Unusual
    ours = [
        (_SEQUENCE_NUMBER_KEY, _long(message.sequence_number)),
        (_ENQUEUED_TIME_KEY, _timestamp_us(message.enqueued_time_us)),
    ]
    if (scheduled := message.scheduled_enqueue_time_us) is not None:
        ours.append((_SCHEDULED_KEY, _timestamp_us(scheduled)))
    if (partition_key := message.partition_key) is not None:
        ours.append((_PARTITION_KEY_KEY, _string(partition_key)))
    if (source := message.dead_letter_source) is not None:
        ours.append((_DEAD_LETTER_SOURCE_KEY, _string(source)))
    if message.state != MessageState.ACTIVE:  # Service Bus leaves it out for an active message (Active by default)
        ours.append((_MESSAGE_STATE_KEY, _STATES.get(message.state, _STATE_ACTIVE)))
    if lock_annotations and message.locked_until_us is not None:
        ours.append((_LOCKED_UNTIL_KEY, _timestamp_us(message.locked_until_us)))
    pairs: list[bytes] = []
    if original:
        mine = dict(ours)
        for key, value in original:  # a key the broker sets keeps its place, as in a dict
            name, _ = scalar(key, 0) if key[0] in (0xA3, 0xB3) else (None, 0)
            # the broker's keys are short: a sender's symbol of 256 bytes or more is none of them (and has no sym8)
            symbol = None if name is None or len(name) > 255 else _symbol8(name)
            pairs += (key, mine.pop(symbol, value) if symbol is not None else value)
        ours = list(mine.items())
    for key, value in ours:
        pairs += (key, value)
    count = _uint(max(message.delivery_count - 1, 0))
    out = _described_list(HEADER, [*(_NULL_FIELDS if header is None else header), count])
    out += _delivery_annotations(lock_token, delivered, always=delivered_section)
    out += _described_map(MESSAGE_ANNOTATIONS, pairs)
    if len(spans) == 1 and spans[0][0] == 0 and spans[0][1] == end:
        return out + wire
    return out + b"".join([wire[a:b] for a, b in spans])


def encode_received(
    message: ReceivedMessage,
    *,
    lock_annotations: bool,
    lock_token: uuid.UUID | None = None,
    delivered_section: bool = False,
) -> bytes:
    """The encoding a receiver gets: the stored message, a fresh header and the broker's annotations.
    ``delivered_section``: a delivery-annotations section even when it is empty (a receive link's transfer)."""
    wire = message.wire
    if wire is None:
        wire = _fields_encoding(message)
    elif message.rewritten:  # a rule action changed these since the sender encoded it
        wire = reencode(wire, message, message.rewritten)
    dead_lettered = message.dead_letter_reason is not None or message.dead_letter_error_description is not None
    if not dead_lettered:
        try:
            return _encode_received_fast(
                message,
                wire,
                lock_annotations=lock_annotations,
                lock_token=lock_token,
                delivered_section=delivered_section,
            )
        except (Unusual, UnicodeDecodeError):
            pass
    return encode_received_with_proton(
        message, wire, lock_annotations=lock_annotations, lock_token=lock_token, delivered_section=delivered_section
    )


def encode_received_with_proton(
    message: ReceivedMessage,
    wire: bytes,
    *,
    lock_annotations: bool,
    lock_token: uuid.UUID | None = None,
    delivered_section: bool = False,
) -> bytes:
    """:func:`encode_received` through proton: every case (dead-lettered messages get properties added)."""
    sections = split_sections(wire)
    header: list[Any] = [None, None, None, None, None]
    annotations: dict[Any, Any] = {}
    delivered: list[tuple[bytes, bytes]] = []
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
            delivered = _map_pairs(memoryview(section.raw)[3:])
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
    if message.state != MessageState.ACTIVE:
        annotations[MESSAGE_STATE] = proton.int32(SDK_STATES.get(message.state, 0))
    if lock_annotations and message.locked_until_utc is not None:
        annotations[LOCKED_UNTIL] = _ms(message.locked_until_utc)
    out = bytearray(encode_section(HEADER, header)) + _delivery_annotations(
        lock_token, delivered, always=delivered_section
    )
    out += encode_section(MESSAGE_ANNOTATIONS, proton.AnnotationDict(annotations))
    if dead_lettered:
        properties = properties if properties is not None else {}
        if message.dead_letter_reason is not None:
            properties[DEAD_LETTER_REASON] = message.dead_letter_reason
        if message.dead_letter_error_description is not None:
            properties[DEAD_LETTER_ERROR_DESCRIPTION] = message.dead_letter_error_description
        # the application properties go before the body, right after the properties section
        index = next((i for i, raw in enumerate(rest) if _code(raw) > APPLICATION_PROPERTIES), len(rest))
        # string keys, as AMQP wants them there (proton's PropertyDict would make them symbols)
        rest.insert(index, encode_section(APPLICATION_PROPERTIES, properties))
    for raw in rest:
        out += raw
    return bytes(out)


def _code(raw: bytes) -> int:
    return raw[2] if raw[1] == 0x53 else raw[9]
