"""The session state machine (AMQP 1.0 part 2.5): begin and end, the windows, the incoming and outgoing
transfer-ids, session flow, and the routing of each link's performatives to its :class:`~oncebus.amqp.link_state.Link`,
without I/O.

The connection's engine (:class:`oncebus.amqp.engine.Connection`) creates a :class:`Session` for each ``begin``
the client sends and hands it the performatives of its channel: :meth:`Session.on_attach`,
:meth:`Session.on_detach`, :meth:`Session.on_flow`, :meth:`Session.on_transfer`, :meth:`Session.on_disposition`,
:meth:`Session.on_end`. Each returns the typed event(s) it means (:class:`SessionBegun` and :class:`SessionEnded`
are defined here, the link ones in :mod:`oncebus.amqp.link_state`), or raises
:class:`~oncebus.amqp.endpoints.ProtocolError` (the engine closes the connection with its condition). What the
session and its links say goes to the engine's output through :class:`~oncebus.amqp.link_state.Wire`.

The session owns its links: this module imports the link module, and a link reaches its session only through
:class:`~oncebus.amqp.link_state.SessionView` (``amqp/`` holds no import circle).
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass
from typing import Any

from oncebus.amqp.encoding import NULL, encode_uint
from oncebus.amqp.endpoints import (
    ACCEPTED,
    FALSE,
    LOCAL_ACTIVE,
    LOCAL_CLOSED,
    LOCAL_UNINIT,
    REMOTE_ACTIVE,
    REMOTE_CLOSED,
    SND_SETTLED,
    TRUE,
    Endpoint,
    ProtocolError,
    condition_of_error,
    error_encoding,
)
from oncebus.amqp.frames import ACCEPTED_VALUE, Performative
from oncebus.amqp.link_state import Delivery, DeliveryChanged, Link, LinkAttached, LinkDetached, LinkFlow, Wire
from oncebus.amqp.performatives import ATTACH, BEGIN, DETACH, END, FLOW, amqp_frame

__all__ = ["Session", "SessionBegun", "SessionEnded"]

_WINDOW = 0x7FFFFFFF
_MASK = 0xFFFFFFFF
_HANDLE_MAX = 0xFFFFFFFF
_FRAME = struct.Struct(">IBBH")
_U32 = struct.Struct(">I")
_session_keys = itertools.count(1)


@dataclass(frozen=True, slots=True)
class SessionBegun:
    """The client began ``session``."""

    session: Session


@dataclass(frozen=True, slots=True)
class SessionEnded:
    """The client ended ``session`` (its links ended with it: each had its :class:`LinkDetached`)."""

    session: Session


_LAST_FRAME_FIELDS = FALSE + b"\x40\x40\x40\x40\x40"  # more=false, then rcv-settle-mode .. batchable: none


def _transfer_performative(head: bytes, more: bool) -> bytes:
    """A transfer's 11 fields: ``head`` holds the first five (handle .. settled)."""
    body = head + (TRUE if more else FALSE) + b"\x40\x40\x40\x40\x40"
    if len(body) + 1 <= 255:
        return b"\x00\x53\x14\xc0" + bytes((len(body) + 1, 11)) + body
    return b"\x00\x53\x14\xd0" + _U32.pack(len(body) + 4) + _U32.pack(11) + body


class Session(Endpoint):
    """A session the client began on ``remote_channel``; ``channel`` is ours once :meth:`open` answered it."""

    def __init__(self, connection: Wire, remote_channel: int) -> None:
        super().__init__()
        self.connection = connection
        self.remote_channel = remote_channel
        self.channel: int | None = None
        self.next_incoming_id = 0
        self.next_outgoing_id = 0
        self.remote_incoming_window = _WINDOW
        self.links: dict[int, Link] = {}  # by the client's handle
        self.handles: set[int] = set()  # ours in use
        self.outgoing: dict[int, Delivery] = {}  # our unsettled deliveries by delivery id
        self.incoming: dict[int, Delivery] = {}  # the client's unsettled deliveries by delivery id
        self.key = next(_session_keys)  # unique in the process (response links are found by it)

    # --- the client's performatives
    def on_begin(self, fields: list[Any]) -> SessionBegun:
        fields = fields + [None] * (5 - len(fields))
        self.next_incoming_id = int(fields[1]) if isinstance(fields[1], int) else 0
        self.remote_incoming_window = int(fields[2]) if isinstance(fields[2], int) else _WINDOW
        self.remote_bits = REMOTE_ACTIVE
        return SessionBegun(self)

    def on_end(self, fields: list[Any]) -> list[LinkDetached | SessionEnded]:
        """The client's ``end``: the session and the links still attached end (each one's event first)."""
        self.remote_bits = REMOTE_CLOSED
        self.remote_condition = condition_of_error(fields[0]) if fields else None
        events: list[LinkDetached | SessionEnded] = []
        for link in list(self.links.values()):  # the session's links end with it
            if link.remote_bits != REMOTE_CLOSED:
                link.remote_bits = REMOTE_CLOSED
                events.append(LinkDetached(link, closed=True))
        events.append(SessionEnded(self))
        return events

    def on_attach(self, fields: list[Any], raw: list[bytes]) -> LinkAttached:
        link = Link.attached(self, fields, raw)
        if link.remote_handle in self.links:
            raise ProtocolError("amqp:session:handle-in-use", f"handle {link.remote_handle} is attached already")
        self.links[link.remote_handle] = link
        return LinkAttached(link)

    def on_detach(self, fields: list[Any]) -> LinkDetached:
        fields = fields + [None] * (3 - len(fields))
        link = self.links.get(fields[0]) if isinstance(fields[0], int) else None
        if link is None:
            raise ProtocolError(
                "amqp:session:unattached-handle", f"a detach of handle {fields[0]}, which is not attached"
            )
        event = link.on_detach(fields)
        del self.links[link.remote_handle]
        if link.local == LOCAL_CLOSED:
            self.forget(link)
        return event

    def on_flow(self, fields: list[Any]) -> LinkFlow | None:
        """The client's ``flow``: its window, and its link's credit when it names one (the link's event)."""
        fields = fields + [None] * (10 - len(fields))
        if isinstance(fields[1], int):
            base = int(fields[0]) if isinstance(fields[0], int) else 0
            self.remote_incoming_window = (base + int(fields[1]) - self.next_outgoing_id) & _MASK
        handle = fields[4]
        if not isinstance(handle, int):
            if fields[9]:
                self.session_flow()
            return None
        link = self.links.get(handle)
        if link is None:
            raise ProtocolError("amqp:session:unattached-handle", f"a flow on handle {handle}, which is not attached")
        return link.on_flow(fields)

    def on_transfer(self, frame: Performative) -> DeliveryChanged:
        fields = frame.fields
        link = self.links.get(fields[0])
        if link is None or link.is_sender:
            raise ProtocolError(
                "amqp:session:unattached-handle", f"a transfer on handle {fields[0]}, which is not attached"
            )
        self.next_incoming_id = (self.next_incoming_id + 1) & _MASK
        first = link._arriving is None
        delivery = link.on_transfer(frame)
        delivery_id = delivery.delivery_id
        if delivery_id is not None:
            if first:
                self.incoming[delivery_id] = delivery
            if not delivery.partial and delivery.settled:
                self.incoming.pop(delivery_id, None)
        return DeliveryChanged(delivery)

    def on_disposition(self, fields: list[Any]) -> list[DeliveryChanged]:
        """The client's ``disposition``: each delivery of the range it names, in our unsettled maps, changed."""
        return [DeliveryChanged(delivery) for delivery in self.dispose(fields)]

    def dispose(self, fields: list[Any]) -> list[Delivery]:
        """:meth:`on_disposition` without its events: the deliveries the client's disposition changed."""
        count = len(fields)
        if count < 6:
            fields = fields + [None] * (6 - count)
        role, first, last, settled, state = fields[0], fields[1], fields[2], bool(fields[3]), fields[4]
        if not isinstance(first, int):
            return []
        last = int(last) if isinstance(last, int) else first
        table = self.outgoing if role else self.incoming  # role true: the client received ours
        if first == last:  # the usual: one delivery
            one = table.get(first)
            found = [] if one is None else [one]
        elif last - first + 1 <= len(table):
            found = [d for i in range(first, last + 1) if (d := table.get(i)) is not None]
        else:
            found = [d for i, d in table.items() if first <= i <= last]
        accepted = state is ACCEPTED_VALUE  # the scanner's shared value: read without the general decoding
        for delivery in found:
            if accepted:
                delivery.remote.type = delivery.remote_state = ACCEPTED
            elif state is not None:
                delivery.remote_state = delivery.remote.decode(state)
            if settled:
                delivery.settled = True
                if delivery.local_settled and table.get(delivery.delivery_id or 0) is delivery:
                    del table[delivery.delivery_id or 0]
        return found

    # --- the local side
    def open(self) -> None:
        """Answer the client's begin."""
        if self.local != LOCAL_UNINIT:
            return
        self.local = LOCAL_ACTIVE
        channel = self.channel = self.connection._take_channel(self)
        fields = [
            b"\x60" + struct.pack(">H", self.remote_channel),
            encode_uint(self.next_outgoing_id),
            encode_uint(_WINDOW),
            encode_uint(_WINDOW),
            encode_uint(_HANDLE_MAX),
            NULL,
            NULL,
            NULL,
        ]
        self.connection._write(amqp_frame(BEGIN, fields, channel))

    def close(self) -> None:
        """End the session (its links end with it)."""
        if self.local == LOCAL_CLOSED:
            return
        was_active = self.local == LOCAL_ACTIVE
        self.local = LOCAL_CLOSED
        if not was_active or self.channel is None:
            return
        for link in list(self.links.values()):
            link.local = LOCAL_CLOSED
            self.forget(link)
        self.connection._write(amqp_frame(END, [error_encoding(self.condition)], self.channel))
        self.connection._give_channel(self.channel)

    def attach(self, link: Link) -> None:
        """Our attach for ``link`` (on the lowest handle free)."""
        if self.channel is None or self.local != LOCAL_ACTIVE:
            return
        handle = 0
        while handle in self.handles:
            handle += 1
        self.handles.add(handle)
        self.connection._write(amqp_frame(ATTACH, link.attach_fields(handle), self.channel))

    def detach(self, link: Link, closed: bool) -> None:
        if link.handle is not None and self.local == LOCAL_ACTIVE and self.remote_bits == REMOTE_ACTIVE:
            self.connection._write(amqp_frame(DETACH, link.detach_fields(closed), self.channel or 0))
        if link.remote_bits == REMOTE_CLOSED:
            self.forget(link)

    def forget(self, link: Link) -> None:
        """``link`` is detached on both sides: its handle is free, its unsettled deliveries are dropped."""
        if link.handle is not None:
            self.handles.discard(link.handle)
        self.connection._unlist(link)
        for table in (self.outgoing, self.incoming):
            for key in [k for k, d in table.items() if d.link is link]:
                del table[key]

    def _flow_head(self) -> list[bytes]:
        return [
            encode_uint(self.next_incoming_id),
            encode_uint(_WINDOW),
            encode_uint(self.next_outgoing_id),
            encode_uint(_WINDOW),
        ]

    def session_flow(self) -> None:
        """Our session's flow (the client asked for an echo)."""
        if self.channel is None or self.local != LOCAL_ACTIVE:
            return
        fields = [*self._flow_head(), NULL, NULL, NULL, NULL, FALSE, FALSE, NULL]
        self.connection._write(amqp_frame(FLOW, fields, self.channel))

    def flow(self, link: Link, *, drain: bool = False) -> None:
        """Our flow for ``link`` (its credit and delivery count)."""
        if self.channel is None or link.handle is None or self.local != LOCAL_ACTIVE:
            return
        fields = [*self._flow_head(), *link.flow_fields(drain), FALSE, NULL]
        self.connection._write(amqp_frame(FLOW, fields, self.channel))

    def transfer(self, link: Link, delivery: Delivery, out: list[bytes]) -> int:
        """Frame ``delivery`` on ``link`` into ``out`` (split to the client's max frame size) with the next
        outgoing transfer-id; the bytes added."""
        delivery_id = self.next_outgoing_id
        self.next_outgoing_id = (delivery_id + 1) & _MASK
        delivery.delivery_id = delivery_id
        chunks = delivery.chunks
        payload = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        delivery.chunks = []
        delivery.pending = 0
        settled = delivery.local_settled or link.snd_settle_mode == SND_SETTLED
        if settled:
            delivery.local_settled = True
            delivery.said = (delivery.local_state, True)
        else:
            self.outgoing[delivery_id] = delivery
        tag = delivery.raw_tag
        tag_size = len(tag)
        tag_raw = (b"\xa0" + bytes((tag_size,)) if tag_size < 256 else b"\xb0" + _U32.pack(tag_size)) + tag
        head = link.handle_raw + b"\x70" + _U32.pack(delivery_id) + tag_raw + b"\x43" + (TRUE if settled else FALSE)
        channel = self.channel or 0
        head_size = len(head)
        payload_size = len(payload)
        room = self.connection.remote_max_frame_size - 26 - head_size  # (8 frame header, 12 list head, 6 fields)
        if room < 1:
            room = 1
        if payload_size <= room:  # (the usual: one frame, its performative built here)
            if head_size + 7 <= 255:  # the body (head, more, five nulls) and its count fit a list8
                performative = b"\x00\x53\x14\xc0" + bytes((head_size + 7, 11)) + head + _LAST_FRAME_FIELDS
            else:
                performative = _transfer_performative(head, False)
            size = 8 + len(performative) + payload_size
            out.append(_FRAME.pack(size, 2, 0, channel) + performative + payload)
            return size
        size = 0
        offset = 0
        while offset < len(payload):
            chunk = payload[offset : offset + room]
            offset += len(chunk)
            performative = _transfer_performative(head, offset < len(payload))
            frame = _FRAME.pack(8 + len(performative) + len(chunk), 2, 0, channel) + performative + chunk
            out.append(frame)
            size += len(frame)
        return size
