"""oncebus's own AMQP 1.0 connection engine: the connection's state machine, I/O-free.

Bytes in (:meth:`Connection.receive_data`): the :class:`~oncebus.amqp.frames.FrameScanner` checks them and
decodes each performative once; :meth:`Connection.receive` applies the connection's own (header, SASL, open,
begin, close) and hands every other to the session of its channel (:mod:`oncebus.amqp.session_state`, which hands
a link's to the link, :mod:`oncebus.amqp.link_state`). The typed event each returns goes in the connection's
:class:`~oncebus.amqp.events.Collector`; a :class:`~oncebus.amqp.endpoints.ProtocolError` one raises closes the
connection with its condition. The connection (:mod:`oncebus.amqp.connection`, the asyncio side) hands the
events to the link handlers, which act on the links and deliveries; what that says is written here (sessions
and links reach it as their :class:`~oncebus.amqp.link_state.Wire`), and :meth:`Connection.take_output` gives
the bytes to send. Nothing here touches a socket or a clock (the caller passes the time to
:meth:`Connection.tick`).

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
    _ACCEPTED_STATE as ACCEPTED_STATE,
)
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
    DeliveryNotes,
    Disposition,
    Endpoint,
    ProtocolError,
    Terminus,
    condition_of_error,
    encode_value,
    error_encoding,
)
from oncebus.amqp.events import Collector, ConnectionClosed, ConnectionOpened, Event, TransportClosed
from oncebus.amqp.frames import Frame, FrameScanner, Performative, ProtocolHeader
from oncebus.amqp.limits import DEFAULT_LIMITS, AmqpLimits
from oncebus.amqp.link_state import Delivery, DeliveryChanged, Link, SessionView
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
from oncebus.amqp.session_state import Session

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
    "ProtocolError",
    "Session",
    "SessionView",
    "Terminus",
    "encode_value",
]

_FRAME = struct.Struct(">IBBH")
_MASK = 0xFFFFFFFF


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
        self._channels: dict[int, SessionView] = {}  # by ours
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
        if self._dirty_links:
            self._flush()
        elif self._dispositions:  # (the usual outcome: one call less)
            if self.head_closed:
                self._dispositions = []
            else:
                self._flush_dispositions()
        out = self._out
        if not out:
            return b""
        data = out[0] if len(out) == 1 else b"".join(out)
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
        code, channel = frame.code, frame.channel
        if not ATTACH <= code <= END:  # the connection's own: open, begin, close
            if code == OPEN:
                self._on_open(frame.fields)
            elif code == BEGIN:
                self._on_begin(channel, frame.fields)
            elif code == CLOSE:
                self._on_close(frame.fields)
            return
        session = self.sessions.get(channel)  # the rest are the session's of their channel
        if session is None:
            self._fail("amqp:connection:framing-error", f"a frame on channel {channel}, which no begin opened")
            return
        try:
            if code == TRANSFER:
                changed = session.on_transfer(frame)
                if self.collector is not None:
                    self.collector.put(changed)
            elif code == DISPOSITION:
                found = session.dispose(frame.fields)
                if found:
                    self._disposition(found)
            elif code == FLOW:
                flowed = session.on_flow(frame.fields)
                if flowed is not None:
                    self._event(flowed)
            elif code == ATTACH:
                attached = session.on_attach(frame.fields, frame.raw or [])
                self.links.append(attached.link)
                self._event(attached)
            elif code == DETACH:
                self._event(session.on_detach(frame.fields))
            else:  # END
                del self.sessions[channel]
                for ended in session.on_end(frame.fields):
                    self._event(ended)
        except ProtocolError as error:
            self._fail(error.condition, error.description)

    def _disposition(self, found: list[Delivery]) -> None:
        """The deliveries a client's disposition changed: to their link's settler in one call when they are all
        one link's and no event waits before them (the order is the same), else one event each."""
        link = found[0].link
        settler = link.settler
        collector = self.collector
        if (
            settler is not None
            and (collector is None or not collector.events)
            and (len(found) == 1 or all(delivery.link is link for delivery in found))
        ):
            settler(found)
            return
        for delivery in found:
            self._event(DeliveryChanged(delivery))

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
        session = Session(self, channel)
        self.sessions[channel] = session
        self._event(session.on_begin(fields))

    # --- what sessions and links ask (link_state.Wire)
    def _take_channel(self, session: SessionView) -> int:
        channel = 0
        while channel in self._channels:
            channel += 1
        self._channels[channel] = session
        return channel

    def _give_channel(self, channel: int) -> None:
        self._channels.pop(channel, None)

    def _unlist(self, link: Link) -> None:
        if link in self.links:
            self.links.remove(link)

    def _dirty(self, link: Link) -> None:
        self._dirty_links.append(link)

    def _disposed(self, delivery: Delivery) -> None:
        self._dispositions.append(delivery)

    # --- frames out
    def _flush(self) -> None:
        """Write what handlers asked for since the last write: transfers first, then the dispositions."""
        links, self._dirty_links = self._dirty_links, []
        if self.head_closed:
            self._dispositions = []
            return
        for link in links:
            self._out_size += link.send_unsent(self._out)
        if self._dispositions:
            self._flush_dispositions()

    def _flush_dispositions(self) -> None:
        """The dispositions the deliveries have to say, a run of consecutive ids saying the same as one."""
        pending, self._dispositions = self._dispositions, []
        runs: list[list[Any]] = []  # [channel, role, first, last, settled, state bytes]
        previous = None
        for delivery in pending:
            if delivery is previous:  # updated then settled: once (a later repeat has nothing new to say)
                continue
            previous = delivery
            # (Delivery.to_say, inline: one call less for each outcome)
            link = delivery.link
            session = link.session
            delivery_id = delivery.delivery_id
            if delivery_id is None:
                continue  # not sent yet (it goes out settled with its transfer), or nothing to name it by
            local_settled = delivery.local_settled
            if local_settled:
                table = session.outgoing if link.is_sender else session.incoming
                if table.get(delivery_id) is delivery:
                    del table[delivery_id]
            if delivery.settled or session.channel is None or session.local != LOCAL_ACTIVE:
                continue  # the client settled it first, or the session is gone: nothing to say
            local_state = delivery.local_state
            said = (local_state, local_settled)
            if delivery.said == said:
                continue
            delivery.said = said
            state = ACCEPTED_STATE if local_state == ACCEPTED else delivery.local.encode(local_state)
            channel = session.channel
            role = link.is_receiver
            last = runs[-1] if runs else None
            if (
                last is not None
                and last[0] == channel
                and last[1] == role
                and last[3] + 1 == delivery_id
                and last[4] == local_settled
                and last[5] == state
            ):
                last[3] = delivery_id
            else:
                runs.append([channel, role, delivery_id, delivery_id, local_settled, state])
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
