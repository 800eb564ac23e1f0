"""oncebus's AMQP engine behind the frame scanner, as a connection drives it, fed generated frame sequences.

``tests/fuzz/test_fuzz_wire.py`` throws mutated SDK sessions at ``serve`` (whose engine this is); this one is
in-process and fast, so it runs many more examples: a well-formed session prefix (SASL, open, begin, a
sender and a receiver link with credit) followed by generated performatives with generated fields on
plausible channels and handles, mixed with valid transfers, flows and dispositions. Whatever arrives: the
scanner refuses it (a ``FrameError``, which the connection answers with a close) or the engine takes it
without raising, its output is whole frames, and once its output ends (a close) it stays ended.
"""

from __future__ import annotations

import os
import struct
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oncebus.amqp import engine, events
from oncebus.amqp.encoding import Reader
from oncebus.amqp.frames import FrameError, disposition_fields
from tests.amqp.raw import AMQP_HEADER, SASL_HEADER, attach_frame, flow_frame, frame, open_frame, transfer_frame
from tests.fuzz.mutations import amqp_values, encode_value, performative

EXAMPLES = int(os.environ.get("ONCEBUS_FUZZ_ENGINE_EXAMPLES", "400"))


def _prefix() -> bytes:
    from azure.servicebus._pyamqp.performatives import BeginFrame, SASLInit

    return (
        SASL_HEADER
        + frame(SASLInit(b"ANONYMOUS", None, None), frame_type=b"\x01")
        + AMQP_HEADER
        + open_frame()
        + frame(BeginFrame(None, 0, 65536, 65536, 64, None, None, None))
        + attach_frame("s", 0, "q", sender=True)
        + attach_frame("r", 1, "q", sender=False)
        + flow_frame(1, 10)
    )


_field = st.one_of(amqp_values.map(encode_value), st.sampled_from([b"\x40", b"\x43", b"\x52\x01", b"\x41", b"\x42"]))
_generated = st.builds(
    lambda code, fields, channel: performative(code, fields, channel),
    st.integers(0x10, 0x18),
    st.lists(_field, max_size=12),
    st.sampled_from([0, 0, 0, 1, 7]),
)
_valid = st.one_of(
    st.builds(
        lambda i, more: transfer_frame(
            0, b"\x00\x53\x75\xa0\x01x", delivery_id=i, delivery_tag=bytes([i % 256]), message_format=0, more=more
        ),
        st.integers(0, 20),
        st.booleans(),
    ),
    st.builds(lambda credit: flow_frame(1, credit), st.integers(0, 5)),
    st.builds(lambda h: attach_frame(f"l{h}", h, "q", sender=bool(h % 2)), st.integers(0, 4)),
)
_frames = st.lists(st.one_of(_generated, _valid), min_size=1, max_size=12)


def _whole_frames(data: bytes) -> None:
    pos = 0
    while pos < len(data):
        if data[pos : pos + 4] == b"AMQP":
            pos += 8
            continue
        (size,) = struct.unpack_from(">I", data, pos)
        assert size >= 8 and pos + size <= len(data), "the engine wrote a frame cut short"
        pos += size


def _serve(conn: engine.Connection, collector: engine.Collector, sent: list[engine.Delivery]) -> None:
    """What the connection's handlers do, in short: open what is opened, answer what arrives."""
    while (event := collector.peek()) is not None:
        if isinstance(event, events.ConnectionOpened):
            conn.open()
        elif isinstance(event, events.SessionBegun):
            event.session.open()
        elif isinstance(event, events.LinkAttached):
            link = event.link
            link.source.copy(link.remote_source)
            link.target.copy(link.remote_target)
            link.open()
            if link.is_receiver:
                link.flow(5)
        elif isinstance(event, events.LinkFlow) and event.link.is_sender:
            link = event.link
            while link.credit > 0:
                sent.append(link.delivery(b"t%d" % len(sent)))
                link.send(b"\x00\x53\x75\xa0\x01y")
                link.advance()
        elif isinstance(event, events.DeliveryChanged):
            delivery = event.delivery
            if delivery.link.is_receiver and not delivery.partial:
                delivery.link.recv(1 << 20)
                delivery.update(engine.ACCEPTED)
                delivery.settle()
            elif delivery.link.is_sender:
                delivery.update(engine.ACCEPTED)
                delivery.settle()
        elif isinstance(event, events.LinkDetached):
            event.link.close()
        elif isinstance(event, events.SessionEnded):
            event.session.close()
        elif isinstance(event, events.ConnectionClosed):
            conn.close()
        collector.pop()


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=os.environ.get("ONCEBUS_FUZZ_RANDOM") != "1",
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(_frames, st.integers(1, 64))
def test_the_engine_takes_any_frames_the_scanner_lets_through(frames: list[bytes], chunk: int) -> None:
    conn = engine.Connection()
    scanner = conn.scanner
    collector = engine.Collector()
    conn.collect(collector)
    sent: list[engine.Delivery] = []
    data = _prefix() + b"".join(frames)
    ended = False
    for start in range(0, len(data), chunk * 16):
        try:
            passed = scanner.feed(data[start : start + chunk * 16])
        except FrameError:
            return  # the scanner refused it: the connection closes with its condition
        conn.receive(passed)
        _serve(conn, collector, sent)
        out: Any = conn.take_output()
        _whole_frames(out)
        if ended:
            assert out == b"", "the engine wrote after its output ended"
        if conn.pending() == -1:
            ended = True
    assert len(conn.links) <= 64


_USUAL_FIELDS = [
    b"\x40",
    b"\x41",
    b"\x42",
    b"\x56\x01",
    b"\x56\x00",
    b"\x56\x02",
    b"\x43",
    b"\x52\x07",
    b"\x70\x00\x01\x00\x00",
    b"\x53\x07",
]
_STATES = [b"\x00\x53\x24\x45", b"\x00\x53\x24\xc0\x01\x00", b"\x00\x53\x26\x45", b"\x00\x53\x25\xc0\x02\x01\x40"]
_disposition_field = st.one_of(st.sampled_from([*_USUAL_FIELDS, *_STATES]), amqp_values.map(encode_value))


def _disposition(fields: list[bytes], short: bool) -> bytes:
    """A disposition's body (descriptor and list), its list as list8 (``short``, when it fits) or list32."""
    inner = b"".join(fields)
    if short and len(inner) < 255 and len(fields) < 256:
        return b"\x00\x53\x15\xc0" + bytes((len(inner) + 1, len(fields))) + inner
    return performative(0x15, fields, 0)[8:]


@settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(
    st.one_of(
        st.lists(st.sampled_from([*_USUAL_FIELDS, *_STATES]), max_size=7),  # mostly the fast path's shapes
        st.lists(_disposition_field, max_size=8),
    ),
    st.booleans(),
    st.binary(max_size=2),
)
def test_the_disposition_fast_path_reads_what_the_general_decoder_reads(
    fields: list[bytes], short: bool, tail: bytes
) -> None:
    """``disposition_fields`` (the SDKs' usual completions) answers None or exactly what the general
    decoder gives for the same bytes; garbage after the list sends it to the general decoder."""
    body = _disposition(fields, short) + tail
    fast = disposition_fields(memoryview(body))  # never raises
    if fast is None:
        return
    reader = Reader(memoryview(body))
    reader.pos = 3
    general = reader.list_fields(6)
    assert fast == general
    assert [isinstance(value, bool) for value in fast] == [isinstance(value, bool) for value in general]


def test_the_python_sdks_completion_takes_the_fast_path() -> None:
    from azure.servicebus._pyamqp._encode import encode_frame
    from azure.servicebus._pyamqp.outcomes import Accepted
    from azure.servicebus._pyamqp.performatives import DispositionFrame

    _, body = encode_frame(
        DispositionFrame(role=True, first=5, last=None, settled=True, state=Accepted(), batchable=None)
    )
    fields = disposition_fields(memoryview(bytes(body)))
    assert fields is not None and fields[:4] == [True, 5, None, True]
    assert engine.Disposition().decode(fields[4]) == engine.ACCEPTED


def test_the_usual_completion_takes_the_fast_path() -> None:
    for short in (True, False):
        for state in _STATES[:2]:
            body = _disposition([b"\x41", b"\x52\x05", b"\x52\x05", b"\x41", state, b"\x42"], short)
            fields = disposition_fields(memoryview(body))
            assert fields is not None and fields[:4] == [True, 5, 5, True]
            assert engine.Disposition().decode(fields[4]) == engine.ACCEPTED
        assert disposition_fields(memoryview(_disposition([b"\x41", b"\x52\x05", _STATES[2]], short))) is None


def test_a_disposition_cut_short_goes_to_the_general_decoder() -> None:
    for body in (
        b"\x00\x53\x15",
        b"\x00\x53\x15\xc0\x02\x01\x70",
        b"\x00\x53\x15\xd0\x00\x00",
        b"\x00\x53\x15\xc0\x02\x01\x52",
    ):
        assert disposition_fields(memoryview(body)) is None
