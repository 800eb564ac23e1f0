"""Check, read (and, where the client numbered wrongly, repair) the AMQP frames between a client and proton.

Bounds first. Every incoming byte is checked before it is buffered or handed
to proton: the protocol header must be AMQP 1.0's (anything else, an HTTP
request or a TLS ClientHello, is refused at its first wrong byte); a frame
size is checked against the limit before the frame's bytes are awaited (512
bytes until the client's open, then oncebus's advertised max-frame-size); each
performative must be a known one whose encoding is well formed (checked by
:mod:`oncebus.amqp.encoding`, nesting bounded); a delivery is measured frame
by frame against its link's max-message-size, and once it passes, the rest of
its payload is dropped here and the connection is told, so it can detach the
link at once. A partial frame waits in a buffer that only grows by appends
and is scanned once it is whole, so a client trickling bytes costs linear time.

proton decodes every frame itself but does not expose a transfer's
``message-format`` (nor its raw delivery tag). Service Bus batches travel as
ONE transfer with message-format ``0x80013700`` whose data sections each hold
an encoded message; telling them from a plain message whose data sections
merely look encoded is only possible from the transfer performative. So every
incoming byte passes through :meth:`FrameScanner.feed` before
``transport.push()``.

The scanner follows frame boundaries, notes which remote link (by name) each
``(channel, handle)`` names from the attach frames, and queues, per link, the
``(delivery tag, message format)`` of each delivery as its first transfer
frame passes. proton hands out a link's deliveries in the same order, so the
connection pops the head of the queue when it reads a delivery, and checks
that the tags agree (they always do unless the scanner is wrong, which is then
a loud protocol error, never a silent misreading).

Delivery-id renumbering. The SDK (azure-servicebus 7.15, ``_pyamqp``) takes a
transfer's delivery-id from its session counter without a lock, so two threads
sending on one session at once (``AutoLockRenewer`` renewing several locks of
one receiver, a renewer thread next to the receiving thread) can put the same
delivery-id on two transfers, or send them out of order. proton requires the
ids of a session's incoming deliveries to be consecutive and closes the
connection with "sequencing error" otherwise. The scanner therefore gives
each new incoming delivery the id proton expects (the first delivery's own id,
then one more each time), keeps the client's id wherever it differs, and maps
every frame that names such deliveries back and forth:

* incoming ``transfer``: delivery-id (first and continuation frames) -> ours;
* outgoing ``disposition`` with role=receiver (our outcome for the client's
  transfers): our first..last -> the client's ids, split into as many
  dispositions as the client's ids form runs;
* incoming ``disposition`` with role=sender (the client settling its own
  transfers; the SDK never sends one, mapped for completeness): the client's
  first..last -> every one of our deliveries carrying one of those ids.

Sessions are matched across directions from our ``begin`` (its remote-channel
names the client's channel). Where the client's numbering never slips, nothing
is rewritten and frames pass unchanged. A client id used twice stays ambiguous
to the client itself: an outcome for either settles both on its side (the
SDK's own bookkeeping; management requests, the ones that race, are answered
by their response message, not by that outcome).
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from oncebus.amqp.encoding import (
    NULL,
    DecodeError,
    Reader,
    encode_list,
    encode_uint,
    skip,
)
from oncebus.amqp.limits import DEFAULT_LIMITS, AmqpLimits
from oncebus.amqp.performatives import (
    AMQP_HEADER,
    AMQP_PERFORMATIVES,
    ATTACH,
    BEGIN,
    CLOSE,
    DETACH,
    DISPOSITION,
    END,
    FRAME_HEADER_SIZE,
    FRAME_TYPE_AMQP,
    FRAME_TYPE_SASL,
    FULL_FIELD_COUNTS,
    OPEN,
    PLAIN_MESSAGE_FORMAT,
    PROTOCOL_HEADER_PREFIX,
    SASL_HEADER,
    SASL_PERFORMATIVES,
    TRANSFER,
    descriptor_code,
    descriptor_length,
    pad_fields,
    split_frames,
)

_SEQUENCE_MASK = 0xFFFFFFFF
_HEADER, _SASL, _AMQP = "header", "sasl", "amqp"

FRAMING_ERROR = "amqp:connection:framing-error"
DECODE_ERROR = "amqp:decode-error"
RESOURCE_LIMIT = "amqp:resource-limit-exceeded"
UNATTACHED_HANDLE = "amqp:session:unattached-handle"


class FrameError(ValueError):
    """The incoming bytes break AMQP (or a bound on them); ``condition`` is the AMQP error to close with."""

    def __init__(self, description: str, condition: str = FRAMING_ERROR) -> None:
        super().__init__(description)
        self.condition = condition


class NotAmqpError(FrameError):
    """The client did not send an AMQP 1.0 protocol header (an HTTP request, a TLS ClientHello, ...)."""


@dataclass
class IncomingDelivery:
    tag: bytes
    message_format: int
    size: int = 0  # payload bytes seen so far
    oversized: bool = False  # passed its link's max-message-size: the rest of its payload was dropped


@dataclass
class _RemoteSender:
    name: str
    limit: int = 0  # max-message-size; 0 until oncebus accepts the link (a transfer before that is refused)
    in_progress: bool = False  # the last transfer frame said more=true
    deliveries: deque[IncomingDelivery] = field(default_factory=deque)
    current: IncomingDelivery | None = None  # the delivery in progress
    current_theirs: int | None = None  # the client's delivery-id of the delivery in progress
    current_ours: int | None = None  # and the id proton knows it by


@dataclass
class _SessionIds:
    """Delivery-ids of the client's transfers on one session (keyed by the client's channel)."""

    next_id: int | None = None  # the id proton expects for the next new delivery (None before the first)
    theirs: dict[int, int] = field(default_factory=dict)  # our id -> the client's id, only where they differ

    def preimage(self, first: int, last: int) -> list[int]:
        """Our ids of the deliveries the client calls ``first..last``."""
        remapped = {ours for ours, theirs in self.theirs.items() if first <= theirs <= last}
        limit = self.next_id if self.next_id is not None else 0
        identity = (i for i in range(first, min(last, limit - 1) + 1) if i not in self.theirs)
        return sorted(remapped.union(identity))


def _runs(ids: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted distinct ids as (first, last) runs of consecutive values."""
    runs: list[tuple[int, int]] = []
    for value in sorted(set(ids)):
        if runs and runs[-1][1] + 1 == value:
            runs[-1] = (runs[-1][0], value)
        else:
            runs.append((value, value))
    return runs


class _Frame:
    """One AMQP frame whose performative list can be rewritten field by field."""

    def __init__(self, frame: bytes | memoryview, start: int) -> None:
        self.frame = frame
        self.start = start  # where the performative (descriptor) begins
        reader = Reader(memoryview(frame)[start:])
        reader.descriptor()
        self.list_at = reader.pos
        self.spans = reader.field_spans()
        self.end = reader.pos  # the end of the performative list: payload follows
        self.view = reader.data

    def raw(self, index: int) -> bytes:
        if index >= len(self.spans):
            return NULL
        a, b = self.spans[index]
        return bytes(self.view[a:b])

    def with_fields(self, replace: dict[int, bytes], *, payload: bool = True) -> bytes:
        count = max(len(self.spans), max(replace) + 1 if replace else 0)
        listed = encode_list([replace.get(i, self.raw(i)) for i in range(count)])
        head = bytes(self.frame[: self.start]) + bytes(self.view[: self.list_at]) + listed
        rest = bytes(self.view[self.end :]) if payload else b""
        size = len(head) + len(rest)
        return struct.pack(">I", size) + head[4:] + rest


class FrameScanner:
    """Follows the AMQP byte streams (SASL layer included) of one client connection, both ways."""

    def __init__(self, limits: AmqpLimits = DEFAULT_LIMITS, *, renumber: bool = True) -> None:
        self.limits = limits
        # give incoming deliveries the consecutive ids proton requires; oncebus's own engine keeps the client's
        # ids as they are (it keys deliveries by them and answers with them), so nothing needs mapping back
        self.renumber = renumber
        self._buffer = bytearray()
        self._need = 0  # bytes the buffer must hold before scanning it again is worth it
        self._phase = _HEADER
        self._sasl_seen = False
        self.opened = False  # the client's open has been read
        self.sent_header = False  # proton wrote its AMQP (not SASL) protocol header
        self.sent_open = False
        self.sent_close = False
        self._handles: dict[tuple[int, int], _RemoteSender] = {}
        self._attached: set[tuple[int, int]] = set()  # every link the client attached (both roles)
        self._by_name: dict[str, _RemoteSender] = {}
        self._sessions: dict[int, _SessionIds] = {}  # by the client's channel
        self._out_buffer = b""
        self._local_to_remote: dict[int, int] = {}  # our channel -> the client's channel
        self.renumbered = 0  # incoming deliveries whose id was changed (for logs and tests)
        # (link name, bytes seen, limit) of deliveries that passed their link's limit since the last look
        self.oversized: list[tuple[str, int, int]] = []

    @property
    def frame_limit(self) -> int:
        """The largest frame the client may send now."""
        return self.limits.max_frame_size if self.opened else self.limits.handshake_frame_size

    @property
    def in_amqp_layer(self) -> bool:
        """The client's AMQP (not SASL) protocol header has been read: AMQP frames (and a close) may follow."""
        return self._phase == _AMQP

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    # --- incoming ----------------------------------------------------------------------------
    def feed(self, data: bytes) -> bytes:
        """Check ``data`` (any split of the stream); return the complete frames to push to proton.

        Raises :class:`FrameError` (or :class:`NotAmqpError`) at the first byte that breaks AMQP or a
        bound. Frames come back unchanged unless their delivery-ids needed renumbering or their payload
        was dropped (a delivery over its link's limit); only whole frames are returned.
        """
        if self._buffer:
            self._buffer += data
            if len(self._buffer) < self._need:
                return b""
            data = bytes(self._buffer)
            self._buffer.clear()
        out, offset, self._need = self._scan(data)
        if offset < len(data):
            self._buffer += memoryview(data)[offset:]
        return out

    def _scan(self, data: bytes) -> tuple[bytes, int, int]:
        """(frames to push, bytes consumed, bytes needed before scanning the rest)."""
        end = len(data)
        offset = 0
        pieces: list[bytes] = []
        run = 0  # start of the bytes passed through unchanged since the last rewrite
        view = memoryview(data)
        need = 0
        while offset < end:
            if self._phase == _HEADER or (self._phase == _SASL and data[offset] == PROTOCOL_HEADER_PREFIX[0]):
                if not self._header(view[offset : offset + 8]):
                    need = 8
                    break
                offset += 8
                continue
            if end - offset < 4:
                need = 8
                break
            (size,) = struct.unpack_from(">I", data, offset)
            if size > self.frame_limit:
                raise FrameError(
                    f"a frame of {size} bytes exceeds the largest allowed now, {self.frame_limit} bytes "
                    f"({self.limits.handshake_frame_size} until the open exchange, then the max-frame-size "
                    f"{self.limits.max_frame_size})"
                )
            if size < 8:
                raise FrameError(f"malformed frame header: size {size} is smaller than the 8-byte frame header")
            if end - offset < 8:
                need = 8
                break
            doff, frame_type, channel = struct.unpack_from(">BBH", data, offset + 4)
            if doff < 2 or doff * 4 > size:
                raise FrameError(f"malformed frame header: data offset {doff} (must be 2 to {size // 4})")
            wanted = FRAME_TYPE_SASL if self._phase == _SASL else FRAME_TYPE_AMQP
            if frame_type != wanted:
                raise FrameError(
                    f"frame type {frame_type} where an {'SASL' if wanted else 'AMQP'} frame (type {wanted}) belongs"
                )
            if end - offset < size:
                need = size
                break
            if size > doff * 4:
                replaced = self._frame(channel, frame_type, view[offset : offset + size], doff * 4)
                if replaced is not None:
                    pieces.append(data[run:offset])
                    pieces.append(replaced)
                    run = offset + size
            elif self._phase == _SASL:
                raise FrameError("an empty SASL frame")
            offset += size
        if not pieces:
            return (data if offset == end else data[:offset]), offset, need
        pieces.append(data[run:offset])
        return b"".join(pieces), offset, need

    def _header(self, header: memoryview) -> bool:
        """Check a protocol header (possibly incomplete); True once all 8 bytes are here and good."""
        got = bytes(header)
        expected = AMQP_HEADER if len(got) > 4 and got[4] == 0 else SASL_HEADER
        if not expected.startswith(got[:8]) or (self._phase == _SASL and got[4:5] == b"\x03"):
            what = "a TLS handshake" if got[:1] == b"\x16" else repr(got[:8])
            if got[:4] == PROTOCOL_HEADER_PREFIX and got[4:5] == b"\x02":
                what = "the AMQP header for TLS (protocol id 2)"
            raise NotAmqpError(
                f"the connection did not start with an AMQP 1.0 protocol header (AMQP 0 1 0 0, or AMQP 3 1 0 0 for "
                f"SASL); got {what}. This port speaks plain AMQP 1.0",
            )
        if len(got) < 8:
            return False
        if got == SASL_HEADER:
            if self._sasl_seen:
                raise NotAmqpError("a second SASL protocol header")
            self._sasl_seen = True
            self._phase = _SASL
        else:
            self._phase = _AMQP
        return True

    def _frame(self, channel: int, frame_type: int, frame: memoryview, start: int) -> bytes | None:
        """Check one frame's performative; let the AMQP ones that matter update what is known."""
        names = SASL_PERFORMATIVES if frame_type == FRAME_TYPE_SASL else AMQP_PERFORMATIVES
        code = descriptor_code(frame, start)
        if code is None or code not in names:
            raise FrameError(
                f"the frame does not hold a known {'SASL' if frame_type else 'AMQP'} performative "
                f"(descriptor {code if code is None else hex(code)}; allowed: "
                + ", ".join(f"{hex(c)} {n}" for c, n in names.items())
                + ")",
                DECODE_ERROR,
            )
        list_at = start + descriptor_length(frame, start)
        if frame[list_at] not in (0x45, 0xC0, 0xD0):
            raise FrameError(f"the {names[code]} performative's fields are not a list", DECODE_ERROR)
        try:
            list_end = skip(frame, list_at, len(frame), self.limits.max_value_depth)
        except DecodeError as exc:
            raise FrameError(f"the {names[code]} performative cannot be decoded: {exc}", DECODE_ERROR) from None
        if list_end != len(frame) and code != TRANSFER:
            raise FrameError(f"{len(frame) - list_end} bytes follow the {names[code]} performative", DECODE_ERROR)
        if frame_type == FRAME_TYPE_SASL:
            return None
        return self._incoming(code, channel, frame, start, list_end)

    def _incoming(self, code: int, channel: int, frame: memoryview, start: int, list_end: int) -> bytes | None:
        if code == TRANSFER:
            return self._transfer(channel, frame, start, list_end)
        if code == DISPOSITION:
            return self._incoming_disposition(channel, frame, start)
        if code == OPEN:
            self.opened = True
        elif code == ATTACH:
            self._attach(channel, frame, start)
        elif code == DETACH:
            fields = self._fields(frame, start, 1)
            if isinstance(fields[0], int) and not isinstance(fields[0], bool):
                self._handles.pop((channel, fields[0]), None)
                self._attached.discard((channel, fields[0]))
        elif code in (END, BEGIN):
            for key in [k for k in self._handles if k[0] == channel]:
                del self._handles[key]
            self._attached = {k for k in self._attached if k[0] != channel}
            self._sessions.pop(channel, None)
        return None

    @staticmethod
    def _fields(frame: memoryview, start: int, wanted: int) -> list[object]:
        reader = Reader(frame[start:])
        reader.descriptor()
        fields = reader.list_fields(wanted)
        return fields + [None] * (wanted - len(fields))

    def _attach(self, channel: int, frame: memoryview, start: int) -> None:
        name, handle, role = self._fields(frame, start, 3)
        if not isinstance(name, str) or not isinstance(handle, int) or isinstance(handle, bool):
            raise FrameError("an attach without a link name (string) or handle (uint)", DECODE_ERROR)
        if not isinstance(role, bool):
            raise FrameError(f"the attach's role is {type(role).__name__} {role!r}, not a boolean", DECODE_ERROR)
        self._attached.add((channel, handle))
        if len(self._attached) > self.limits.max_links_per_connection:
            raise FrameError(
                f"more than {self.limits.max_links_per_connection} links on one connection", RESOURCE_LIMIT
            )
        if role:  # the remote is the receiver: we never read transfers for it
            return
        sender = _RemoteSender(name)
        self._handles[(channel, handle)] = sender
        self._by_name[name] = sender

    def set_link_limit(self, link_name: str, limit: int) -> None:
        """oncebus accepted the client's sender link ``link_name``: its deliveries may have ``limit`` bytes."""
        sender = self._by_name.get(link_name)
        if sender is not None:
            sender.limit = limit

    def _transfer(self, channel: int, frame: memoryview, start: int, list_end: int) -> bytes | None:
        fields = self._fields(frame, start, 10)
        handle, delivery_id, tag, message_format, _settled, more = fields[:6]
        aborted = fields[9]
        for name, value, kinds in (
            ("handle", handle, (int,)),
            ("delivery-id", delivery_id, (int, type(None))),
            ("delivery-tag", tag, (bytes, type(None))),
            ("message-format", message_format, (int, type(None))),
            ("more", more, (bool, type(None))),
            ("aborted", aborted, (bool, type(None))),
        ):
            if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
                raise FrameError(f"the transfer's {name} field is {type(value).__name__} {value!r}", DECODE_ERROR)
        sender = self._handles.get((channel, handle))  # type: ignore[arg-type]
        if sender is None:
            raise FrameError(f"a transfer on handle {handle} of channel {channel}, not attached", UNATTACHED_HANDLE)
        ours: int | None = None
        payload = len(frame) - list_end
        if not sender.in_progress:
            if not isinstance(tag, bytes):
                raise FrameError("the first transfer frame of a delivery has no delivery tag", DECODE_ERROR)
            fmt = message_format if isinstance(message_format, int) else PLAIN_MESSAGE_FORMAT
            sender.current = IncomingDelivery(tag, fmt)
            sender.deliveries.append(sender.current)
            session = self._sessions.get(channel)
            if session is None:
                session = self._sessions[channel] = _SessionIds()
            if isinstance(delivery_id, int) and not self.renumber:
                ours = delivery_id
            elif isinstance(delivery_id, int):
                ours = delivery_id if session.next_id is None else session.next_id
                session.next_id = (ours + 1) & _SEQUENCE_MASK
                if ours != delivery_id:
                    session.theirs[ours] = delivery_id
                    self.renumbered += 1
            elif session.next_id is not None and self.renumber:  # no id: proton takes the next one itself
                ours = session.next_id
                session.next_id = (ours + 1) & _SEQUENCE_MASK
            sender.current_theirs = delivery_id if isinstance(delivery_id, int) else None
            sender.current_ours = ours
        elif isinstance(delivery_id, int) and delivery_id == sender.current_theirs:
            ours = sender.current_ours  # a continuation frame: the same id as its first frame
        current = sender.current
        assert current is not None
        current.size += payload
        strip = False
        if current.oversized:
            strip = payload > 0
        elif current.size > sender.limit:
            current.oversized = True
            strip = payload > 0
            self.oversized.append((sender.name, current.size, sender.limit))
        sender.in_progress = bool(more) and not aborted
        if not sender.in_progress:
            sender.current = None
        renumber = ours is not None and isinstance(delivery_id, int) and ours != delivery_id
        if not renumber and not strip:
            return None
        replace = {1: encode_uint(ours)} if renumber and ours is not None else {}
        return _Frame(frame, start).with_fields(replace, payload=not strip)

    def pop(self, link_name: str) -> IncomingDelivery:
        """The next delivery proton will hand out on the remote sender link ``link_name``."""
        sender = self._by_name.get(link_name)
        if sender is None or not sender.deliveries:
            raise FrameError(f"no transfer seen for a delivery on link {link_name!r}")
        return sender.deliveries.popleft()

    def _incoming_disposition(self, channel: int, frame: memoryview, start: int) -> bytes | None:
        session = self._sessions.get(channel)
        if session is None or not session.theirs:
            return None
        parsed = _Frame(frame, start)
        role, first, last = (Reader(parsed.raw(i)).value() for i in range(3))
        if role is not False and role is not None:  # role=receiver: about our transfers, our ids
            return None
        if not isinstance(first, int):
            return None
        last = last if isinstance(last, int) else first
        runs = _runs(session.preimage(first, last))
        if runs == [(first, last)]:
            return None
        return b"".join(parsed.with_fields({1: encode_uint(a), 2: encode_uint(b) if b != a else NULL}) for a, b in runs)

    def discard(self, link_name: str) -> None:
        """proton handed out a delivery on ``link_name`` that nobody reads (the link has no handler)."""
        sender = self._by_name.get(link_name)
        if sender is not None and sender.deliveries:
            sender.deliveries.popleft()

    def forget(self, link_name: str) -> None:
        """The link is gone: drop what was noted for it."""
        self._by_name.pop(link_name, None)

    # --- outgoing ----------------------------------------------------------------------------
    def outgoing(self, data: bytes) -> bytes:
        """Scan what proton writes to the client; return the complete frames to send.

        Delivery-ids are mapped back to the client's; ``open`` and ``transfer`` get every field.
        """
        if self._out_buffer:
            data = self._out_buffer + data
        offset = 0
        end = len(data)
        pieces: list[bytes] = []
        run = 0
        view = memoryview(data)
        while end - offset >= 8:
            if data[offset : offset + 4] == PROTOCOL_HEADER_PREFIX:
                if data[offset + 4] == 0:
                    self.sent_header = True
                offset += 8
                continue
            size, doff, frame_type = struct.unpack_from(">IBB", data, offset)
            if end - offset < size:
                break
            start = doff * 4
            if frame_type == FRAME_TYPE_AMQP and size > start:
                replaced = self._outgoing(data[offset + 6 : offset + 8], view[offset : offset + size], start)
                if replaced is not None:
                    pieces.append(data[run:offset])
                    pieces.append(replaced)
                    run = offset + size
            offset += size
        self._out_buffer = data[offset:]
        if not pieces:
            return data if offset == end else data[:offset]
        pieces.append(data[run:offset])
        return b"".join(pieces)

    def _outgoing(self, channel_bytes: bytes, frame: memoryview, start: int) -> bytes | None:
        code = descriptor_code(frame, start)
        if code == TRANSFER:
            return pad_fields(frame, start, FULL_FIELD_COUNTS[TRANSFER])
        channel = struct.unpack(">H", channel_bytes)[0]
        if code == DISPOSITION:
            remote = self._local_to_remote.get(channel)
            session = None if remote is None else self._sessions.get(remote)
            if session is not None and session.theirs:
                mapped = self._outgoing_disposition(session, frame, start)
                if mapped is not None:
                    return b"".join(
                        pad_fields(f, FRAME_HEADER_SIZE, FULL_FIELD_COUNTS[DISPOSITION]) or f
                        for f in split_frames(mapped)
                    )
        elif code == OPEN:
            self.sent_open = True
        elif code == CLOSE:
            self.sent_close = True
        elif code == BEGIN:
            fields = self._fields(frame, start, 1)
            if isinstance(fields[0], int):
                self._local_to_remote[channel] = fields[0]
        elif code == END:
            self._local_to_remote.pop(channel, None)
        wanted = FULL_FIELD_COUNTS.get(code) if code is not None else None
        return None if wanted is None else pad_fields(frame, start, wanted)

    def _outgoing_disposition(self, session: _SessionIds, frame: memoryview, start: int) -> bytes | None:
        parsed = _Frame(frame, start)
        role, first, last, settled = (Reader(parsed.raw(i)).value() for i in range(4))
        if role is not True or not isinstance(first, int):  # role=sender: about our transfers, our ids
            return None
        last = last if isinstance(last, int) else first
        ours = range(first, last + 1)
        theirs = [session.theirs.get(i, i) for i in ours]
        if settled is True:  # the client forgets them now
            if len(session.theirs) < len(ours):
                for key in [k for k in session.theirs if first <= k <= last]:
                    del session.theirs[key]
            else:
                for key in ours:
                    session.theirs.pop(key, None)
        runs = _runs(theirs)
        if runs == [(first, last)]:
            return None
        return b"".join(parsed.with_fields({1: encode_uint(a), 2: encode_uint(b) if b != a else NULL}) for a, b in runs)
