"""Generated messages and frames straight at the codec and the frame scanner (thousands of examples a second).

The wire fuzz (test_fuzz_wire.py) finds what needs a running server; here hypothesis looks for what
needs many tries: a message field of a type the codec did not foresee. The properties:

* a message is either decoded or refused with ``InvalidArgumentError`` (a clear refusal of that one
  message), never another exception (which used to close the connection with internal-error);
* a decoded message can always be delivered again (encoded for a receiver, dead-lettered or not), so
  nothing the server acknowledges can become undeliverable;
* the frame scanner either passes bytes or raises ``FrameError`` (a clean close), never another exception.
"""

from __future__ import annotations

import os
import struct
import uuid
from datetime import UTC, datetime
from typing import Any

import proton
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oncebus.amqp import codec, outgoing
from oncebus.amqp.encoding import DecodeError, jump, skip
from oncebus.amqp.frames import FrameError, FrameScanner
from oncebus.amqp.performatives import BATCH_MESSAGE_FORMAT
from oncebus.core.errors import InvalidArgumentError
from oncebus.core.messages import MessageState, ReceivedMessage
from tests.fuzz.mutations import amqp_values, encode_value, nested, performative, scalars
from tests.messages import received_of

EXAMPLES = int(os.environ.get("ONCEBUS_FUZZ_CODEC_EXAMPLES", "1200"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=os.environ.get("ONCEBUS_FUZZ_RANDOM") != "1",
    database=None,
    suppress_health_check=list(HealthCheck),
)

_values = st.one_of(scalars, scalars, amqp_values, st.integers(30, 200).map(lambda d: nested(d)))
_encoded = _values.map(lambda v: v if isinstance(v, bytes) and v[:1] in (b"\x45", b"\xd0") else encode_value(v))


def _list_section(code: int, fields: list[bytes]) -> bytes:
    body = b"".join(fields)
    return bytes((0, 0x53, code)) + b"\xd0" + struct.pack(">II", len(body) + 4, len(fields)) + body


def _map_section(code: int, pairs: list[tuple[bytes, bytes]]) -> bytes:
    body = b"".join(k + v for k, v in pairs)
    return bytes((0, 0x53, code)) + b"\xd1" + struct.pack(">II", len(body) + 4, 2 * len(pairs)) + body


_SERVICE_BUS_KEYS = [
    "x-opt-partition-key",
    "x-opt-scheduled-enqueue-time",
    "x-opt-enqueued-time",
    "x-opt-sequence-number",
]
_keys = st.one_of(
    st.sampled_from(_SERVICE_BUS_KEYS).map(proton.symbol),
    st.text(max_size=12),
    st.binary(max_size=6),
    st.integers(0, 2**64 - 1).map(proton.ulong),
).map(encode_value)


@st.composite
def messages(draw: Any) -> bytes:
    """An encoded message: any of its sections present, each field a plausible or a wrong-typed value."""
    sections: list[bytes] = []
    if draw(st.booleans()):
        sections.append(_list_section(0x70, draw(st.lists(_encoded, max_size=5))))
    if draw(st.booleans()):
        sections.append(_map_section(0x71, draw(st.lists(st.tuples(_keys, _encoded), max_size=3))))
    if draw(st.booleans()):
        sections.append(_map_section(0x72, draw(st.lists(st.tuples(_keys, _encoded), max_size=4))))
    if draw(st.booleans()):
        sections.append(_list_section(0x73, draw(st.lists(_encoded, max_size=13))))
    if draw(st.booleans()):
        sections.append(_map_section(0x74, draw(st.lists(st.tuples(_keys, _encoded), max_size=4))))
    body = draw(st.sampled_from(["data", "value", "sequence", "none", "raw"]))
    if body == "data":
        sections += [b"\x00\x53\x75" + encode_value(d) for d in draw(st.lists(st.binary(max_size=40), max_size=3))]
    elif body == "value":
        sections.append(b"\x00\x53\x77" + draw(_encoded))
    elif body == "sequence":
        sections.append(b"\x00\x53\x76" + encode_value(draw(st.lists(amqp_values, max_size=3))))
    elif body == "raw":
        sections.append(draw(st.binary(max_size=30)))
    if draw(st.booleans()):
        sections.append(_map_section(0x78, draw(st.lists(st.tuples(_keys, _encoded), max_size=2))))
    order = draw(st.permutations(range(len(sections)))) if draw(st.integers(0, 9)) == 0 else range(len(sections))
    return b"".join(sections[i] for i in order)


def _received(message: Any, *, dead_lettered: bool) -> ReceivedMessage:
    return received_of(
        body=message.body,
        message_id=message.message_id,
        sequence_number=7,
        enqueued_time_utc=datetime(2030, 1, 1, tzinfo=UTC),
        delivery_count=1,
        state=MessageState.ACTIVE,
        lock_token=uuid.uuid4(),
        locked_until_utc=datetime(2030, 1, 1, 0, 1, tzinfo=UTC),
        expires_at_utc=None,
        session_id=message.session_id,
        partition_key=message.partition_key,
        correlation_id=message.correlation_id,
        subject=message.subject,
        content_type=message.content_type,
        reply_to=message.reply_to,
        reply_to_session_id=message.reply_to_session_id,
        to=message.to,
        application_properties=message.application_properties,
        time_to_live=message.time_to_live,
        scheduled_enqueue_time_utc=message.scheduled_enqueue_time_utc,
        dead_letter_reason="why" if dead_lettered else None,
        dead_letter_error_description="because" if dead_lettered else None,
        dead_letter_source=None,
        wire=message.wire,
    )


def _judge(payload: bytes, message_format: int) -> None:
    try:
        decoded = codec.decode_transfer(payload, message_format)
    except InvalidArgumentError:
        return  # refused, with a message saying why: fine
    for message in decoded:
        for dead_lettered in (False, True):
            out = outgoing.encode_received(_received(message, dead_lettered=dead_lettered), lock_annotations=True)
            assert codec.split_sections(out)  # deliverable, and well formed


@FUZZ
@given(messages())
def test_a_message_is_decoded_and_deliverable_or_refused_clearly(payload: bytes) -> None:
    _judge(payload, 0)


@FUZZ
@given(st.lists(messages(), min_size=1, max_size=3), st.binary(max_size=8))
def test_a_batch_is_decoded_and_deliverable_or_refused_clearly(inner: list[bytes], noise: bytes) -> None:
    envelope = b"".join(b"\x00\x53\x75" + encode_value(m) for m in inner)
    _judge(envelope, BATCH_MESSAGE_FORMAT)
    _judge(envelope + noise, BATCH_MESSAGE_FORMAT)


_frames = st.one_of(
    st.tuples(st.integers(0x10, 0x18), st.lists(_encoded, max_size=14), st.integers(0, 2)).map(
        lambda t: performative(t[0], t[1], t[2])
    ),
    st.tuples(st.integers(0x40, 0x44), st.lists(_encoded, max_size=4)).map(
        lambda t: performative(t[0], t[1], 0, frame_type=1)
    ),
    st.binary(max_size=64),
)


@FUZZ
@given(
    st.sampled_from([b"AMQP\x00\x01\x00\x00", b"AMQP\x03\x01\x00\x00", b""]),
    st.lists(_frames, max_size=8),
    st.lists(st.integers(1, 64), max_size=6),
)
def test_the_frame_scanner_passes_bytes_or_raises_frame_error(
    header: bytes, frames: list[bytes], cuts: list[int]
) -> None:
    scanner = FrameScanner()
    stream = header + b"".join(frames)
    position = 0
    try:
        for cut in [*cuts, len(stream)]:
            scanner.feed(stream[position : position + cut])
            scanner.set_link_limit("n", 1024)
            position += cut
    except FrameError:
        pass


@FUZZ
@given(amqp_values)
def test_jump_steps_over_a_checked_value_to_where_skip_ends(value: Any) -> None:
    """``encoding.jump`` (a stored message's sections on their way out) trusts declared sizes; on any
    value ``skip`` passes it ends where ``skip`` does, alone or followed by more bytes."""
    raw = encode_value(value)
    assert skip(raw, 0) == len(raw)
    assert jump(raw, 0) == len(raw)
    assert jump(raw + b"\x40\x41", 0) == len(raw)


def test_jump_steps_over_arrays_and_refuses_an_unknown_constructor() -> None:
    for array in (
        proton.Array(proton.UNDESCRIBED, proton.Data.INT, 1, 2, 3),
        proton.Array(proton.UNDESCRIBED, proton.Data.STRING, *("x" * 300 for _ in range(2))),
    ):
        raw = encode_value(array)
        assert jump(raw, 0) == skip(raw, 0) == len(raw)
    with pytest.raises(DecodeError, match="unknown AMQP constructor 0x3f"):
        jump(b"\x3f", 0)
