"""oncebus's own AMQP 1.0 connection engine: the connection's state machine, I/O-free.

Bytes in (:meth:`Connection.receive_data`): the :class:`~oncebus.amqp.frames.FrameScanner` checks them and
decodes each performative once; :meth:`Connection.receive` applies each to the connection, its sessions and
links (:mod:`oncebus.amqp.endpoints`) and puts a typed event (:mod:`oncebus.amqp.events`) in its
:class:`~oncebus.amqp.events.Collector` for every change the client made. The connection
(:mod:`oncebus.amqp.connection`, the asyncio side) hands the events to the link handlers, which act on the
endpoints; what they ask for is written here, and :meth:`Connection.take_output` gives the bytes to send.
Nothing here touches a socket or a clock (the caller passes the time to :meth:`Connection.tick`).

Measured by ``bench/amqp_floor.py``: proton driven from asyncio cost 91 us of server CPU per received and
completed message before oncebus did anything, an engine like this one 43 us (docs/performance-log.md, "why
proton has to go"); proton's engine is no longer shipped. What is not here: a client role (oncebus only
serves), SASL mechanisms other than ANONYMOUS, resuming links, and the ``unsettled`` maps of an attach
(oncebus's links never resume). What the engine writes is whole: every performative carries all its fields
(azure-servicebus 7.14 reads fields by position), and it writes nothing proton would not.
"""

from __future__ import annotations

import struct
from typing import Any

import proton

from oncebus.amqp.encoding import NULL, DecodeError, encode_list, encode_string, encode_uint
from oncebus.amqp.endpoints import (
    ACCEPTED,
    COORDINATOR,
    FALSE,
    LOCAL_ACTIVE,
    LOCAL_CLOSED,
    LOCAL_UNINIT,
    MODIFIED,
    RCV_FIRST,
    RCV_SECOND,
    RECEIVED,
    REJECTED,
    RELEASED,
    REMOTE_ACTIVE,
    REMOTE_CLOSED,
    REMOTE_UNINIT,
    SND_MIXED,
    SND_SETTLED,
    SND_UNSETTLED,
    SOURCE,
    TARGET,
    TRUE,
    UNSPECIFIED,
    Condition,
    Delivery,
    DeliveryNotes,
    Disposition,
    Endpoint,
    Link,
    Session,
    Terminus,
    condition_of_error,
    encode_value,
    error_encoding,
)
from oncebus.amqp.events import (
    Collector,
    ConnectionClosed,
    ConnectionOpened,
    DeliveryChanged,
    Event,
    LinkAttached,
    LinkDetached,
    LinkFlow,
    SessionBegun,
    SessionEnded,
    TransportClosed,
)
from oncebus.amqp.frames import Frame, FrameScanner, Performative, ProtocolHeader
from oncebus.amqp.limits import DEFAULT_LIMITS, AmqpLimits
from oncebus.amqp.performatives import (
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
    amqp_frame,
)

__all__ = [
    "ACCEPTED",
    "COORDINATOR",
    "LOCAL_ACTIVE",
    "LOCAL_CLOSED",
    "LOCAL_UNINIT",
    "MODIFIED",
    "RCV_FIRST",
    "RCV_SECOND",
    "RECEIVED",
    "REJECTED",
    "RELEASED",
    "REMOTE_ACTIVE",
    "REMOTE_CLOSED",
    "REMOTE_UNINIT",
    "SND_MIXED",
    "SND_SETTLED",
    "SND_UNSETTLED",
    "SOURCE",
    "TARGET",
    "UNSPECIFIED",
    "Collector",
    "Condition",
    "Connection",
    "Delivery",
    "DeliveryNotes",
    "Disposition",
    "Endpoint",
    "Event",
    "Link",
    "Session",
    "Terminus",
    "encode_value",
]

_WINDOW = 0x7FFFFFFF
_MASK = 0xFFFFFFFF
_HANDLE_MAX = 0xFFFFFFFF
_FRAME = struct.Struct(">IBBH")
_U32 = struct.Struct(">I")


def _transfer_performative(head: bytes, more: bool) -> bytes:
    """A transfer's 11 fields: ``head`` holds the first five (handle .. settled)."""
    body = head + (TRUE if more else FALSE) + b"\x40\x40\x40\x40\x40"
    if len(body) + 1 <= 255:
        return b"\x00\x53\x14\xc0" + bytes((len(body) + 1, 11)) + body
    return b"\x00\x53\x14\xd0" + _U32.pack(len(body) + 4) + _U32.pack(11) + body


# ------------------------------------------------------------------------------------- the connection
class Connection(Endpoint):
    """The engine of one client connection; also its transport (bytes in with ``push``, out with ``peek``/``pop``).

    proton splits these into Connection, Transport and Collector; oncebus drives them together, so here they are
    one object that the connection reaches under the three names.
    """

    SERVER = 1

    def __init__(self, limits: AmqpLimits = DEFAULT_LIMITS) -> None:
        super().__init__()
        self.scanner = FrameScanner(limits)  # checks and decodes what the client sends
        self.container = "oncebus"
        self.max_frame_size = 65536
        self.channel_max = 0xFFFF
        self.remote_max_frame_size = 512
        self.remote_container: str | None = None
        self.remote_hostname: str | None = None
        self.remote_idle_timeout = 0.0
        self.collector: Collector | None = None
        self._out: list[bytes] = []
        self._out_size = 0
        self._in_sasl = False
        self.sessions: dict[int, Session] = {}  # by the client's channel
        self._channels: dict[int, Session] = {}  # by ours
        self.links: list[Link] = []
        self._dispositions: list[Delivery] = []  # updated or settled: their dispositions go out together
        self._dirty_links: list[Link] = []  # links with deliveries advanced and not written yet
        self.head_closed = False  # our close is written (or the output ended): nothing more goes out
        self.tail_closed = False
        self._eos_sent = False
        self.last_output = 0.0  # loop time of the last bytes written (the connection notes it)
        self.sent_header = False  # the AMQP protocol header, open and close have been written
        self.sent_open = False
        self.sent_close = False

    def collect(self, collector: Collector) -> None:
        self.collector = collector

    def link_head(self, mask: int) -> Link | None:
        """The connection's first link whose state has every bit of ``mask`` (proton's iteration)."""
        return self._link_after(None, mask)

    def _link_after(self, link: Link | None, mask: int) -> Link | None:
        links = self.links
        start = 0 if link is None else next((i + 1 for i, each in enumerate(links) if each is link), len(links))
        for candidate in links[start:]:
            if candidate.state & mask == mask:
                return candidate
        return None

    def _event(self, event: Event) -> None:
        if self.collector is not None:
            self.collector.put(event)

    # --- the local side
    def open(self) -> None:
        if self.local != LOCAL_UNINIT:
            return
        self.local = LOCAL_ACTIVE
        self.sent_open = True
        fields = [
            encode_string(self.container),
            NULL,
            encode_uint(self.max_frame_size),
            b"\x60" + struct.pack(">H", self.channel_max),
        ] + [NULL] * 6
        self._write(amqp_frame(OPEN, fields, 0))

    def close(self) -> None:
        if self.local == LOCAL_CLOSED:
            return
        if self.local == LOCAL_UNINIT:
            self.open()
        self.local = LOCAL_CLOSED
        self._write(amqp_frame(CLOSE, [error_encoding(self.condition)], 0))
        self.sent_close = True
        self.head_closed = True

    # --- the transport
    def capacity(self) -> int:
        return 1 << 30 if not self.tail_closed else -1

    def receive_data(self, data: bytes) -> None:
        """Take bytes the client sent; raises :class:`~oncebus.amqp.frames.FrameError` where they break AMQP (the
        caller closes with its condition)."""
        self.receive(self.scanner.feed(data))

    def receive(self, frames: list[Frame]) -> None:
        """Take what the client sent, as the frame scanner read it (checked, each performative decoded once)."""
        for frame in frames:
            if self.tail_closed:
                return
            if isinstance(frame, ProtocolHeader):
                self._header(frame.sasl)
            elif frame.sasl:
                self._sasl(frame)
            else:
                try:
                    self._amqp(frame)
                except (DecodeError, IndexError, TypeError, ValueError) as exc:
                    self._fail("amqp:decode-error", f"cannot read a frame: {exc}")

    def _header(self, sasl: bool) -> None:
        if sasl:
            self._in_sasl = True
            mechanisms = b"\x00\x53\x40" + encode_list([b"\xe0\x0c\x01\xa3\x09ANONYMOUS"])
            self._write(SASL_HEADER + _FRAME.pack(8 + len(mechanisms), 2, 1, 0) + mechanisms)
        else:
            self._write(AMQP_HEADER)
            self.sent_header = True

    def _sasl(self, frame: Performative) -> None:
        if frame.code != 0x41:  # only sasl-init is the client's to send (ANONYMOUS has no challenge)
            return
        fields = frame.fields
        ok = bool(fields) and str(fields[0]) == "ANONYMOUS"
        outcome = b"\x00\x53\x44" + encode_list([b"\x50" + (b"\x00" if ok else b"\x01")])
        self._write(_FRAME.pack(8 + len(outcome), 2, 1, 0) + outcome)
        if ok:
            self._in_sasl = False
        else:
            self.head_closed = True

    def pending(self) -> int:
        if self._dirty_links or self._dispositions:
            self._flush()
        if self._out_size:
            return self._out_size
        if self.head_closed or self.tail_closed:
            return -1
        return 0

    def peek(self, size: int) -> bytes:
        data = b"".join(self._out)
        self._out = [data] if data else []
        return data[:size]

    def pop(self, size: int) -> None:
        data = b"".join(self._out)
        rest = data[size:]
        self._out = [rest] if rest else []
        self._out_size = len(rest)

    def has_output(self) -> bool:
        return bool(self._out_size or self._dirty_links or self._dispositions)

    def take_output(self) -> bytes:
        """Everything there is to write (``pending``, ``peek`` and ``pop`` at once)."""
        if self._dirty_links or self._dispositions:
            self._flush()
        data = b"".join(self._out)
        self._out = []
        self._out_size = 0
        return data

    def tick(self, now: float) -> float:
        """Keep the client's idle timeout: an empty frame when nothing went out for half of it (the caller
        notes in ``last_output`` when it last wrote); the time to call again (0: never)."""
        if self.remote_idle_timeout <= 0 or self.head_closed:
            return 0.0
        interval = self.remote_idle_timeout / 2
        if self.last_output == 0.0:
            self.last_output = now
        elif now - self.last_output >= interval and self.local == LOCAL_ACTIVE:
            self._write(_FRAME.pack(8, 2, 0, 0))
            self.last_output = now
        return self.last_output + interval

    def close_tail(self) -> None:
        if self.tail_closed:
            return
        self.tail_closed = True
        if not self.head_closed:
            self.head_closed = True
        self._event(TransportClosed())

    def close_head(self) -> None:
        self.head_closed = True

    def _write(self, data: bytes) -> None:
        if self.head_closed:
            return
        if self._dirty_links or self._dispositions:
            self._flush()
        self._out.append(data)
        self._out_size += len(data)

    def _fail(self, condition: str, description: str) -> None:
        self.condition = proton.Condition(condition, description)
        self.close()

    # --- frames in
    def _amqp(self, frame: Performative) -> None:
        code, channel, fields = frame.code, frame.channel, frame.fields
        if code == DISPOSITION:
            self._on_disposition(channel, fields)
        elif code == TRANSFER:
            self._on_transfer(frame)
        elif code == FLOW:
            self._on_flow(channel, fields)
        elif code == ATTACH:
            self._on_attach(channel, fields, frame.raw or [])
        elif code == DETACH:
            self._on_detach(channel, fields)
        elif code == BEGIN:
            self._on_begin(channel, fields)
        elif code == END:
            self._on_end(channel, fields)
        elif code == OPEN:
            self._on_open(fields)
        elif code == CLOSE:
            self._on_close(fields)

    def _on_open(self, fields: list[Any]) -> None:
        fields += [None] * (5 - len(fields))
        self.remote_container = fields[0] if isinstance(fields[0], str) else None
        self.remote_hostname = fields[1] if isinstance(fields[1], str) else None
        if isinstance(fields[2], int):
            self.remote_max_frame_size = max(512, int(fields[2]))
        else:
            self.remote_max_frame_size = _MASK
        if isinstance(fields[4], int) and fields[4] > 0:
            self.remote_idle_timeout = fields[4] / 1000.0
        self.remote_bits = REMOTE_ACTIVE
        self._event(ConnectionOpened())

    def _on_close(self, fields: list[Any]) -> None:
        self.remote_condition = condition_of_error(fields[0]) if fields else None
        self.remote_bits = REMOTE_CLOSED
        self._event(ConnectionClosed())

    def _on_begin(self, channel: int, fields: list[Any]) -> None:
        if channel > self.channel_max:
            self._fail("amqp:connection:framing-error", f"channel {channel} is above channel-max {self.channel_max}")
            return
        if channel in self.sessions:
            self._fail("amqp:connection:framing-error", f"a begin on channel {channel}, which is in use")
            return
        fields += [None] * (5 - len(fields))
        session = Session(self, channel)
        session.next_incoming_id = int(fields[1]) if isinstance(fields[1], int) else 0
        session.remote_incoming_window = int(fields[2]) if isinstance(fields[2], int) else _WINDOW
        session.remote_bits = REMOTE_ACTIVE
        self.sessions[channel] = session
        self._event(SessionBegun(session))

    def _begin(self, session: Session) -> None:
        channel = 0
        while channel in self._channels:
            channel += 1
        session.channel = channel
        self._channels[channel] = session
        fields = [
            b"\x60" + struct.pack(">H", session.remote_channel),
            encode_uint(session.next_outgoing_id),
            encode_uint(_WINDOW),
            encode_uint(_WINDOW),
            encode_uint(_HANDLE_MAX),
            NULL,
            NULL,
            NULL,
        ]
        self._write(amqp_frame(BEGIN, fields, channel))

    def _on_end(self, channel: int, fields: list[Any]) -> None:
        session = self._session(channel)
        if session is None:
            return
        session.remote_bits = REMOTE_CLOSED
        session.remote_condition = condition_of_error(fields[0]) if fields else None
        del self.sessions[channel]
        for link in list(session.links.values()):  # the session's links end with it
            if link.remote_bits != REMOTE_CLOSED:
                link.remote_bits = REMOTE_CLOSED
                self._event(LinkDetached(link, closed=True))
        self._event(SessionEnded(session))

    def _end(self, session: Session) -> None:
        if session.channel is None:
            return
        for link in list(session.links.values()):
            link.local = LOCAL_CLOSED
            self._forget(link)
        self._write(amqp_frame(END, [error_encoding(session.condition)], session.channel))
        self._channels.pop(session.channel, None)

    def _session(self, channel: int) -> Session | None:
        session = self.sessions.get(channel)
        if session is None:
            self._fail("amqp:connection:framing-error", f"a frame on channel {channel}, which no begin opened")
        return session

    def _on_attach(self, channel: int, fields: list[Any], raw: list[bytes]) -> None:
        session = self._session(channel)
        if session is None:
            return
        fields = fields + [None] * (14 - len(fields))
        raw = raw + [NULL] * (14 - len(raw))
        name, handle, role = fields[0], fields[1], fields[2]
        if not isinstance(name, str) or not isinstance(handle, int) or not isinstance(role, bool):
            self._fail("amqp:decode-error", "an attach needs a name, a handle and a role")
            return
        if handle in session.links:
            self._fail("amqp:session:handle-in-use", f"handle {handle} is attached already")
            return
        link = Link(session, name, handle, is_sender=role)  # role true: the client receives
        link.name_raw = raw[0]
        snd, rcv = fields[3], fields[4]
        link.remote_snd_settle_mode = int(snd) if isinstance(snd, int) else SND_MIXED
        link.remote_rcv_settle_mode = int(rcv) if isinstance(rcv, int) else RCV_FIRST
        link.remote_source = Terminus.received(raw[5], fields[5], SOURCE)
        link.remote_target = Terminus.received(raw[6], fields[6], TARGET)
        count = fields[9]
        if link.is_receiver and isinstance(count, int):
            link.delivery_count = int(count)
        size = fields[10]
        link.remote_max_message_size = int(size) if isinstance(size, int) else 0
        properties = fields[13]
        link.remote_properties = dict(properties) if isinstance(properties, dict) else None
        link.remote_bits = REMOTE_ACTIVE
        session.links[handle] = link
        self.links.append(link)
        self._event(LinkAttached(link))

    def _attach(self, link: Link) -> None:
        session = link.session
        if session.channel is None or session.local != LOCAL_ACTIVE:
            return
        handle = 0
        while handle in session.handles:
            handle += 1
        session.handles.add(handle)
        link.handle = handle
        link.handle_raw = encode_uint(handle)
        properties = encode_value(dict(link.properties)) if link.properties else NULL
        fields = [
            link.name_raw,
            encode_uint(handle),
            FALSE if link.is_sender else TRUE,
            b"\x50" + bytes((link.snd_settle_mode,)),
            b"\x50" + bytes((link.rcv_settle_mode,)),
            link.source.encode(),
            link.target.encode(),
            NULL,
            FALSE,
            encode_uint(link.delivery_count) if link.is_sender else NULL,
            b"\x80" + struct.pack(">Q", link.max_message_size) if link.max_message_size else NULL,
            NULL,
            NULL,
            properties,
        ]
        self._write(amqp_frame(ATTACH, fields, session.channel))

    def _on_detach(self, channel: int, fields: list[Any]) -> None:
        session = self._session(channel)
        if session is None:
            return
        fields += [None] * (3 - len(fields))
        link = session.links.get(fields[0]) if isinstance(fields[0], int) else None
        if link is None:
            self._fail("amqp:session:unattached-handle", f"a detach of handle {fields[0]}, which is not attached")
            return
        closed = bool(fields[1])
        link.remote_condition = condition_of_error(fields[2])
        link.remote_bits = REMOTE_CLOSED
        del session.links[link.remote_handle]
        if link.local == LOCAL_CLOSED:
            self._forget(link)
        self._event(LinkDetached(link, closed))

    def _detach(self, link: Link, closed: bool) -> None:
        session = link.session
        if link.handle is not None and session.local == LOCAL_ACTIVE and session.remote_bits == REMOTE_ACTIVE:
            fields = [encode_uint(link.handle), TRUE if closed else FALSE, error_encoding(link.condition)]
            self._write(amqp_frame(DETACH, fields, session.channel or 0))
        if link.remote_bits == REMOTE_CLOSED:
            self._forget(link)

    def _forget(self, link: Link) -> None:
        if link.handle is not None:
            link.session.handles.discard(link.handle)
        if link in self.links:
            self.links.remove(link)
        for table in (link.session.outgoing, link.session.incoming):
            for key in [k for k, d in table.items() if d.link is link]:
                del table[key]

    def _on_flow(self, channel: int, fields: list[Any]) -> None:
        session = self._session(channel)
        if session is None:
            return
        fields += [None] * (10 - len(fields))
        if isinstance(fields[1], int):
            base = int(fields[0]) if isinstance(fields[0], int) else 0
            session.remote_incoming_window = (base + int(fields[1]) - session.next_outgoing_id) & _MASK
        handle = fields[4]
        if not isinstance(handle, int):
            if fields[9]:
                self._session_flow(session)
            return
        link = session.links.get(handle)
        if link is None:
            self._fail("amqp:session:unattached-handle", f"a flow on handle {handle}, which is not attached")
            return
        if link.is_sender and isinstance(fields[6], int):
            remote_count = int(fields[5]) if isinstance(fields[5], int) else 0
            available = (remote_count + int(fields[6]) - link.delivery_count) & _MASK
            link.available = available if available <= _WINDOW else 0  # the client counted past us: none
            link.credit = link.available - len(link.unsent)
            link.drain_mode = bool(fields[8])
            if link.unsent and not link.dirty:
                link.dirty = True
                self._dirty_links.append(link)
        if fields[9] and link.local == LOCAL_ACTIVE:
            self._flow(link)
        self._event(LinkFlow(link))

    def _session_flow(self, session: Session) -> None:
        if session.channel is None or session.local != LOCAL_ACTIVE:
            return
        fields = [
            encode_uint(session.next_incoming_id),
            encode_uint(_WINDOW),
            encode_uint(session.next_outgoing_id),
            encode_uint(_WINDOW),
            NULL,
            NULL,
            NULL,
            NULL,
            FALSE,
            FALSE,
            NULL,
        ]
        self._write(amqp_frame(FLOW, fields, session.channel))

    def _flow(self, link: Link, *, drain: bool = False) -> None:
        session = link.session
        if session.channel is None or link.handle is None or session.local != LOCAL_ACTIVE:
            return
        credit = link.credit if link.credit > 0 else 0
        fields = [
            encode_uint(session.next_incoming_id),
            encode_uint(_WINDOW),
            encode_uint(session.next_outgoing_id),
            encode_uint(_WINDOW),
            encode_uint(link.handle),
            encode_uint(link.delivery_count),
            encode_uint(credit),
            NULL,
            TRUE if drain or link.drain_mode else FALSE,
            FALSE,
            NULL,
        ]
        self._write(amqp_frame(FLOW, fields, session.channel))

    def _on_transfer(self, frame: Performative) -> None:
        session = self._session(frame.channel)
        if session is None:
            return
        fields, payload = frame.fields, frame.payload  # (the scanner gave a transfer its 10 fields)
        link = session.links.get(fields[0])
        if link is None or link.is_sender:
            self._fail("amqp:session:unattached-handle", f"a transfer on handle {fields[0]}, which is not attached")
            return
        session.next_incoming_id = (session.next_incoming_id + 1) & _MASK
        delivery = link._arriving
        if delivery is None:
            delivery = Delivery(link, fields[2] if isinstance(fields[2], bytes) else b"")
            delivery_id = fields[1] if isinstance(fields[1], int) else None
            delivery.delivery_id = delivery_id
            delivery.message_format = fields[3] if isinstance(fields[3], int) else 0
            link._reading.append(delivery)
            link.credit -= 1
            link.delivery_count = (link.delivery_count + 1) & _MASK
            if delivery_id is not None:
                session.incoming[delivery_id] = delivery
        if fields[4]:
            delivery.settled = True
        if fields[7] is not None:
            delivery.remote_state = delivery.remote.decode(fields[7])
        if payload:
            delivery.chunks.append(bytes(payload))
            delivery.pending += len(payload)
        delivery.size, delivery.oversized = frame.size, frame.oversized
        delivery.aborted = bool(fields[9])
        delivery.partial = bool(fields[5]) and not delivery.aborted
        link._arriving = delivery if delivery.partial else None
        if not delivery.partial and delivery.settled and delivery.delivery_id is not None:
            session.incoming.pop(delivery.delivery_id, None)
        self._event(DeliveryChanged(delivery))

    def _on_disposition(self, channel: int, fields: list[Any]) -> None:
        session = self._session(channel)
        if session is None:
            return
        fields += [None] * (6 - len(fields))
        role, first, last, settled, state = fields[0], fields[1], fields[2], bool(fields[3]), fields[4]
        if not isinstance(first, int):
            return
        last = int(last) if isinstance(last, int) else first
        table = session.outgoing if role else session.incoming  # role true: the client received ours
        if last - first + 1 <= len(table):
            found = [(i, table[i]) for i in range(first, last + 1) if i in table]
        else:
            found = [(i, d) for i, d in table.items() if first <= i <= last]
        for delivery_id, delivery in found:
            if state is not None:
                delivery.remote_state = delivery.remote.decode(state)
            if settled:
                delivery.settled = True
                if delivery.local_settled:
                    table.pop(delivery_id, None)
            self._event(DeliveryChanged(delivery))

    # --- frames out
    def _advanced(self, link: Link, delivery: Delivery) -> None:
        link.unsent.append(delivery)
        if not link.dirty:
            link.dirty = True
            self._dirty_links.append(link)

    def _flush(self) -> None:
        """Write what handlers asked for since the last write: transfers first, then the dispositions."""
        links, self._dirty_links = self._dirty_links, []
        if self.head_closed:
            self._dispositions = []
            return
        for link in links:
            link.dirty = False
            self._send_unsent(link)
        if self._dispositions:
            self._flush_dispositions()

    def _send_unsent(self, link: Link) -> None:
        session = link.session
        if session.channel is None or link.handle is None or link.local != LOCAL_ACTIVE:
            return
        while link.unsent and link.available > 0:
            link.available -= 1
            self._transfer(link, session, link.unsent.popleft())

    def _transfer(self, link: Link, session: Session, delivery: Delivery) -> None:
        delivery_id = session.next_outgoing_id
        session.next_outgoing_id = (delivery_id + 1) & _MASK
        delivery.delivery_id = delivery_id
        link.delivery_count = (link.delivery_count + 1) & _MASK
        payload = b"".join(delivery.chunks)
        delivery.chunks = []
        delivery.pending = 0
        settled = delivery.local_settled or link.snd_settle_mode == SND_SETTLED
        if settled:
            delivery.local_settled = True
            delivery.said = (delivery.local_state, True)
        else:
            session.outgoing[delivery_id] = delivery
        tag = delivery.raw_tag
        tag_raw = (b"\xa0" + bytes((len(tag),)) if len(tag) < 256 else b"\xb0" + _U32.pack(len(tag))) + tag
        head = link.handle_raw + b"\x70" + _U32.pack(delivery_id) + tag_raw + b"\x43" + (TRUE if settled else FALSE)
        channel = session.channel or 0
        room = max(self.remote_max_frame_size - 8 - 12 - len(head) - 6, 1)
        out = self._out
        if len(payload) <= room:
            performative = _transfer_performative(head, False)
            frame = _FRAME.pack(8 + len(performative) + len(payload), 2, 0, channel) + performative + payload
            out.append(frame)
            self._out_size += len(frame)
            return
        offset = 0
        while offset < len(payload):
            chunk = payload[offset : offset + room]
            offset += len(chunk)
            performative = _transfer_performative(head, offset < len(payload))
            frame = _FRAME.pack(8 + len(performative) + len(chunk), 2, 0, channel) + performative + chunk
            out.append(frame)
            self._out_size += len(frame)

    def _disposed(self, delivery: Delivery) -> None:
        self._dispositions.append(delivery)

    def _flush_dispositions(self) -> None:
        pending, self._dispositions = self._dispositions, []
        runs: list[list[Any]] = []  # [channel, role, first, last, settled, state bytes]
        seen: set[int] = set()
        for delivery in pending:
            if id(delivery) in seen:
                continue
            seen.add(id(delivery))
            link = delivery.link
            session = link.session
            delivery_id = delivery.delivery_id
            if link.is_sender and delivery_id is None:  # not sent yet: it goes out settled with its transfer
                continue
            if delivery.local_settled and delivery_id is not None:
                table = session.outgoing if link.is_sender else session.incoming
                if table.get(delivery_id) is delivery:
                    del table[delivery_id]
            if delivery.settled:
                continue  # the client settled it first: nothing to say
            if delivery_id is None or session.channel is None or session.local != LOCAL_ACTIVE:
                continue
            said = (delivery.local_state, delivery.local_settled)
            if delivery.said == said:
                continue
            delivery.said = said
            state = delivery.local.encode(delivery.local_state)
            role = link.is_receiver
            last = runs[-1] if runs else None
            if (
                last is not None
                and last[0] == session.channel
                and last[1] == role
                and last[3] + 1 == delivery_id
                and last[4] == delivery.local_settled
                and last[5] == state
            ):
                last[3] = delivery_id
            else:
                runs.append([session.channel, role, delivery_id, delivery_id, delivery.local_settled, state])
        for channel, role, first, last_id, settled, state in runs:
            fields = [
                TRUE if role else FALSE,
                encode_uint(first),
                encode_uint(last_id),
                TRUE if settled else FALSE,
                state,
                NULL,
            ]
            data = amqp_frame(DISPOSITION, fields, channel)
            self._out.append(data)
            self._out_size += len(data)

    # --- iteration for the connection
