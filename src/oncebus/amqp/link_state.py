"""The link state machine (AMQP 1.0 part 2.6): attach and detach, credit, delivery counts, and each link's
transfers and dispositions, without I/O.

A :class:`Link` belongs to a session (:mod:`oncebus.amqp.session_state`), which creates it when the client's
``attach`` arrives and hands it the performatives addressed to its handle: :meth:`Link.on_detach`,
:meth:`Link.on_flow`, :meth:`Link.on_transfer` (and a disposition to each :class:`Delivery` it names,
:meth:`Delivery.on_disposition`). Each returns the typed event it means (defined here: :class:`LinkAttached`,
:class:`LinkDetached`, :class:`LinkFlow`, :class:`DeliveryChanged`), or raises
:class:`~oncebus.amqp.endpoints.ProtocolError` where the client broke the protocol.

oncebus's link handlers (:mod:`oncebus.amqp.links`) act on the link: give credit (:meth:`Link.flow`), send
(:meth:`Link.delivery`, :meth:`Link.send`, :meth:`Link.advance`), read (:meth:`Link.recv`), answer a
delivery (:meth:`Delivery.update`, :meth:`Delivery.settle`), detach (:meth:`Link.close`). What that says to the
client goes out through the session (:class:`SessionView`, what a link needs of the session that owns it: the
link module never imports the session module, which imports this one).
"""

from __future__ import annotations

import collections
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from oncebus.amqp.encoding import NULL, encode_string, encode_uint
from oncebus.amqp.endpoints import (
    _ACCEPTED_STATE,
    ACCEPTED,
    FALSE,
    LOCAL_ACTIVE,
    LOCAL_CLOSED,
    LOCAL_UNINIT,
    RCV_FIRST,
    REMOTE_ACTIVE,
    REMOTE_CLOSED,
    SND_MIXED,
    SOURCE,
    TARGET,
    TRUE,
    UNSPECIFIED,
    DeliveryNotes,
    Disposition,
    Endpoint,
    ProtocolError,
    Terminus,
    condition_of_error,
    encode_value,
    error_encoding,
)
from oncebus.amqp.frames import FrameScanner, Performative

__all__ = ["Delivery", "DeliveryChanged", "Link", "LinkAttached", "LinkDetached", "LinkFlow", "SessionView", "Wire"]

_WINDOW = 0x7FFFFFFF
_MASK = 0xFFFFFFFF
_NO_LIMIT = 1 << 64


class Wire(Protocol):
    """What sessions and links ask of their connection's engine (:class:`oncebus.amqp.engine.Connection`)."""

    scanner: FrameScanner  # a receiving link's size limit is set on it
    remote_max_frame_size: int  # the client's: outgoing transfers are split to it

    def _write(self, data: bytes) -> None: ...  # a whole frame to send

    def _dirty(self, link: Link) -> None: ...  # has advanced deliveries: framed before anything else goes out

    def _disposed(self, delivery: Delivery) -> None: ...  # its state changed or it was settled: say so

    def _take_channel(self, session: SessionView) -> int: ...  # the lowest free channel of ours, now session's

    def _give_channel(self, channel: int) -> None: ...

    def _unlist(self, link: Link) -> None: ...  # gone: the connection's iteration no longer finds it

    def _link_after(self, link: Link | None, mask: int) -> Link | None: ...


class SessionView(Protocol):
    """What a link asks of the session that owns it (:class:`oncebus.amqp.session_state.Session` is one)."""

    connection: Wire
    channel: int | None
    local: int
    remote_bits: int
    key: int
    outgoing: dict[int, Delivery]  # our unsettled deliveries by delivery id
    incoming: dict[int, Delivery]  # the client's unsettled deliveries by delivery id

    def attach(self, link: Link) -> None: ...

    def detach(self, link: Link, closed: bool) -> None: ...

    def flow(self, link: Link, *, drain: bool = False) -> None: ...

    def transfer(self, link: Link, delivery: Delivery, out: list[bytes]) -> int: ...


# ------------------------------------------------------------------------------------- the events
@dataclass(frozen=True, slots=True)
class LinkAttached:
    """The client attached ``link``."""

    link: Link


@dataclass(frozen=True, slots=True)
class LinkDetached:
    """The client detached ``link`` (``closed``: for good)."""

    link: Link
    closed: bool


@dataclass(frozen=True, slots=True)
class LinkFlow:
    """The client's ``flow`` for ``link`` (credit, drain) arrived."""

    link: Link


@dataclass(frozen=True, slots=True)
class DeliveryChanged:
    """A transfer of ``delivery`` arrived, or the client's disposition changed its state or settled it."""

    delivery: Delivery


# ------------------------------------------------------------------------------------- deliveries
class Delivery:
    """One delivery on one link, incoming (the client's transfer) or outgoing (ours)."""

    def __init__(self, link: Link, tag: bytes) -> None:
        self.link = link
        self.raw_tag = tag
        self.delivery_id: int | None = None
        self.partial = False
        self.aborted = False
        self.settled = False  # settled by the client
        self.local_settled = False
        self.remote_state = 0
        self.local_state = 0
        self.remote = Disposition()
        self.local = Disposition()
        self.chunks: list[bytes] = []
        self.pending = 0  # payload bytes not read yet (incoming) / to write (outgoing)
        self.said: tuple[int, bool] | None = None  # the (state, settled) our last disposition said
        self.message_format = 0  # an incoming delivery's, from its first transfer frame
        self.size = 0  # payload bytes that arrived (those dropped past the link's limit counted)
        self.oversized = False  # passed its link's max-message-size: the rest of its payload was dropped
        self.notes = DeliveryNotes()  # what oncebus's link handler noted about it

    @property
    def tag(self) -> bytes:
        return self.raw_tag

    # --- the local side
    def update(self, state: int) -> None:
        self.local_state = state
        self.link.connection._disposed(self)

    def settle(self) -> None:
        if self.local_settled:
            return
        self.local_settled = True
        link = self.link
        if link.is_receiver and link._reading and link._reading[0] is self:  # as proton: settling it advances
            link._reading.popleft()
        self.link.connection._disposed(self)

    def settle_as(self, state: int) -> None:
        """:meth:`update` to ``state`` and :meth:`settle` in one (an outgoing delivery's outcome)."""
        self.local_state = state
        if not self.local_settled:
            self.local_settled = True
            link = self.link
            if link.is_receiver and link._reading and link._reading[0] is self:
                link._reading.popleft()
        self.link.connection._disposed(self)

    def to_say(self) -> bytes | None:
        """The state our disposition says now (encoded), or None when there is nothing to say; forgets the
        delivery in its session's unsettled map once settled here."""
        link = self.link
        session = link.session
        delivery_id = self.delivery_id
        if link.is_sender and delivery_id is None:  # not sent yet: it goes out settled with its transfer
            return None
        if self.local_settled and delivery_id is not None:
            table = session.outgoing if link.is_sender else session.incoming
            if table.get(delivery_id) is self:
                del table[delivery_id]
        if self.settled:
            return None  # the client settled it first: nothing to say
        if delivery_id is None or session.channel is None or session.local != LOCAL_ACTIVE:
            return None
        said = (self.local_state, self.local_settled)
        if self.said == said:
            return None
        self.said = said
        return _ACCEPTED_STATE if self.local_state == ACCEPTED else self.local.encode(self.local_state)

    # --- the client's side
    def on_disposition(self, state: Any, settled: bool) -> DeliveryChanged:
        """The client's disposition named this delivery (``state``: the decoded delivery state, or None)."""
        if state is not None:
            self.remote_state = self.remote.decode(state)
        if settled:
            self.settled = True
        return DeliveryChanged(self)


# ------------------------------------------------------------------------------------- links
class Link(Endpoint):
    """A link the client attached; ``is_sender`` when oncebus sends on it (the client receives)."""

    def __init__(self, session: SessionView, name: str, remote_handle: int, is_sender: bool) -> None:
        super().__init__()
        self.session = session
        self.connection = session.connection
        self.name = name
        self.remote_handle = remote_handle
        self.handle: int | None = None
        self.is_sender = is_sender
        self.is_receiver = not is_sender
        self.source = Terminus(SOURCE)
        self.target = Terminus(TARGET)
        self.remote_source = Terminus(UNSPECIFIED)
        self.remote_target = Terminus(UNSPECIFIED)
        self.snd_settle_mode = SND_MIXED
        self.rcv_settle_mode = RCV_FIRST
        self.remote_snd_settle_mode = SND_MIXED
        self.remote_rcv_settle_mode = RCV_FIRST
        self.max_message_size = 0
        self.remote_max_message_size = 0
        self.properties: dict[Any, Any] | None = None
        self.remote_properties: dict[Any, Any] | None = None
        self.name_raw = encode_string(name)
        self.credit = 0
        self.delivery_count = 0
        self.drain_mode = False
        self._reading: collections.deque[Delivery] = collections.deque()  # incoming, not advanced past yet
        self._writing: Delivery | None = None  # outgoing: the delivery being written
        self._arriving: Delivery | None = None  # incoming: the delivery whose frames are still arriving
        self.unsent: collections.deque[Delivery] = collections.deque()  # outgoing, advanced, not written yet
        self.available = 0  # transfers the client's credit allows now (credit counts advanced ones instead)
        self.dirty = False  # on the connection's list of links with deliveries to write
        self.handle_raw = b""
        self.token_covered = False  # a CBS token covered its path once (a forced detach says it expired)
        # the client's dispositions of our deliveries on this link, handed over straight from the frame (no events)
        # while no other event waits; None: they go through the events (oncebus.amqp.links.ReceiveLink sets it)
        self.settler: Callable[[list[Delivery]], None] | None = None

    # --- the client's performatives
    @classmethod
    def attached(cls, session: SessionView, fields: list[Any], raw: list[bytes]) -> Link:
        """The link the client's ``attach`` (its decoded ``fields`` and their bytes ``raw``) makes."""
        fields = fields + [None] * (14 - len(fields))
        raw = raw + [NULL] * (14 - len(raw))
        name, handle, role = fields[0], fields[1], fields[2]
        if not isinstance(name, str) or not isinstance(handle, int) or not isinstance(role, bool):
            raise ProtocolError("amqp:decode-error", "an attach needs a name, a handle and a role")
        link = cls(session, name, handle, is_sender=role)  # role true: the client receives
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
        return link

    def on_detach(self, fields: list[Any]) -> LinkDetached:
        """The client's ``detach`` (``fields`` padded to 3)."""
        self.remote_condition = condition_of_error(fields[2])
        self.remote_bits = REMOTE_CLOSED
        return LinkDetached(self, bool(fields[1]))

    def on_flow(self, fields: list[Any]) -> LinkFlow:
        """The client's ``flow`` for this link (``fields`` padded to 10): its credit, and an echo asked for."""
        if self.is_sender and isinstance(fields[6], int):
            remote_count = int(fields[5]) if isinstance(fields[5], int) else 0
            available = (remote_count + int(fields[6]) - self.delivery_count) & _MASK
            self.available = available if available <= _WINDOW else 0  # the client counted past us: none
            self.credit = self.available - len(self.unsent)
            self.drain_mode = bool(fields[8])
            if self.unsent:
                self._wake()
        if fields[9] and self.local == LOCAL_ACTIVE:
            self.session.flow(self)
        return LinkFlow(self)

    def on_transfer(self, frame: Performative) -> Delivery:
        """One transfer frame of the client's on this link: the delivery it starts or continues."""
        fields, payload = frame.fields, frame.payload  # (the scanner gave a transfer its 10 fields)
        delivery = self._arriving
        if delivery is None:
            delivery = Delivery(self, fields[2] if isinstance(fields[2], bytes) else b"")
            delivery.delivery_id = fields[1] if isinstance(fields[1], int) else None
            delivery.message_format = fields[3] if isinstance(fields[3], int) else 0
            self._reading.append(delivery)
            self.credit -= 1
            self.delivery_count = (self.delivery_count + 1) & _MASK
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
        self._arriving = delivery if delivery.partial else None
        return delivery

    # --- what we say
    def attach_fields(self, handle: int) -> list[bytes]:
        """Our ``attach`` for this link, on ``handle``."""
        self.handle = handle
        self.handle_raw = encode_uint(handle)
        properties = encode_value(dict(self.properties)) if self.properties else NULL
        return [
            self.name_raw,
            self.handle_raw,
            FALSE if self.is_sender else TRUE,
            b"\x50" + bytes((self.snd_settle_mode,)),
            b"\x50" + bytes((self.rcv_settle_mode,)),
            self.source.encode(),
            self.target.encode(),
            NULL,
            FALSE,
            encode_uint(self.delivery_count) if self.is_sender else NULL,
            b"\x80" + struct.pack(">Q", self.max_message_size) if self.max_message_size else NULL,
            NULL,
            NULL,
            properties,
        ]

    def detach_fields(self, closed: bool) -> list[bytes]:
        return [encode_uint(self.handle or 0), TRUE if closed else FALSE, error_encoding(self.condition)]

    def flow_fields(self, drain: bool) -> list[bytes]:
        """The link's part of a ``flow`` (handle .. drain)."""
        credit = self.credit if self.credit > 0 else 0
        return [
            encode_uint(self.handle or 0),
            encode_uint(self.delivery_count),
            encode_uint(credit),
            NULL,
            TRUE if drain or self.drain_mode else FALSE,
        ]

    def send_unsent(self, out: list[bytes]) -> int:
        """Frame the advanced deliveries the client's credit allows into ``out``; the bytes added."""
        self.dirty = False
        session = self.session
        if session.channel is None or self.handle is None or self.local != LOCAL_ACTIVE:
            return 0
        size = 0
        while self.unsent and self.available > 0:
            self.available -= 1
            delivery = self.unsent.popleft()
            self.delivery_count = (self.delivery_count + 1) & _MASK
            size += session.transfer(self, delivery, out)
        return size

    def _wake(self) -> None:
        if not self.dirty:
            self.dirty = True
            self.connection._dirty(self)

    # --- both roles, the local side
    def open(self) -> None:
        if self.local != LOCAL_UNINIT:
            return
        self.local = LOCAL_ACTIVE
        if self.is_receiver:  # the client's deliveries are measured against what we advertise (0: no limit)
            self.connection.scanner.set_link_limit(self.name, self.max_message_size or _NO_LIMIT)
        self.session.attach(self)

    def close(self) -> None:
        self._detach(closed=True)

    def detach(self) -> None:
        self._detach(closed=False)

    def _detach(self, *, closed: bool) -> None:
        if self.local == LOCAL_CLOSED:
            return
        if self.local == LOCAL_UNINIT:
            self.local = LOCAL_CLOSED
            return
        self.local = LOCAL_CLOSED
        self.session.detach(self, closed)

    def next(self, mask: int) -> Link | None:
        """The connection's next link whose state has every bit of ``mask`` (proton's iteration)."""
        return self.connection._link_after(self, mask)

    # --- oncebus receives on it (the client sends)
    def flow(self, credit: int) -> None:
        self.credit += credit
        if self.local == LOCAL_ACTIVE:
            self.session.flow(self)

    @property
    def current(self) -> Delivery | None:
        """The delivery being read (the oldest not advanced past) or written (proton's ``Link.current``)."""
        if self.is_receiver:
            return self._reading[0] if self._reading else None
        return self._writing

    def recv(self, limit: int) -> bytes | None:
        delivery = self.current
        if delivery is None or not delivery.chunks:
            return b""
        data = b"".join(delivery.chunks)
        delivery.chunks = []
        delivery.pending = 0
        if len(data) > limit:
            delivery.chunks = [data[limit:]]
            delivery.pending = len(data) - limit
            data = data[:limit]
        return data

    # --- oncebus sends on it
    def delivery(self, tag: bytes) -> Delivery:
        delivery = Delivery(self, tag)
        self._writing = delivery
        return delivery

    def send_whole(self, tag: bytes, payload: bytes) -> Delivery:
        """A delivery of ``payload`` under ``tag``, sent whole and advanced (:meth:`delivery`, :meth:`send` and
        :meth:`advance` in one call: what a receive link does for each message)."""
        delivery = Delivery(self, tag)
        delivery.chunks.append(payload)
        delivery.pending = len(payload)
        self.credit -= 1
        self.unsent.append(delivery)
        if not self.dirty:
            self.dirty = True
            self.connection._dirty(self)
        return delivery

    def send(self, data: bytes) -> int:
        delivery = self.current
        if delivery is None:
            return 0
        delivery.chunks.append(data)
        delivery.pending += len(data)
        return len(data)

    def advance(self) -> bool:
        if self.is_receiver:  # the delivery read is done: the next one is current
            if not self._reading:
                return False
            self._reading.popleft()
            return True
        delivery = self._writing
        if delivery is None:
            return False
        self._writing = None
        self.credit -= 1
        self.unsent.append(delivery)
        self._wake()
        return True

    def drained(self) -> int:
        if not (self.drain_mode and self.credit > 0):
            return 0
        drained = self.credit
        self.delivery_count = (self.delivery_count + drained) & _MASK
        self.credit = 0
        self.available = len(self.unsent)
        self.session.flow(self, drain=True)
        return drained
