"""oncebus's own AMQP engine (oncebus.amqp.engine), driven frame by frame with the SDK's own codec.

The SDK-level suites (tests/amqp, tests/js, tests/fuzz) run against whichever engine ``serve`` uses; these
tests pin what the engine itself promises: proton's numbers (the handlers compare with proton's constants),
every performative with all its fields, deliveries split to the client's max-frame-size, one disposition per
run of equal outcomes, a transfer sent settled when the delivery was settled before it went out, credit
respected, and events put once as proton's collector puts them.
"""

from __future__ import annotations

import struct
from typing import Any

import proton
from azure.servicebus._pyamqp._decode import decode_frame
from azure.servicebus._pyamqp.outcomes import Accepted
from azure.servicebus._pyamqp.performatives import (
    BeginFrame,
    CloseFrame,
    DetachFrame,
    DispositionFrame,
    EndFrame,
    OpenFrame,
    SASLInit,
)

from oncebus.amqp import engine, events
from tests.amqp.raw import (
    AMQP_HEADER,
    ATTACH,
    BEGIN,
    CLOSE,
    DETACH,
    DISPOSITION,
    END,
    FLOW,
    OPEN,
    SASL_HEADER,
    TRANSFER,
    attach_frame,
    flow_frame,
    frame,
    open_frame,
    transfer_frame,
)

FULL = {OPEN: 10, BEGIN: 8, ATTACH: 14, FLOW: 11, TRANSFER: 11, DISPOSITION: 6, DETACH: 3, END: 1, CLOSE: 1}


def frames(data: bytes) -> list[tuple[int, int, list[Any], bytes]]:
    """(channel, performative, fields, payload) of every AMQP frame in ``data`` (headers skipped)."""
    out = []
    pos = 0
    while pos < len(data):
        if data[pos : pos + 4] == b"AMQP":
            pos += 8
            continue
        size, doff, frame_type, channel = struct.unpack_from(">IBBH", data, pos)
        body = memoryview(data)[pos + doff * 4 : pos + size]
        pos += size
        if not body or frame_type != 0:
            continue
        code, fields = decode_frame(body)
        payload = b""
        if code == TRANSFER:
            payload = bytes(fields.pop()) if len(fields) > 11 else b""
        out.append((channel, code, fields, payload))
    return out


class Harness:
    """One engine connection with a handler that opens what the client opens."""

    def __init__(self, max_frame_size: int = 65536) -> None:
        self.conn = engine.Connection()
        self.collector = engine.Collector()
        self.conn.collect(self.collector)
        self.events: list[engine.Event] = []
        self.client_max_frame = max_frame_size

    def feed(self, data: bytes) -> list[tuple[int, int, list[Any], bytes]]:
        self.conn.receive_data(data)
        self.dispatch()
        return frames(self.conn.take_output())

    def dispatch(self) -> None:  # what AmqpConnection._handle does, in short
        while (event := self.collector.peek()) is not None:
            self.events.append(event)
            if isinstance(event, events.ConnectionOpened):
                self.conn.open()
            elif isinstance(event, events.SessionBegun):
                event.session.open()
            elif isinstance(event, events.LinkAttached):
                link = event.link
                assert link is not None
                link.source.copy(link.remote_source)
                link.target.copy(link.remote_target)
                link.open()
                if link.is_receiver:
                    link.flow(10)
            elif isinstance(event, events.LinkDetached):
                event.link.close()
            elif isinstance(event, events.SessionEnded):
                event.session.close()
            elif isinstance(event, events.ConnectionClosed):
                self.conn.close()
            self.collector.pop()

    def start(self) -> list[tuple[int, int, list[Any], bytes]]:
        opened = self.feed(AMQP_HEADER + open_frame(max_frame_size=self.client_max_frame))
        assert [f[1] for f in opened] == [OPEN]
        begun = self.feed(frame(BeginFrame(None, 0, 5000, 5000, 64, None, None, None)))
        assert [f[1] for f in begun] == [BEGIN]
        return opened + begun


def test_proton_numbers() -> None:
    assert (engine.LOCAL_UNINIT, engine.LOCAL_ACTIVE, engine.LOCAL_CLOSED) == (
        proton.Endpoint.LOCAL_UNINIT,
        proton.Endpoint.LOCAL_ACTIVE,
        proton.Endpoint.LOCAL_CLOSED,
    )
    assert (engine.REMOTE_UNINIT, engine.REMOTE_ACTIVE, engine.REMOTE_CLOSED) == (
        proton.Endpoint.REMOTE_UNINIT,
        proton.Endpoint.REMOTE_ACTIVE,
        proton.Endpoint.REMOTE_CLOSED,
    )
    assert (engine.SND_UNSETTLED, engine.SND_SETTLED, engine.SND_MIXED) == (
        proton.Link.SND_UNSETTLED,
        proton.Link.SND_SETTLED,
        proton.Link.SND_MIXED,
    )
    assert (engine.RCV_FIRST, engine.RCV_SECOND) == (proton.Link.RCV_FIRST, proton.Link.RCV_SECOND)
    assert (engine.ACCEPTED, engine.REJECTED, engine.RELEASED, engine.MODIFIED) == (
        proton.Delivery.ACCEPTED,
        proton.Delivery.REJECTED,
        proton.Delivery.RELEASED,
        proton.Delivery.MODIFIED,
    )
    assert (engine.UNSPECIFIED, engine.SOURCE, engine.TARGET, engine.COORDINATOR) == (
        proton.Terminus.UNSPECIFIED,
        proton.Terminus.SOURCE,
        proton.Terminus.TARGET,
        proton.Terminus.COORDINATOR,
    )


def test_sasl_anonymous_then_amqp() -> None:
    conn = engine.Connection()
    conn.receive_data(SASL_HEADER)
    out = conn.take_output()
    assert out.startswith(SASL_HEADER) and b"ANONYMOUS" in out
    init = frame(SASLInit(b"ANONYMOUS", None, None), frame_type=b"\x01")
    conn.receive_data(init)
    outcome = conn.take_output()
    assert outcome[8:11] == b"\x00\x53\x44" and outcome.endswith(b"\x50\x00")  # code ok
    conn.receive_data(AMQP_HEADER)
    assert conn.take_output() == AMQP_HEADER


def test_every_performative_has_all_its_fields() -> None:
    h = Harness()
    out = h.start()
    out += h.feed(attach_frame("s", 0, "q", sender=True))
    out += h.feed(attach_frame("r", 1, "q", sender=False))
    out += h.feed(flow_frame(1, 5))
    receiver = next(link for link in h.conn.links if link.is_sender)
    receiver.delivery(b"t1")
    receiver.send(b"\x00\x53\x75\xa0\x01x")
    receiver.advance()
    out += frames(h.conn.take_output())
    out += h.feed(transfer_frame(0, b"\x00\x53\x75\xa0\x01y", delivery_id=0, delivery_tag=b"a", message_format=0))
    last = h.events[-1]
    assert isinstance(last, events.DeliveryChanged)
    sender_delivery = last.delivery
    sender_delivery.update(engine.ACCEPTED)
    sender_delivery.settle()
    out += frames(h.conn.take_output())
    out += h.feed(frame(DetachFrame(0, True, None)))
    out += h.feed(frame(EndFrame(None)))
    out += h.feed(frame(CloseFrame(None)))
    codes = {code for _, code, _, _ in out}
    assert codes == set(FULL)
    for _, code, fields, _ in out:
        assert len(fields) == FULL[code], (code, fields)
    assert h.conn.pending() == -1  # both closes done: the output ends


def test_attach_answer_echoes_the_termini_and_opposite_role() -> None:
    h = Harness()
    h.start()
    out = h.feed(attach_frame("r", 3, "queue-a", sender=False))
    attach = next(fields for _, code, fields, _ in out if code == ATTACH)
    assert attach[0] == b"r" and attach[1] == 0  # our handle, not the client's
    assert attach[2] is False  # we send on it
    assert attach[5][0] == b"queue-a"  # source echoed
    assert attach[9] == 0  # initial-delivery-count of a sender


def test_a_delivery_is_split_to_the_clients_max_frame_size() -> None:
    h = Harness(max_frame_size=512)
    h.start()
    h.feed(attach_frame("r", 0, "q", sender=False))
    h.feed(flow_frame(0, 1))
    link = h.conn.links[0]
    payload = bytes(range(256)) * 8  # 2 KiB
    link.delivery(b"tag")
    link.send(payload)
    link.advance()
    data = h.conn.take_output()
    out = frames(data)
    transfers = [f for f in out if f[1] == TRANSFER]
    assert len(transfers) > 4
    pos = 0
    while pos < len(data):
        (size,) = struct.unpack_from(">I", data, pos)
        assert size <= 512
        pos += size
    assert [f[2][5] for f in transfers] == [True] * (len(transfers) - 1) + [False]  # more until the last
    assert b"".join(f[3] for f in transfers) == payload


def test_credit_is_respected_and_a_settled_delivery_goes_out_settled() -> None:
    h = Harness()
    h.start()
    h.feed(attach_frame("r", 0, "q", sender=False))
    link = h.conn.links[0]
    delivery = link.delivery(b"a")
    link.send(b"\x00\x53\x75\xa0\x01x")
    link.advance()
    delivery.settle()  # before it was written: it goes out settled, no disposition follows
    assert [f for f in frames(h.conn.take_output()) if f[1] == TRANSFER] == []  # no credit yet
    out = h.feed(flow_frame(0, 1))
    transfers = [f for f in out if f[1] == TRANSFER]
    assert len(transfers) == 1 and transfers[0][2][4] is True
    assert [f for f in out if f[1] == DISPOSITION] == []


def test_outcomes_of_a_run_of_deliveries_go_out_as_one_disposition() -> None:
    h = Harness()
    h.start()
    h.feed(attach_frame("s", 0, "q", sender=True))
    for i in range(5):
        h.feed(transfer_frame(0, b"\x00\x53\x75\xa0\x01y", delivery_id=i, delivery_tag=bytes([i]), message_format=0))
    deliveries = [e.delivery for e in h.events if isinstance(e, events.DeliveryChanged)]
    assert len(deliveries) == 5
    for d in deliveries:
        assert d is not None
        d.update(engine.ACCEPTED)
        d.settle()
    out = [f for f in frames(h.conn.take_output()) if f[1] == DISPOSITION]
    assert len(out) == 1
    fields = out[0][2]
    assert (fields[0], fields[1], fields[2], fields[3]) == (True, 0, 4, True)


def test_a_delivery_in_several_frames_is_one_event_when_read_at_once() -> None:
    h = Harness()
    h.start()
    h.feed(attach_frame("s", 0, "q", sender=True))
    data = transfer_frame(0, b"ab", delivery_id=0, delivery_tag=b"x", message_format=0, more=True)
    data += transfer_frame(0, b"cd", delivery_id=0, more=True)
    data += transfer_frame(0, b"ef", delivery_id=0)
    h.feed(data)
    deliveries = [e for e in h.events if isinstance(e, events.DeliveryChanged)]
    assert len(deliveries) == 1
    delivery = deliveries[0].delivery
    assert delivery is not None and not delivery.partial
    assert h.conn.links[0].recv(1024) == b"abcdef"


def test_the_clients_settlement_reaches_the_delivery() -> None:
    h = Harness()
    h.start()
    h.feed(attach_frame("r", 0, "q", sender=False))
    h.feed(flow_frame(0, 2))
    link = h.conn.links[0]
    sent = []
    for tag in (b"a", b"b"):
        sent.append(link.delivery(tag))
        link.send(b"\x00\x53\x75\xa0\x01x")
        link.advance()
    h.conn.take_output()
    h.feed(frame(DispositionFrame(True, 0, 1, True, Accepted(), None)))
    assert all(d.settled and d.remote_state == engine.ACCEPTED for d in sent)
    for d in sent:
        d.update(engine.ACCEPTED)
        d.settle()
    assert [f for f in frames(h.conn.take_output()) if f[1] == DISPOSITION] == []  # the client settled first


def test_a_frame_on_an_unknown_channel_closes_the_connection_with_an_error() -> None:
    h = Harness()
    h.start()
    out = h.feed(attach_frame("s", 0, "q", sender=True, channel=7))
    close = [f for f in out if f[1] == CLOSE]
    assert close and close[0][2][0][0] == b"amqp:connection:framing-error"
    assert h.conn.pending() == -1


def test_a_rejection_carries_its_condition_with_an_info_map() -> None:
    h = Harness()
    h.start()
    h.feed(attach_frame("s", 0, "q", sender=True))
    h.feed(transfer_frame(0, b"\x00\x53\x75\xa0\x01y", delivery_id=0, delivery_tag=b"a", message_format=0))
    last = h.events[-1]
    assert isinstance(last, events.DeliveryChanged)
    delivery = last.delivery
    delivery.local.condition = proton.Condition("amqp:not-found", "no such thing")
    delivery.update(engine.REJECTED)
    delivery.settle()
    (disposition,) = [f for f in frames(h.conn.take_output()) if f[1] == DISPOSITION]
    assert disposition[2][4] == {"rejected": [[b"amqp:not-found", b"no such thing", {}]]}  # with its info map


def test_an_empty_frame_keeps_the_clients_idle_timeout() -> None:
    conn = engine.Connection()
    conn.collect(engine.Collector())
    opened = OpenFrame("c", None, 65536, 255, 4000, None, None, None, None, None)  # idle-time-out 4 s
    conn.receive_data(AMQP_HEADER + frame(opened))
    conn.open()
    conn.take_output()
    conn.last_output = 100.0  # the connection notes when it last wrote
    assert conn.tick(100.5) == 102.0  # half the client's timeout after the last write
    assert not conn.has_output()
    assert conn.tick(102.0) == 104.0
    assert conn.take_output() == b"\x00\x00\x00\x08\x02\x00\x00\x00"  # an empty frame


def test_a_client_without_idle_timeout_gets_no_heartbeats() -> None:
    h = Harness()
    h.start()
    assert h.conn.tick(1e9) == 0.0 and not h.conn.has_output()


def test_a_second_attach_on_a_handle_in_use_closes_the_connection() -> None:
    h = Harness()
    h.start()
    h.feed(attach_frame("a", 5, "q", sender=True))
    out = h.feed(attach_frame("b", 5, "q", sender=True))
    (close,) = [f for f in out if f[1] == CLOSE]
    assert close[2][0][0] == b"amqp:session:handle-in-use"


def test_a_delivery_id_the_client_repeats_is_answered_under_that_id_each_time() -> None:
    """The SDK's renewer threads can put one delivery-id on two transfers (docs in oncebus.amqp.frames): the engine
    keeps both deliveries and answers each under the id the client gave it (no renumbering with this engine)."""
    h = Harness()
    h.start()
    h.feed(attach_frame("s", 0, "q", sender=True))
    h.feed(transfer_frame(0, b"\x00\x53\x75\xa0\x01a", delivery_id=7, delivery_tag=b"a", message_format=0))
    h.feed(transfer_frame(0, b"\x00\x53\x75\xa0\x01b", delivery_id=7, delivery_tag=b"b", message_format=0))
    h.feed(transfer_frame(0, b"\x00\x53\x75\xa0\x01c", delivery_id=3, delivery_tag=b"c", message_format=0))
    deliveries = [e.delivery for e in h.events if isinstance(e, events.DeliveryChanged)]
    assert [d.tag for d in deliveries if d is not None] == [b"a", b"b", b"c"]
    link = h.conn.links[0]
    for payload in (b"\x00\x53\x75\xa0\x01a", b"\x00\x53\x75\xa0\x01b", b"\x00\x53\x75\xa0\x01c"):
        assert link.recv(100) == payload  # read in the order they came
        link.advance()
    for d in deliveries:
        assert d is not None
        d.update(engine.ACCEPTED)
        d.settle()
    dispositions = [f[2][1:3] for f in frames(h.conn.take_output()) if f[1] == DISPOSITION]
    assert sorted(first for first, _ in dispositions) == [3, 7, 7]


def test_links_are_listed_by_state_as_proton_lists_them() -> None:
    """What /metrics counts (``oncebus_links_open``: links active on our side, read with proton's iteration)."""
    h = Harness()
    h.start()
    for handle in range(3):
        h.feed(attach_frame(f"l{handle}", handle, "q", sender=True))
    h.feed(frame(DetachFrame(1, True, None)))  # closed by the client and by us
    active: list[str] = []
    link = h.conn.link_head(engine.LOCAL_ACTIVE)
    while link is not None:
        active.append(link.name)
        link = link.next(engine.LOCAL_ACTIVE)
    assert active == ["l0", "l2"]


def _sent_unsettled(count: int) -> tuple[Harness, engine.Link, list[engine.Delivery], list[list[engine.Delivery]]]:
    """A started harness, a link the client receives on, ``count`` unsettled deliveries of ours written on it,
    and the calls its settler gets (each the deliveries of one call) from now on."""
    h = Harness()
    h.start()
    h.feed(attach_frame("r", 0, "q", sender=False))
    h.feed(flow_frame(0, count))
    link = h.conn.links[0]
    link.snd_settle_mode = engine.SND_UNSETTLED
    sent = [link.send_whole(bytes([i]), b"\x00\x53\x75\xa0\x01x") for i in range(count)]
    assert len([f for f in frames(h.conn.take_output()) if f[1] == TRANSFER]) == count
    calls: list[list[engine.Delivery]] = []
    link.settler = calls.append
    return h, link, sent, calls


def test_a_disposition_goes_to_its_links_settler_in_one_call_without_events() -> None:
    """The client's disposition of a range of ours reaches the link's settler straight from the frame: one call
    for the range, no event; the outcome said for all of them goes out as one disposition."""
    h, link, sent, calls = _sent_unsettled(4)
    before = len(h.events)
    h.feed(frame(DispositionFrame(True, 0, 2, False, Accepted(), None)))
    assert calls == [sent[:3]]
    assert h.events[before:] == []
    assert all(d.remote_state == engine.ACCEPTED and not d.settled for d in sent[:3])
    for delivery in sent[:3]:
        delivery.settle_as(engine.ACCEPTED)
    (out,) = [f for f in frames(h.conn.take_output()) if f[1] == DISPOSITION]
    assert out[2][:5] == [False, 0, 2, True, {"accepted": []}]
    assert set(link.session.outgoing) == {3}


def test_a_disposition_after_another_event_in_the_same_read_goes_as_an_event() -> None:
    """An event waiting (a flow read first) keeps the order: the disposition after it is an event too."""
    h, _, sent, calls = _sent_unsettled(2)
    before = len(h.events)
    h.feed(flow_frame(0, 5) + frame(DispositionFrame(True, 1, None, False, Accepted(), None)))
    assert calls == []
    assert [type(e) for e in h.events[before:]] == [events.LinkFlow, events.DeliveryChanged]
    assert h.events[-1] == events.DeliveryChanged(sent[1])
    assert sent[1].remote_state == engine.ACCEPTED
