"""The session and link state machines (``amqp/session_state.py``, ``amqp/link_state.py``) driven alone: no
socket, no engine, no connection. Performatives go in as the frame scanner reads the SDK codec's bytes; what comes
out is the typed event each call returns and the frames the session writes through its ``Wire``, decoded with the
SDK's codec. :class:`Wire` here is the least a connection must offer a session (the engine is the other one).
"""

from __future__ import annotations

from typing import Any

import pytest
from azure.servicebus._pyamqp.outcomes import Accepted
from azure.servicebus._pyamqp.performatives import BeginFrame, DetachFrame, DispositionFrame, EndFrame, FlowFrame

from oncebus.amqp.endpoints import ACCEPTED, LOCAL_CLOSED, REMOTE_ACTIVE, REMOTE_CLOSED, ProtocolError
from oncebus.amqp.frames import FrameScanner, Performative
from oncebus.amqp.link_state import Delivery, DeliveryChanged, Link, LinkAttached, LinkDetached, LinkFlow, SessionView
from oncebus.amqp.session_state import Session, SessionBegun, SessionEnded
from tests.amqp.raw import (
    AMQP_HEADER,
    ATTACH,
    BEGIN,
    DETACH,
    END,
    FLOW,
    TRANSFER,
    attach_frame,
    frame,
    open_frame,
    transfer_frame,
)
from tests.amqp.test_engine import frames

ACCEPTED_STATE = b"\x00\x53\x24\x45"


class Wire:
    """A connection as a session sees it: frames written in order, channels handed out, links to write."""

    def __init__(self, max_frame_size: int = 65536) -> None:
        self.scanner = FrameScanner()
        self.scanner.feed(AMQP_HEADER + open_frame())
        self.remote_max_frame_size = max_frame_size
        self.written: list[bytes] = []
        self.dirty: list[Link] = []
        self.disposed: list[Delivery] = []
        self.channels: set[int] = set()
        self.unlisted: list[Link] = []

    def _write(self, data: bytes) -> None:
        self.written.append(data)

    def _dirty(self, link: Link) -> None:
        self.dirty.append(link)

    def _disposed(self, delivery: Delivery) -> None:
        self.disposed.append(delivery)

    def _take_channel(self, session: SessionView) -> int:
        channel = min(set(range(len(self.channels) + 1)) - self.channels)
        self.channels.add(channel)
        return channel

    def _give_channel(self, channel: int) -> None:
        self.channels.discard(channel)

    def _unlist(self, link: Link) -> None:
        self.unlisted.append(link)

    def _link_after(self, link: Link | None, mask: int) -> Link | None:
        return None

    def read(self, data: bytes) -> list[Performative]:
        """The client's bytes as the frame scanner hands them to the engine."""
        return [f for f in self.scanner.feed(data) if isinstance(f, Performative)]

    def one(self, data: bytes) -> Performative:
        (performative,) = self.read(data)
        return performative

    def out(self) -> list[tuple[int, int, list[Any], bytes]]:
        """(channel, performative, fields, payload) of every frame written since the last look."""
        data, self.written = b"".join(self.written), []
        return frames(data)


def begun(wire: Wire, remote_channel: int = 3, next_outgoing_id: int = 100) -> Session:
    session = Session(wire, remote_channel)
    begin = wire.one(frame(BeginFrame(None, next_outgoing_id, 5000, 5000, 64, None, None, None), remote_channel))
    event = session.on_begin(begin.fields)
    assert event == SessionBegun(session)
    session.open()
    return session


def attached(wire: Wire, session: Session, name: str, handle: int, *, client_sends: bool) -> Link:
    attach = wire.one(attach_frame(name, handle, "q", sender=client_sends, channel=session.remote_channel))
    event = session.on_attach(attach.fields, attach.raw or [])
    assert isinstance(event, LinkAttached) and event.link is session.links[handle]
    link = event.link
    link.source.copy(link.remote_source)
    link.target.copy(link.remote_target)
    link.open()
    return link


def test_a_begin_is_answered_on_our_channel_with_the_clients_as_remote_channel() -> None:
    wire = Wire()
    session = begun(wire, remote_channel=3, next_outgoing_id=100)
    assert session.remote_bits == REMOTE_ACTIVE and session.next_incoming_id == 100
    assert session.remote_incoming_window == 5000
    ((channel, code, fields, _),) = wire.out()
    assert (channel, code) == (0, BEGIN) and session.channel == 0
    assert fields[0] == 3 and fields[1] == session.next_outgoing_id == 0 and len(fields) == 8
    second = begun(wire, remote_channel=4)
    assert second.channel == 1 and second.key != session.key


def test_an_attach_makes_a_link_of_the_opposite_role_on_the_lowest_free_handle() -> None:
    wire = Wire()
    session = begun(wire)
    wire.out()
    receiving = attached(wire, session, "in", 7, client_sends=True)
    sending = attached(wire, session, "out", 9, client_sends=False)
    assert receiving.is_receiver and sending.is_sender
    assert (receiving.remote_handle, receiving.handle, sending.remote_handle, sending.handle) == (7, 0, 9, 1)
    out = wire.out()
    assert [(f[0], f[1], f[2][1], f[2][2]) for f in out] == [(0, ATTACH, 0, True), (0, ATTACH, 1, False)]
    again = wire.one(attach_frame("again", 7, "q", sender=True, channel=3))
    with pytest.raises(ProtocolError) as refused:
        session.on_attach(again.fields, again.raw or [])
    assert refused.value.condition == "amqp:session:handle-in-use"
    with pytest.raises(ProtocolError) as broken:
        session.on_attach(["no-handle"], [])
    assert broken.value.condition == "amqp:decode-error"


def test_a_delivery_in_two_frames_counts_two_transfer_ids_one_delivery_and_is_answered_once() -> None:
    wire = Wire()
    session = begun(wire, next_outgoing_id=100)
    link = attached(wire, session, "in", 0, client_sends=True)
    link.flow(5)
    wire.out()
    first = wire.one(transfer_frame(0, b"abc", channel=3, delivery_id=100, delivery_tag=b"t", more=True))
    rest = wire.one(transfer_frame(0, b"def", channel=3, more=False))
    arrived = session.on_transfer(first)
    delivery = arrived.delivery
    assert delivery.partial and session.incoming == {100: delivery}
    assert session.on_transfer(rest) == DeliveryChanged(delivery)
    assert not delivery.partial and session.next_incoming_id == 102  # each frame takes a transfer-id
    assert (link.delivery_count, link.credit) == (1, 4)  # one delivery
    assert link.current is delivery and link.recv(1 << 20) == b"abcdef"
    delivery.update(ACCEPTED)
    delivery.settle()
    assert wire.disposed == [delivery, delivery] and link.current is None
    assert delivery.to_say() == ACCEPTED_STATE
    assert session.incoming == {}  # settled here: forgotten
    assert delivery.to_say() is None  # said once


def test_a_transfer_settled_by_the_client_is_not_kept_and_one_on_an_unknown_handle_is_refused() -> None:
    wire = Wire()
    session = begun(wire)
    attached(wire, session, "in", 0, client_sends=True)
    settled = wire.one(transfer_frame(0, b"x", channel=3, delivery_id=0, delivery_tag=b"a", settled=True))
    assert session.on_transfer(settled).delivery.settled and session.incoming == {}
    stray = Performative(3, TRANSFER, [5, 1, b"b", 0, False, False, None, None, None, None])
    with pytest.raises(ProtocolError) as refused:
        session.on_transfer(stray)
    assert refused.value.condition == "amqp:session:unattached-handle"


def test_credit_lets_advanced_deliveries_out_with_consecutive_ids_and_the_rest_wait() -> None:
    wire = Wire()
    session = begun(wire)
    link = attached(wire, session, "out", 0, client_sends=False)
    wire.out()
    sent = []
    for tag in (b"a", b"b", b"c"):
        sent.append(link.delivery(tag))
        link.send(b"payload-" + tag)
        assert link.advance()
    assert wire.dirty == [link]  # asked once to be written
    flow = wire.one(frame(FlowFrame(0, 5000, 0, 5000, 0, 0, 2, None, None, None, None), 3))
    assert session.on_flow(flow.fields) == LinkFlow(link)
    out: list[bytes] = []
    size = link.send_unsent(out)
    assert size == sum(map(len, out))
    transfers = frames(b"".join(out))
    assert [(f[1], f[2][1], f[2][2], f[3]) for f in transfers] == [
        (TRANSFER, 0, b"a", b"payload-a"),
        (TRANSFER, 1, b"b", b"payload-b"),
    ]
    assert (link.delivery_count, session.next_outgoing_id, len(link.unsent)) == (2, 2, 1)
    assert session.outgoing == {0: sent[0], 1: sent[1]}
    wire.dirty.clear()
    more = wire.one(frame(FlowFrame(0, 5000, 2, 5000, 0, 2, 1, None, None, None, None), 3))
    session.on_flow(more.fields)
    assert wire.dirty == [link] and link.available == 1
    out.clear()
    link.send_unsent(out)
    assert [f[2][1] for f in frames(b"".join(out))] == [2]


def test_a_delivery_is_split_to_the_clients_max_frame_size() -> None:
    wire = Wire(max_frame_size=512)
    session = begun(wire)
    link = attached(wire, session, "out", 0, client_sends=False)
    payload = bytes(range(256)) * 8
    link.delivery(b"big")
    link.send(payload)
    link.advance()
    session.on_flow(wire.one(frame(FlowFrame(0, 5000, 0, 5000, 0, 0, 1, None, None, None, None), 3)).fields)
    out: list[bytes] = []
    link.send_unsent(out)
    assert all(len(f) <= 512 for f in out) and len(out) > 4
    transfers = frames(b"".join(out))
    assert [f[2][5] for f in transfers] == [True] * (len(out) - 1) + [False]
    assert b"".join(f[3] for f in transfers) == payload and session.next_outgoing_id == 1


def test_the_clients_disposition_of_a_range_changes_each_delivery_and_settles_them() -> None:
    wire = Wire()
    session = begun(wire)
    link = attached(wire, session, "out", 0, client_sends=False)
    sent = []
    for tag in (b"a", b"b", b"c"):
        sent.append(link.delivery(tag))
        link.send(b"x")
        link.advance()
    session.on_flow(wire.one(frame(FlowFrame(0, 5000, 0, 5000, 0, 0, 3, None, None, None, None), 3)).fields)
    link.send_unsent([])
    for delivery in sent[:2]:
        delivery.settle()  # settled here first: the client's settlement forgets them
    disposition = wire.one(frame(DispositionFrame(True, 0, 1, True, Accepted(), None), 3))
    changed = session.on_disposition(disposition.fields)
    assert changed == [DeliveryChanged(sent[0]), DeliveryChanged(sent[1])]
    assert all(d.settled and d.remote_state == ACCEPTED for d in sent[:2])
    assert session.outgoing == {2: sent[2]}
    assert session.on_disposition(disposition.fields) == []  # nothing left in that range


def test_flow_echoes_and_drain() -> None:
    wire = Wire()
    session = begun(wire)
    link = attached(wire, session, "out", 0, client_sends=False)
    wire.out()
    echo = wire.one(frame(FlowFrame(0, 5000, 0, 5000, None, None, None, None, None, True, None), 3))
    assert session.on_flow(echo.fields) is None
    ((channel, code, fields, _),) = wire.out()
    assert (channel, code, fields[4], len(fields)) == (0, FLOW, None, 11)
    drain = wire.one(frame(FlowFrame(0, 5000, 0, 5000, 0, 0, 4, None, True, None, None), 3))
    session.on_flow(drain.fields)
    assert link.drain_mode and link.drained() == 4
    ((_, code, fields, _),) = wire.out()
    assert (code, fields[4], fields[5], fields[6], fields[8]) == (FLOW, 0, 4, 0, True)
    with pytest.raises(ProtocolError):
        session.on_flow(wire.one(frame(FlowFrame(0, 5000, 0, 5000, 8, 0, 1, None, None, None, None), 3)).fields)


def test_a_detach_ends_the_link_and_our_answer_forgets_it() -> None:
    wire = Wire()
    session = begun(wire)
    link = attached(wire, session, "in", 2, client_sends=True)
    wire.out()
    detach = wire.one(frame(DetachFrame(2, True, None), 3))
    assert session.on_detach(detach.fields) == LinkDetached(link, True)
    assert link.remote_bits == REMOTE_CLOSED and session.links == {}
    link.close()
    ((_, code, fields, _),) = wire.out()
    assert (code, fields[0], fields[1]) == (DETACH, 0, True)
    assert wire.unlisted == [link] and session.handles == set()
    with pytest.raises(ProtocolError) as refused:
        session.on_detach(detach.fields)
    assert refused.value.condition == "amqp:session:unattached-handle"


def test_an_end_ends_every_link_first_and_our_end_frees_the_channel() -> None:
    wire = Wire()
    session = begun(wire)
    first = attached(wire, session, "in", 0, client_sends=True)
    second = attached(wire, session, "out", 1, client_sends=False)
    wire.out()
    end = wire.one(frame(EndFrame(None), 3))
    assert session.on_end(end.fields) == [
        LinkDetached(first, closed=True),
        LinkDetached(second, closed=True),
        SessionEnded(session),
    ]
    session.close()
    ((channel, code, _, _),) = wire.out()
    assert (channel, code) == (0, END) and wire.channels == set()
    assert first.local == second.local == LOCAL_CLOSED and wire.unlisted == [first, second]
