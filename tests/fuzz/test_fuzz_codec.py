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
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from oncebus.amqp import codec, outgoing
from oncebus.amqp.encoding import DecodeError, Reader, decode, jump, skip
from oncebus.amqp.frames import FrameError, FrameScanner
from oncebus.amqp.performatives import BATCH_MESSAGE_FORMAT
from oncebus.core.errors import InvalidArgumentError
from oncebus.core.messages import MessageState
from oncebus.core.received import ReceivedMessage
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


# ------------------------------------------------- the fast decoder against the proton round trip it replaced
def _sized(small: int, large: int, raw: bytes, big: bool = False) -> bytes:
    """A string, symbol or binary (``small``/``large``: its one- and four-byte size constructors)."""
    if big or len(raw) > 255:
        return bytes((large,)) + struct.pack(">I", len(raw)) + raw
    return bytes((small, len(raw))) + raw


def _compound(code8: int, code32: int, items: list[bytes], big: bool) -> bytes:
    body = b"".join(items)
    if big or len(body) + 1 > 255:
        return bytes((code32,)) + struct.pack(">II", len(body) + 4, len(items)) + body
    return bytes((code8, len(body) + 1, len(items))) + body


_ASCII_CHARS = st.characters(min_codepoint=32, max_codepoint=126)
# fixed-width types: integers over their whole range; floats, chars, decimals and uuids any bit pattern
_INTEGERS = {0x50: ">B", 0x51: ">b", 0x52: ">B", 0x53: ">B", 0x54: ">b", 0x55: ">b", 0x56: ">B", 0x60: ">H"}
_INTEGERS |= {0x61: ">h", 0x70: ">I", 0x71: ">i", 0x80: ">Q", 0x81: ">q", 0x83: ">q"}
_BITS = {0x72: 4, 0x82: 8, 0x98: 16}
_RARE_BITS = {0x73: 4, 0x74: 4, 0x84: 8, 0x94: 16}  # char and decimals: left to the general path


def _integer(code: int) -> st.SearchStrategy[bytes]:
    width = 8 * struct.calcsize(_INTEGERS[code])
    low, high = (0, 2**width - 1) if _INTEGERS[code][1:].isupper() else (-(2 ** (width - 1)), 2 ** (width - 1) - 1)
    return st.integers(low, high).map(lambda n: bytes((code,)) + struct.pack(_INTEGERS[code], n))


def _bits(codes: dict[int, int]) -> list[st.SearchStrategy[bytes]]:
    return [
        st.builds(bytes.__add__, st.just(bytes((code,))), st.binary(min_size=n, max_size=n))
        for code, n in codes.items()
    ]


_strings = st.one_of(st.text(max_size=12), st.text(_ASCII_CHARS, min_size=250, max_size=300))  # 300: str32
_symbols = st.one_of(st.text(_ASCII_CHARS, max_size=12), st.text(_ASCII_CHARS, min_size=250, max_size=300))
# what applications put in a header, annotations or application properties: every scalar type, a string or
# symbol of 0 to 300 characters, in their short and long encodings
_plain_values = st.one_of(
    st.sampled_from([b"\x40", b"\x41", b"\x42", b"\x43", b"\x44"]),
    *(_integer(code) for code in _INTEGERS),
    *_bits(_BITS),
    st.tuples(_strings, st.booleans()).map(lambda t: _sized(0xA1, 0xB1, t[0].encode("utf-8"), t[1])),
    st.tuples(_symbols, st.booleans()).map(lambda t: _sized(0xA3, 0xB3, t[0].encode("ascii"), t[1])),
    st.tuples(st.binary(max_size=8), st.booleans()).map(lambda t: _sized(0xA0, 0xB0, t[0], t[1])),
)
_not_ascii_text = st.tuples(st.text(max_size=5), st.characters(min_codepoint=128, exclude_categories=["Cs"])).map(
    lambda t: t[0] + t[1]
)
# and what they should not, or rarely do
_odd_values = st.one_of(
    _not_ascii_text.map(lambda t: _sized(0xA3, 0xB3, t.encode())),
    st.binary(min_size=1, max_size=6).map(lambda b: _sized(0xA3, 0xB3, b)),  # a symbol, not even UTF-8
    st.binary(min_size=1, max_size=6).map(lambda b: _sized(0xA1, 0xB1, b)),  # a string, maybe not UTF-8
    *_bits(_RARE_BITS),
    amqp_values.map(encode_value),  # lists, maps, described values
    st.integers(1, 3).map(lambda n: encode_value(proton.Array(proton.UNDESCRIBED, proton.Data.INT, *range(n)))),
)
_names = st.sampled_from(["x-opt-partition-key", "x-opt-scheduled-enqueue-time", "x-opt-other", "k"])
_named = st.tuples(_names, st.sampled_from([(0xA1, 0xB1), (0xA3, 0xB3)])).map(lambda t: _sized(*t[1], t[0].encode()))
_ascii_keys = st.tuples(_symbols, st.sampled_from([(0xA1, 0xB1), (0xA3, 0xB3)]), st.booleans())
_not_ascii = _not_ascii_text.map(lambda t: _sized(0xA1, 0xB1, t.encode()))
_application_keys = st.one_of(  # strings and symbols
    st.tuples(_strings, st.booleans()).map(lambda t: _sized(0xA1, 0xB1, t[0].encode("utf-8"), t[1])),
    _ascii_keys.map(lambda t: _sized(*t[1], t[0].encode("ascii"), t[2])),
    _named,
)
_annotation_keys = st.one_of(  # symbols, ulongs, and strings (made symbols, so ASCII too)
    _named,
    _named,
    _ascii_keys.map(lambda t: _sized(*t[1], t[0].encode("ascii"), t[2])),
    _integer(0x53),
    _integer(0x80),
    st.just(b"\x44"),
)


# each wrong in one map or the other, or in both; a third of them non-ASCII strings (one_of would flatten the
# alternatives and give each of its dozens of branches the same weight)
_odd_keys = st.sampled_from([_odd_values, _plain_values, _not_ascii]).flatmap(lambda kind: kind)


_ODD_PLACES = ("header", "annotation key", "annotation value", "properties", "key", "value", "a section twice")


@st.composite
def plain_messages(draw: Any) -> bytes:
    """A message as applications send one (header, annotations, properties, application properties, data
    sections), every field a plain value of any type (what the fast path reads), and in half of them one odd
    key or value (a symbol that is not ASCII, a string that is not UTF-8, a char, a decimal, a compound or
    described value, a key of another type) or a section twice."""
    odd = draw(st.sampled_from(_ODD_PLACES)) if draw(st.booleans()) else None

    def count(*places: str, most: int) -> int:
        return int(draw(st.integers(1 if odd in places else 0, most)))

    def items(
        place: str, count: int, plain: st.SearchStrategy[bytes], unusual: st.SearchStrategy[bytes]
    ) -> list[bytes]:
        """``count`` items for ``place``, one of them from ``unusual`` if the odd one goes there."""
        at = draw(st.integers(0, count - 1)) if odd == place and count else -1
        return [bytes(draw(unusual if i == at else plain)) for i in range(count)]

    out: list[bytes] = []

    def maybe_map(code: int, where: str, keys: st.SearchStrategy[bytes]) -> None:
        if draw(st.booleans()) or odd in (f"{where}key", f"{where}value"):
            pairs = count(f"{where}key", f"{where}value", most=4)
            keys_, values = (
                items(f"{where}key", pairs, keys, _odd_keys),
                items(f"{where}value", pairs, _plain_values, _odd_values),
            )
            flat = [x for pair in zip(keys_, values, strict=True) for x in pair]
            out.append(bytes((0, 0x53, code)) + _compound(0xC1, 0xD1, flat, draw(st.booleans())))

    if draw(st.booleans()) or odd == "header":
        fields = items("header", count("header", most=6), st.one_of(st.just(b"\x40"), _plain_values), _odd_values)
        out.append(b"\x00\x53\x70" + (_compound(0xC0, 0xD0, fields, draw(st.booleans())) if fields else b"\x45"))
    maybe_map(0x72, "annotation ", _annotation_keys)
    if draw(st.booleans()) or odd == "properties":
        texts = st.tuples(_strings, st.booleans()).map(lambda t: _sized(0xA1, 0xB1, t[0].encode("utf-8"), t[1]))
        fields = items("properties", count("properties", most=13), st.one_of(st.just(b"\x40"), texts), _plain_values)
        out.append(b"\x00\x53\x73" + _compound(0xC0, 0xD0, fields, draw(st.booleans())))
    maybe_map(0x74, "", _application_keys)
    out += [b"\x00\x53\x75" + encode_value(d) for d in draw(st.lists(st.binary(max_size=20), min_size=1, max_size=2))]
    if odd == "a section twice":
        out.insert(draw(st.integers(0, len(out))), draw(st.sampled_from(out)))
    return b"".join(out)


def _a_number_key_merged_into_a_ulong_key(wire: bytes) -> bool:
    """The message annotations hold a key of a number type other than ulong (a ubyte, a long, a boolean, a
    float...) equal to a ulong key before it. proton's map is a Python dict, which took the two for one key and
    kept the first, so the round trip never checked the second and let it through; the fast path refuses it, as
    it refuses that key alone (annotation keys are symbols or ulongs, AMQP 1.0, 3.2.10): the one deliberate
    difference."""
    section = next(s for s in codec.split_sections(wire) if s.code == codec.MESSAGE_ANNOTATIONS)
    view = memoryview(section.raw)[3:]
    spans = Reader(view).map_spans()
    keys = [decode(view, start, end)[0] for start, end in spans[0::2]]
    ulongs = set()
    for key in keys:
        if isinstance(key, proton.ulong):
            ulongs.add(int(key))
        elif isinstance(key, int | float) and key in ulongs:
            return True
    return False


def _outcome(decoder: Any, wire: bytes) -> str:
    try:
        return repr(decoder(wire))  # every field, with its type (1 and True, "1" and 1 differ)
    except InvalidArgumentError:
        return "refused"


@FUZZ
@given(plain_messages())
def test_the_fast_decoder_accepts_and_refuses_what_the_proton_round_trip_did(wire: bytes) -> None:
    """``codec._decode_fast`` reads the header, annotations and application properties itself and validates
    them; the general path decodes them with proton and encodes them again with proton (``_check_reencodable``)
    as the codec always did. On every message the fast path does not hand over (``Unusual``) the two agree:
    the same message with the same field types, or both refuse it."""
    try:
        fast = _outcome(codec._decode_fast, wire)
    except codec.Unusual:
        event("left to the general path")
        return
    event("refused" if fast == "refused" else "decoded")
    general = _outcome(codec.decode_message_general, wire)
    if fast == "refused" and general != "refused" and _a_number_key_merged_into_a_ulong_key(wire):
        event("refused, as the proton round trip did not (a number key equal to a ulong key before it)")
        return
    assert fast == general
    if fast != "refused":
        _judge(wire, 0)  # and it can be delivered again
