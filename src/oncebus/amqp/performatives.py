"""AMQP 1.0 performatives as bytes: their codes, and the frames written outside the engine.

The engine (:mod:`oncebus.amqp.engine`) writes every performative with all its fields (azure-servicebus 7.14
reads fields by position); the connection writes the protocol header, an ``open`` and a ``close`` itself when
it refuses a client that broke the protocol before the engine got far enough to.
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
