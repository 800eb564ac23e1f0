"""Hypothesis strategies: AMQP values, generated performatives, and mutations of recorded frames."""

from __future__ import annotations

import struct
from typing import Any

import proton
from hypothesis import strategies as st

from oncebus.amqp.encoding import DecodeError, Reader
from tests.fuzz.sessions import Write

_ASCII = st.characters(min_codepoint=32, max_codepoint=126)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.builds(proton.ulong, st.integers(0, 2**64 - 1)),
    st.builds(proton.uint, st.integers(0, 2**32 - 1)),
    st.builds(proton.int32, st.integers(-(2**31), 2**31 - 1)),
    st.builds(proton.timestamp, st.integers(-(2**62), 2**62)),
    st.floats(allow_nan=True),
    st.binary(max_size=48),
    st.text(max_size=48),
    st.builds(proton.symbol, st.text(_ASCII, max_size=32)),
    st.uuids(),
)
_keys = st.one_of(st.builds(proton.symbol, st.text(_ASCII, max_size=24)), st.text(max_size=16), st.binary(max_size=8))

amqp_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=6),
        st.dictionaries(_keys, children, max_size=4),
        st.builds(proton.Described, st.builds(proton.ulong, st.integers(0, 0x80)), children),
    ),
    max_leaves=24,
)


def encode_value(value: Any) -> bytes:
    data = proton.Data()
    data.put_object(value)
    return bytes(data.encode())


def nested(depth: int) -> bytes:
    value = b"\x45"
    for _ in range(depth):
        value = b"\xd0" + struct.pack(">II", len(value) + 4, 1) + value
    return value


def performative(code: int, fields: list[bytes], channel: int, frame_type: int = 0) -> bytes:
    body = b"".join(fields)
    listed = b"\xd0" + struct.pack(">II", len(body) + 4, len(fields)) + body
    perf = bytes((0x00, 0x53, code)) + listed
    return struct.pack(">IBBH", 8 + len(perf), 2, frame_type, channel) + perf


_index = st.integers(0, 10**6)
_SERVICE_BUS_KEYS = [
    "x-opt-partition-key",
    "x-opt-scheduled-enqueue-time",
    "x-opt-enqueued-time",
    "x-opt-sequence-number",
    "x-opt-locked-until",
    "x-opt-via-partition-key",
]
# a message's sections: header (5 fields), properties (13), annotations and application properties (maps), a value body
section_mutations = st.one_of(
    st.tuples(st.just("section"), _index, st.just(0x70), st.integers(0, 4), amqp_values.map(encode_value), st.none()),
    st.tuples(st.just("section"), _index, st.just(0x73), st.integers(0, 12), amqp_values.map(encode_value), st.none()),
    st.tuples(
        st.just("section"),
        _index,
        st.just(0x72),
        st.just(0),
        amqp_values.map(encode_value),
        st.one_of(st.sampled_from(_SERVICE_BUS_KEYS).map(proton.symbol), _keys).map(encode_value),
    ),
    st.tuples(
        st.just("section"), _index, st.just(0x74), st.just(0), amqp_values.map(encode_value), _keys.map(encode_value)
    ),
    st.tuples(st.just("section"), _index, st.just(0x77), st.just(0), amqp_values.map(encode_value), st.none()),
)
frame_mutations = st.one_of(
    st.tuples(st.just("flip"), _index, st.integers(0, 4096), st.integers(1, 255)),
    st.tuples(st.just("truncate"), _index, st.integers(0, 4096)),
    st.tuples(st.just("drop"), _index),
    st.tuples(st.just("duplicate"), _index),
    st.tuples(st.just("swap"), _index, _index),
    st.tuples(st.just("insert"), _index, st.binary(min_size=1, max_size=64)),
    st.tuples(
        st.just("size"),
        _index,
        st.one_of(
            st.sampled_from([0, 4, 7, 8, 9, 511, 512, 513, 65535, 65536, 65537, 2**31]), st.integers(0, 2**32 - 1)
        ),
    ),
    st.tuples(st.just("doff"), _index, st.integers(0, 255)),
    st.tuples(st.just("field"), _index, st.integers(0, 14), amqp_values.map(encode_value)),
    st.tuples(st.just("nest"), _index, st.integers(0, 14), st.integers(30, 4000)),
    st.tuples(st.just("inflate"), _index, st.integers(2, 400)),
    st.tuples(
        st.just("generate"),
        _index,
        st.integers(0x10, 0x18),
        st.lists(amqp_values.map(encode_value), max_size=14),
        st.integers(0, 3),
    ),
)
mutations = st.one_of(frame_mutations, section_mutations)  # half of them aimed at the messages


def _replace_field(piece: bytes, index: int, value: bytes) -> bytes:
    """``piece`` (a frame) with field ``index`` of its performative replaced (unchanged if it cannot be read)."""
    if len(piece) < 12 or piece[:4] == b"AMQP":
        return piece
    doff = piece[4] * 4
    try:
        reader = Reader(memoryview(piece)[doff:])
        reader.descriptor()
        list_at = reader.pos
        spans = reader.field_spans()
    except (DecodeError, IndexError, ValueError):
        return piece
    fields = [piece[doff + a : doff + b] for a, b in spans]
    fields += [b"\x40"] * (index + 1 - len(fields))
    fields[index] = value
    body = b"".join(fields)
    listed = b"\xd0" + struct.pack(">II", len(body) + 4, len(fields)) + body
    rest = piece[doff + reader.pos :]
    out = piece[4:doff] + piece[doff : doff + list_at] + listed + rest
    return struct.pack(">I", 4 + len(out)) + out


def _split_payload(piece: bytes) -> tuple[bytes, bytes] | None:
    """(frame up to the end of its transfer performative, payload) of a transfer frame, else None."""
    if len(piece) < 12 or piece[:4] == b"AMQP":
        return None
    doff = piece[4] * 4
    try:
        reader = Reader(memoryview(piece)[doff:])
        if reader.descriptor() != 0x14:
            return None
        reader.skip()
    except (DecodeError, IndexError, ValueError):
        return None
    end = doff + reader.pos
    return piece[:end], piece[end:]


def _sections(payload: bytes) -> list[tuple[int, bytes]] | None:
    out = []
    position = 0
    try:
        while position < len(payload):
            reader = Reader(memoryview(payload)[position:])
            code = reader.descriptor()
            reader.skip()
            out.append((code or 0, payload[position : position + reader.pos]))
            position += reader.pos
    except (DecodeError, IndexError, ValueError):
        return None
    return out


def _mutate_section(piece: bytes, code: int, index: int, value: bytes, key: bytes | None) -> bytes:
    """A transfer's message with a field of section ``code`` replaced (a map section gains ``key: value``)."""
    split = _split_payload(piece)
    if split is None:
        return piece
    head, payload = split
    sections = _sections(payload)
    if sections is None:
        return piece
    found = [i for i, (c, _) in enumerate(sections) if c == code]
    if code in (0x70, 0x73):  # header, properties: lists
        fields: list[bytes] = []
        if found:
            raw = sections[found[0]][1]
            try:
                reader = Reader(memoryview(raw))
                reader.descriptor()
                fields = [raw[a:b] for a, b in reader.field_spans()]
            except (DecodeError, IndexError, ValueError):
                return piece
        fields += [b"\x40"] * (index + 1 - len(fields))
        fields[index] = value
        body = b"".join(fields)
        section = bytes((0, 0x53, code)) + b"\xd0" + struct.pack(">II", len(body) + 4, len(fields)) + body
    elif code in (0x72, 0x74):  # message annotations, application properties: maps
        body = (key or b"\x40") + value
        section = bytes((0, 0x53, code)) + b"\xd1" + struct.pack(">II", len(body) + 4, 2) + body
    else:  # an amqp-value body
        section = bytes((0, 0x53, code)) + value
    if found:
        sections[found[0]] = (code, section)
    else:
        sections.insert(0 if code < 0x75 else len(sections), (code, section))
    frame = head + b"".join(raw for _, raw in sections)
    return struct.pack(">I", len(frame)) + frame[4:]


def apply(writes: list[Write], ops: list[tuple[Any, ...]]) -> list[Write]:
    """The recorded writes with ``ops`` applied to their pieces."""
    flat: list[tuple[int, bytes]] = [(w, piece) for w, write in enumerate(writes) for piece in write.pieces]
    for op in ops:
        if not flat:
            break
        kind, at = op[0], op[1] % len(flat)
        if kind == "section":  # aimed at the transfers (the messages) only
            transfers = [i for i, (_, p) in enumerate(flat) if _split_payload(p) is not None]
            if not transfers:
                continue
            at = transfers[op[1] % len(transfers)]
        w, piece = flat[at]
        if kind == "flip" and piece:
            i = op[2] % len(piece)
            flat[at] = (w, piece[:i] + bytes((piece[i] ^ op[3],)) + piece[i + 1 :])
        elif kind == "truncate":
            flat[at] = (w, piece[: op[2] % (len(piece) + 1)])
        elif kind == "drop":
            del flat[at]
        elif kind == "duplicate":
            flat.insert(at, (w, piece))
        elif kind == "swap":
            other = op[2] % len(flat)
            flat[at], flat[other] = (w, flat[other][1]), (flat[other][0], piece)
        elif kind == "insert":
            flat.insert(at, (w, op[2]))
        elif kind == "size" and len(piece) >= 4 and piece[:4] != b"AMQP":
            flat[at] = (w, struct.pack(">I", op[2]) + piece[4:])
        elif kind == "doff" and len(piece) >= 5 and piece[:4] != b"AMQP":
            flat[at] = (w, piece[:4] + bytes((op[2],)) + piece[5:])
        elif kind == "field":
            flat[at] = (w, _replace_field(piece, op[2], op[3]))
        elif kind == "nest":
            flat[at] = (w, _replace_field(piece, op[2], nested(op[3])))
        elif kind == "inflate" and len(piece) > 8 and piece[:4] != b"AMQP":
            body = piece[8:] * op[2]
            flat[at] = (w, struct.pack(">I", 8 + len(body)) + piece[4:8] + body)
        elif kind == "section":
            flat[at] = (w, _mutate_section(piece, op[2], op[3], op[4], op[5]))
        elif kind == "generate":
            flat.insert(at, (w, performative(op[2], op[3], op[4])))
    regrouped: list[Write] = [Write([], writes[i].answered) for i in range(len(writes))]
    for w, piece in flat:
        regrouped[w].pieces.append(piece)
    return [write for write in regrouped if write.pieces]
