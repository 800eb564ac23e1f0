"""The state of a connection's sessions, links and deliveries (AMQP 1.0 part 2), without I/O.

The engine (:class:`oncebus.amqp.engine.Connection`) creates these as the client begins sessions, attaches
links and transfers; oncebus's link handlers (:mod:`oncebus.amqp.links`) act on them: give credit
(:meth:`Link.flow`), send (:meth:`Link.delivery`, :meth:`Link.send`, :meth:`Link.advance`), read
(:meth:`Link.recv`), answer a delivery (:meth:`Delivery.update`, :meth:`Delivery.settle`), detach
(:meth:`Link.close`). What that asks the client is written by the engine, reached through :class:`Wire`.

The numbers (endpoint state bits, settle modes, outcome codes, terminus types) are proton's, so the handlers
written for proton's engine read the same; the rare maps and conditions are encoded with proton's value types.
"""

from __future__ import annotations

import collections
import itertools
import struct
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

import proton

from oncebus.amqp.encoding import NULL, Reader, encode_list, encode_string, encode_symbol
from oncebus.amqp.frames import FrameScanner

# proton's numbers (tested equal in tests/amqp/test_engine.py): handlers compare with proton's constants
LOCAL_UNINIT, LOCAL_ACTIVE, LOCAL_CLOSED = 1, 2, 4
REMOTE_UNINIT, REMOTE_ACTIVE, REMOTE_CLOSED = 8, 16, 32
SND_UNSETTLED, SND_SETTLED, SND_MIXED = 0, 1, 2
RCV_FIRST, RCV_SECOND = 0, 1
RECEIVED, ACCEPTED, REJECTED, RELEASED, MODIFIED = 0x23, 0x24, 0x25, 0x26, 0x27
UNSPECIFIED, SOURCE, TARGET, COORDINATOR = 0, 1, 2, 3
_SOURCE_CODE, _TARGET_CODE, _COORDINATOR_CODE, _ERROR_CODE = 0x28, 0x29, 0x30, 0x1D
_WINDOW = 0x7FFFFFFF
_MASK = 0xFFFFFFFF
_NO_LIMIT = 1 << 64
_HANDLE_MAX = 0xFFFFFFFF
TRUE, FALSE = b"\x41", b"\x42"
_FRAME = struct.Struct(">IBBH")
_U32 = struct.Struct(">I")
_ACCEPTED_STATE = b"\x00\x53\x24\x45"
_ACCEPTED_CODE = proton.ulong(ACCEPTED)
_RELEASED_STATE = b"\x00\x53\x26\x45"
_session_keys = itertools.count(1)
_EMPTY_MAP = b"\xc1\x01\x00"

Condition = proton.Condition


def encode_value(value: Any) -> bytes:
    """Any value proton's types describe, AMQP-encoded (by proton's codec: the rare frames' maps and states)."""
    data = proton.Data()
    data.put_object(value)
    return bytes(data.encode())


def error_encoding(condition: Condition | None) -> bytes:
    """An ``error`` from a proton ``Condition`` (its info map always present: the SDK reads it by position)."""
    if condition is None:
        return NULL
    info = encode_value(dict(condition.info)) if isinstance(condition.info, dict) and condition.info else _EMPTY_MAP
    description = encode_string(condition.description) if condition.description is not None else NULL
    return b"\x00\x53\x1d" + encode_list([encode_symbol(condition.name), description, info])


def _transfer_performative(head: bytes, more: bool) -> bytes:
    """A transfer's 11 fields: ``head`` holds the first five (handle .. settled)."""
    body = head + (TRUE if more else FALSE) + b"\x40\x40\x40\x40\x40"
    if len(body) + 1 <= 255:
        return b"\x00\x53\x14\xc0" + bytes((len(body) + 1, 11)) + body
    return b"\x00\x53\x14\xd0" + _U32.pack(len(body) + 4) + _U32.pack(11) + body


def condition_of_error(value: Any) -> Condition | None:
    """A proton ``Condition`` from a decoded ``error`` (None for none)."""
    if not isinstance(value, proton.Described) or not isinstance(value.value, list):
        return None
    fields = [*list(value.value), None, None, None]
    name, description, info = fields[0], fields[1], fields[2]
    return proton.Condition(
        str(name or ""), description if isinstance(description, str) else None, info if isinstance(info, dict) else None
    )


class Wire(Protocol):
    """What sessions and links ask of their connection's engine: to write what changed."""

    scanner: FrameScanner  # a receiving link's size limit is set on it

    def _attach(self, link: Link) -> None: ...

    def _detach(self, link: Link, closed: bool) -> None: ...

    def _flow(self, link: Link, *, drain: bool = False) -> None: ...

    def _advanced(self, link: Link, delivery: Delivery) -> None: ...

    def _disposed(self, delivery: Delivery) -> None: ...

    def _begin(self, session: Session) -> None: ...

    def _end(self, session: Session) -> None: ...

    def _link_after(self, link: Link | None, mask: int) -> Link | None: ...


# ------------------------------------------------------------------------------------- termini
class Terminus:
    """A link's source or target: kept as the bytes the client sent, which the answer echoes."""

    def __init__(self, kind: int) -> None:
        self.type = kind
        self.raw: bytes = NULL  # the encoded source / target (a described list), or null
        self.address: str | None = None
        self._filter: dict[Any, Any] | None = None  # a replaced filter (a source's field 7)
        self._received_filter: dict[Any, Any] = {}  # the filter the client sent

    @classmethod
    def received(cls, raw: bytes, value: Any, default: int) -> Terminus:
        """The client's terminus: its bytes as sent (``raw``) and as the frame scanner decoded them (``value``)."""
        terminus = cls(UNSPECIFIED)
        terminus.raw = raw
        if not isinstance(value, proton.Described):
            return terminus
        code = int(value.descriptor) if isinstance(value.descriptor, int) else -1
        terminus.type = {_SOURCE_CODE: SOURCE, _TARGET_CODE: TARGET, _COORDINATOR_CODE: COORDINATOR}.get(code, default)
        fields = value.value if isinstance(value.value, list) else []
        if terminus.type != COORDINATOR:
            address = fields[0] if fields else None
            terminus.address = str(address) if isinstance(address, str) else None
        if terminus.type == SOURCE:
            filters = fields[7] if len(fields) > 7 else None
            terminus._received_filter = dict(filters) if isinstance(filters, dict) else {}
        return terminus

    def copy(self, other: Terminus) -> None:
        self.type, self.raw, self.address, self._filter = other.type, other.raw, other.address, other._filter
        self._received_filter = other._received_filter

    def filter_map(self) -> dict[Any, Any]:
        """The source's filter set (empty when none)."""
        return dict(self._filter if self._filter is not None else self._received_filter)

    def set_filter(self, filters: dict[Any, Any]) -> None:
        self._filter = dict(filters)

    def encode(self) -> bytes:
        if self.type == UNSPECIFIED:
            return NULL
        if self._filter is None or self.raw[:1] != b"\x00":
            return self.raw
        reader = Reader(self.raw)
        reader.descriptor()
        head = self.raw[: reader.pos]
        spans = reader.field_spans()
        fields = [self.raw[a:b] for a, b in spans] + [NULL] * max(0, 8 - len(spans))
        fields[7] = encode_value(self._filter)
        return head + encode_list(fields)


class Disposition:
    """One side's delivery state (proton's ``Disposition``: condition, data, failed, undeliverable)."""

    __slots__ = ("annotations", "condition", "data", "failed", "type", "undeliverable")

    def __init__(self) -> None:
        self.type = 0
        self.condition: Condition | None = None
        self.data: list[Any] | None = None
        self.failed = False
        self.undeliverable = False
        self.annotations: Any = None

    def encode(self, state: int) -> bytes:
        if state == ACCEPTED:
            return _ACCEPTED_STATE
        if state == RELEASED:
            return _RELEASED_STATE
        if state == REJECTED:
            return b"\x00\x53\x25" + encode_list([error_encoding(self.condition)])
        if state == MODIFIED:
            annotations = encode_value(self.annotations) if self.annotations else NULL
            return b"\x00\x53\x27" + encode_list(
                [TRUE if self.failed else FALSE, TRUE if self.undeliverable else FALSE, annotations]
            )
        if state == 0:
            return NULL
        return encode_value(proton.Described(proton.ulong(state), list(self.data or [])))

    def decode(self, value: Any) -> int:
        """Read a decoded delivery state; its code (0: none)."""
        if not isinstance(value, proton.Described):
            return 0
        code = int(value.descriptor) if isinstance(value.descriptor, int) else 0
        fields = value.value if isinstance(value.value, list) else []
        if code == REJECTED:
            self.condition = condition_of_error(fields[0]) if fields else None
        elif code == MODIFIED:
            self.failed = bool(fields[0]) if fields else False
            self.undeliverable = bool(fields[1]) if len(fields) > 1 else False
            self.annotations = fields[2] if len(fields) > 2 else None
        elif code not in (ACCEPTED, RELEASED):
            self.data = list(fields)
        self.type = code
        return code


# ------------------------------------------------------------------------------------- endpoints
@dataclass(slots=True)
class DeliveryNotes:
    """What oncebus's link handlers keep about one delivery while they work on it."""

    done: bool = False  # its outcome was given (nothing more is said about it)
    refused: bool = False  # refused while still arriving (its bytes were dropped)
    settling: bool = False  # the client's settlement is being applied
    txn_id: bytes | None = None  # the transaction that holds it (a transactional-state on its transfer)
    lock_token: uuid.UUID | None = None  # the lock of the message it carries (oncebus sends it)


class Delivery:
    """One delivery on one link, incoming (the client's transfer) or outgoing (ours)."""

    RECEIVED, ACCEPTED, REJECTED, RELEASED, MODIFIED = RECEIVED, ACCEPTED, REJECTED, RELEASED, MODIFIED

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

    def update(self, state: int) -> None:
        self.local_state = state
        self.link.session.connection._disposed(self)

    def settle(self) -> None:
        if self.local_settled:
            return
        self.local_settled = True
        link = self.link
        if link.is_receiver and link._reading and link._reading[0] is self:  # as proton: settling it advances
            link._reading.popleft()
        self.link.session.connection._disposed(self)


class Endpoint:
    LOCAL_UNINIT, LOCAL_ACTIVE, LOCAL_CLOSED = LOCAL_UNINIT, LOCAL_ACTIVE, LOCAL_CLOSED
    REMOTE_UNINIT, REMOTE_ACTIVE, REMOTE_CLOSED = REMOTE_UNINIT, REMOTE_ACTIVE, REMOTE_CLOSED

    def __init__(self) -> None:
        self.local = LOCAL_UNINIT
        self.remote_bits = REMOTE_UNINIT
        self.condition: Condition | None = None
        self.remote_condition: Condition | None = None

    @property
    def state(self) -> int:
        return self.local | self.remote_bits


class Link(Endpoint):
    """A link the client attached; ``is_sender`` when oncebus sends on it (the client receives)."""

    def __init__(self, session: Session, name: str, remote_handle: int, is_sender: bool) -> None:
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
        self.dirty = False
        self.handle_raw = b""
        self.token_covered = False  # a CBS token covered its path once (a forced detach says it expired)

    # --- both roles
    def open(self) -> None:
        if self.local != LOCAL_UNINIT:
            return
        self.local = LOCAL_ACTIVE
        if self.is_receiver:  # the client's deliveries are measured against what we advertise (0: no limit)
            self.connection.scanner.set_link_limit(self.name, self.max_message_size or _NO_LIMIT)
        self.connection._attach(self)

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
        self.connection._detach(self, closed)

    def next(self, mask: int) -> Link | None:
        """The connection's next link whose state has every bit of ``mask`` (proton's iteration)."""
        return self.connection._link_after(self, mask)

    # --- oncebus receives on it (the client sends)
    def flow(self, credit: int) -> None:
        self.credit += credit
        if self.local == LOCAL_ACTIVE:
            self.connection._flow(self)

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
        self.connection._advanced(self, delivery)
        return True

    def drained(self) -> int:
        if not (self.drain_mode and self.credit > 0):
            return 0
        drained = self.credit
        self.delivery_count = (self.delivery_count + drained) & _MASK
        self.credit = 0
        self.available = len(self.unsent)
        self.connection._flow(self, drain=True)
        return drained


class Session(Endpoint):
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

    def open(self) -> None:
        if self.local != LOCAL_UNINIT:
            return
        self.local = LOCAL_ACTIVE
        self.connection._begin(self)

    def close(self) -> None:
        if self.local == LOCAL_CLOSED:
            return
        was_active = self.local == LOCAL_ACTIVE
        self.local = LOCAL_CLOSED
        if was_active:
            self.connection._end(self)
