"""AMQP 1.0 performatives as bytes: their codes and field counts, and the few frames oncebus writes itself.

proton writes almost every frame; oncebus writes the protocol header, an ``open`` and a ``close`` itself when
it refuses a client that broke the protocol (proton never got far enough to), and gives each performative
proton writes all its fields (:func:`pad_fields`), for clients that read fields by position.
"""

from __future__ import annotations

import struct

from oncebus.amqp.encoding import NULL, encode_described, encode_list, encode_string, encode_symbol, encode_uint

PROTOCOL_HEADER_PREFIX = b"AMQP"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"
BATCH_MESSAGE_FORMAT = 0x80013700
PLAIN_MESSAGE_FORMAT = 0

FRAME_TYPE_AMQP = 0
FRAME_TYPE_SASL = 1
OPEN = 0x10
BEGIN = 0x11
ATTACH = 0x12
FLOW = 0x13
TRANSFER = 0x14
DISPOSITION = 0x15
DETACH = 0x16
END = 0x17
CLOSE = 0x18
ERROR = 0x1D
SASL_OUTCOME = 0x44
AMQP_PERFORMATIVES = {
    OPEN: "open",
    BEGIN: "begin",
    ATTACH: "attach",
    FLOW: "flow",
    TRANSFER: "transfer",
    DISPOSITION: "disposition",
    DETACH: "detach",
    END: "end",
    CLOSE: "close",
}
SASL_PERFORMATIVES = {
    0x40: "sasl-mechanisms",
    0x41: "sasl-init",
    0x42: "sasl-challenge",
    0x43: "sasl-response",
    SASL_OUTCOME: "sasl-outcome",
}
# the field counts of the AMQP performatives: proton leaves out trailing fields that hold their default
# (legal AMQP), azure-servicebus 7.14 reads fields by position (open's properties are frame[9], a transfer's
# payload follows its 11th field, a detach's error is frame[2], ...) and fails with "list index out of range";
# so every performative oncebus sends carries every field (an absent one as null, which means its default)
FULL_FIELD_COUNTS = {
    OPEN: 10,
    BEGIN: 8,
    ATTACH: 14,
    FLOW: 11,
    TRANSFER: 11,
    DISPOSITION: 6,
    DETACH: 3,
    END: 1,
    CLOSE: 1,
}


def descriptor_code(frame: bytes | memoryview, start: int) -> int | None:
    """The numeric descriptor of the performative at ``start`` (None for any other encoding)."""
    if len(frame) >= start + 3 and frame[start] == 0x00 and frame[start + 1] == 0x53:
        return int(frame[start + 2])
    if len(frame) >= start + 10 and frame[start] == 0x00 and frame[start + 1] == 0x80:
        value = int(struct.unpack_from(">Q", frame, start + 2)[0])
        return value if value < 256 else None
    return None


def descriptor_length(frame: bytes | memoryview, start: int) -> int:
    return 3 if frame[start + 1] == 0x53 else 10


def pad_fields(frame: bytes | memoryview, start: int, wanted: int) -> bytes | None:
    """``frame`` with its performative list extended by nulls to ``wanted`` fields (None: nothing to add)."""
    at = start + descriptor_length(frame, start)
    code = frame[at]
    if code == 0x45:
        count, items, stop = 0, at + 1, at + 1
    elif code == 0xC0:
        count, items, stop = frame[at + 2], at + 3, at + 2 + frame[at + 1]
    elif code == 0xD0:
        size, count = struct.unpack_from(">II", frame, at + 1)
        items, stop = at + 9, at + 5 + size
    else:
        return None
    if count >= wanted:
        return None
    body = bytes(frame[items:stop]) + NULL * (wanted - count)
    if len(body) + 1 <= 255:
        listed = bytes((0xC0, len(body) + 1, wanted)) + body
    else:
        listed = b"\xd0" + struct.pack(">II", len(body) + 4, wanted) + body
    head = bytes(frame[4:at])
    rest = bytes(frame[stop:])
    return struct.pack(">I", 4 + len(head) + len(listed) + len(rest)) + head + listed + rest


FRAME_HEADER_SIZE = 8


def split_frames(frames: bytes) -> list[bytes]:
    """Whole frames (as this module writes them: data offset 2) one by one."""
    out = []
    offset = 0
    while offset < len(frames):
        (size,) = struct.unpack_from(">I", frames, offset)
        out.append(frames[offset : offset + size])
        offset += size
    return out


def error_list(condition: str, description: str) -> bytes:
    """An AMQP ``error`` (with the empty info map the SDK reads unconditionally)."""
    return encode_described(ERROR, encode_list([encode_symbol(condition), encode_string(description), b"\xc1\x01\x00"]))


def amqp_frame(performative: int, fields: list[bytes], channel: int = 0) -> bytes:
    body = encode_described(performative, encode_list(fields))
    return struct.pack(">IBBH", 8 + len(body), 2, FRAME_TYPE_AMQP, channel) + body


def open_frame(container_id: str, max_frame_size: int) -> bytes:
    """An ``open`` with every field present (for a close that must come after an open)."""
    fields = [encode_string(container_id), NULL, encode_uint(max_frame_size)] + [NULL] * 7
    return amqp_frame(OPEN, fields)


def close_frame(condition: str, description: str) -> bytes:
    return amqp_frame(CLOSE, [error_list(condition, description)])
