"""oncebus's own AMQP 1.0 connection engine: sessions, links, deliveries and their frames, in Python.

It replaces proton's Transport, Connection and event Collector for a server
connection (proton's value types and its ``Data`` codec stay: they encode the
rare frames' maps and conditions). Measured by ``bench/amqp_floor.py``: proton
driven from asyncio costs 91 us of server CPU per received and completed
message before oncebus does anything, an engine like this one 43 us (see
docs/performance-log.md, "why proton has to go").

The objects keep the names and meanings of the parts of proton's API that
oncebus's link handlers use (``Link.credit``, ``Delivery.update``/``settle``,
``Endpoint`` state bits, the ``Delivery`` outcome codes), so a handler does not
care which engine drives it. What is not here: a client role (oncebus only
serves), SASL mechanisms other than ANONYMOUS, resuming links, and the
``unsettled`` maps of an attach (oncebus's links never resume).

Frames arrive checked: :class:`~oncebus.amqp.frames.FrameScanner` sees every
incoming byte first (header, bounds, known performatives, well-formed
encodings, transfers on attached handles only). What the engine writes is
whole: every performative carries all its fields (azure-servicebus 7.14 reads
fields by position), and it writes nothing proton would not.
"""

from __future__ import annotations

import collections
import itertools
import struct
import uuid
from dataclasses import dataclass
from typing import Any

import proton

from oncebus.amqp.encoding import NULL, DecodeError, Reader, encode_list, encode_string, encode_symbol, encode_uint
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
_EVENT = proton.Event  # the engine puts proton's event types, so the connection's dispatch reads both engines alike


def encode_value(value: Any) -> bytes:
    """Any value proton's types describe, AMQP-encoded (by proton's codec: the rare frames' maps and states)."""
    data = proton.Data()
    data.put_object(value)
    return bytes(data.encode())


def _error(condition: Any) -> bytes:
    """An ``error`` from a proton ``Condition`` (its info map always present: the SDK reads it by position)."""
    if condition is None:
        return NULL
    info = encode_value(dict(condition.info)) if condition.info else _EMPTY_MAP
    description = encode_string(condition.description) if condition.description is not None else NULL
    return b"\x00\x53\x1d" + encode_list([encode_symbol(condition.name), description, info])


def _transfer_performative(head: bytes, more: bool) -> bytes:
    """A transfer's 11 fields: ``head`` holds the first five (handle .. settled)."""
    body = head + (TRUE if more else FALSE) + b"\x40\x40\x40\x40\x40"
    if len(body) + 1 <= 255:
        return b"\x00\x53\x14\xc0" + bytes((len(body) + 1, 11)) + body
    return b"\x00\x53\x14\xd0" + _U32.pack(len(body) + 4) + _U32.pack(11) + body


def _condition(value: Any) -> Any:
    """A proton ``Condition`` from a decoded ``error`` (None for none)."""
    if not isinstance(value, proton.Described) or not isinstance(value.value, list):
        return None
    fields = [*list(value.value), None, None, None]
    name, description, info = fields[0], fields[1], fields[2]
    return proton.Condition(
        str(name or ""), description if isinstance(description, str) else None, info if isinstance(info, dict) else None
    )


# ------------------------------------------------------------------------------------- events
class Event:
    """What happened (proton's event types, so the connection's dispatch reads both engines alike)."""

    __slots__ = ("delivery", "link", "session", "type")

    def __init__(
        self, kind: Any, link: Link | None = None, session: Session | None = None, delivery: Delivery | None = None
    ) -> None:
        self.type = kind
        self.link = link
        self.session = session
        self.delivery = delivery


class Collector:
    def __init__(self) -> None:
        self.events: collections.deque[Event] = collections.deque()

    def peek(self) -> Event | None:
        return self.events[0] if self.events else None

    def pop(self) -> None:
        if self.events:
            self.events.popleft()


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
        self.condition: Any = None
        self.data: Any = None
        self.failed = False
        self.undeliverable = False
        self.annotations: Any = None

    def encode(self, state: int) -> bytes:
        if state == ACCEPTED:
            return _ACCEPTED_STATE
        if state == RELEASED:
            return _RELEASED_STATE
        if state == REJECTED:
            return b"\x00\x53\x25" + encode_list([_error(self.condition)])
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
            self.condition = _condition(fields[0]) if fields else None
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
        self.condition: Any = None
        self.remote_condition: Any = None

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
    def __init__(self, connection: Connection, remote_channel: int) -> None:
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


class SaslStub:
    """proton's ``transport.sasl()``: oncebus serves ANONYMOUS only."""

    def allowed_mechs(self, mechs: str) -> None:
        pass


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

    # --- proton's names for the same object
    def bind(self, connection: Connection) -> None:
        pass

    def sasl(self) -> SaslStub:
        return SaslStub()

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

    def _event(
        self, kind: Any, link: Link | None = None, session: Session | None = None, delivery: Delivery | None = None
    ) -> None:
        collector = self.collector
        if collector is None:
            return
        events = collector.events
        if events:  # as proton's collector: an event just like the last one is not put twice
            last = events[-1]
            if last.type is kind and last.delivery is delivery and last.link is link and last.session is session:
                return
        events.append(Event(kind, link, session, delivery))

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
        self._write(amqp_frame(CLOSE, [_error(self.condition)], 0))
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
        self._event(_EVENT.TRANSPORT_CLOSED)

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
        self._event(_EVENT.CONNECTION_REMOTE_OPEN)

    def _on_close(self, fields: list[Any]) -> None:
        self.remote_condition = _condition(fields[0]) if fields else None
        self.remote_bits = REMOTE_CLOSED
        self._event(_EVENT.CONNECTION_REMOTE_CLOSE)

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
        self._event(_EVENT.SESSION_REMOTE_OPEN, session=session)

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
        session.remote_condition = _condition(fields[0]) if fields else None
        del self.sessions[channel]
        for link in list(session.links.values()):  # the session's links end with it
            if link.remote_bits != REMOTE_CLOSED:
                link.remote_bits = REMOTE_CLOSED
                self._event(_EVENT.LINK_REMOTE_CLOSE, link=link)
        self._event(_EVENT.SESSION_REMOTE_CLOSE, session=session)

    def _end(self, session: Session) -> None:
        if session.channel is None:
            return
        for link in list(session.links.values()):
            link.local = LOCAL_CLOSED
            self._forget(link)
        self._write(amqp_frame(END, [_error(session.condition)], session.channel))
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
        self._event(_EVENT.LINK_REMOTE_OPEN, link=link)

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
        link.remote_condition = _condition(fields[2])
        link.remote_bits = REMOTE_CLOSED
        del session.links[link.remote_handle]
        if link.local == LOCAL_CLOSED:
            self._forget(link)
        self._event(_EVENT.LINK_REMOTE_CLOSE if closed else _EVENT.LINK_REMOTE_DETACH, link=link)

    def _detach(self, link: Link, closed: bool) -> None:
        session = link.session
        if link.handle is not None and session.local == LOCAL_ACTIVE and session.remote_bits == REMOTE_ACTIVE:
            fields = [encode_uint(link.handle), TRUE if closed else FALSE, _error(link.condition)]
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
        self._event(_EVENT.LINK_FLOW, link=link)

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
        self._event(_EVENT.DELIVERY, link=link, delivery=delivery)

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
            self._event(_EVENT.DELIVERY, link=delivery.link, delivery=delivery)

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
