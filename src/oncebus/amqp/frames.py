"""Read (and, where the client numbered wrongly, repair) the AMQP frames between a client and proton.

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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

PROTOCOL_HEADER_PREFIX = b"AMQP"
BATCH_MESSAGE_FORMAT = 0x80013700
PLAIN_MESSAGE_FORMAT = 0

_FRAME_TYPE_AMQP = 0
_BEGIN = 0x11
_ATTACH = 0x12
_TRANSFER = 0x14
_DISPOSITION = 0x15
_DETACH = 0x16
_END = 0x17
_SEQUENCE_MASK = 0xFFFFFFFF


class FrameError(ValueError):
    """The incoming bytes are not well-formed AMQP where the scanner needed to read them."""


@dataclass
class IncomingDelivery:
    tag: bytes
    message_format: int


@dataclass
class _RemoteSender:
    name: str
    in_progress: bool = False  # the last transfer frame said more=true
    deliveries: deque[IncomingDelivery] = field(default_factory=deque)
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


def encode_uint(value: int) -> bytes:
    if value == 0:
        return b"\x43"
    if value < 256:
        return bytes((0x52, value))
    return b"\x70" + struct.pack(">I", value & _SEQUENCE_MASK)


_NULL = b"\x40"


class _Frame:
    """One AMQP frame whose performative list can be rewritten field by field."""

    def __init__(self, frame: bytes | memoryview, start: int) -> None:
        self.frame = frame
        self.start = start  # where the performative (descriptor) begins
        reader = _Reader(memoryview(frame)[start:])
        reader.descriptor()
        self.list_at = reader.pos
        self.spans = reader.field_spans()
        self.end = reader.pos  # the end of the performative list: payload follows
        self.view = reader.data

    def raw(self, index: int) -> bytes:
        if index >= len(self.spans):
            return _NULL
        a, b = self.spans[index]
        return bytes(self.view[a:b])

    def with_fields(self, replace: dict[int, bytes]) -> bytes:
        count = max(len(self.spans), max(replace) + 1 if replace else 0)
        body = b"".join(replace.get(i, self.raw(i)) for i in range(count))
        listed = b"\xd0" + struct.pack(">II", len(body) + 4, count) + body
        head = bytes(self.frame[: self.start]) + bytes(self.view[: self.list_at]) + listed
        rest = bytes(self.view[self.end :])
        size = len(head) + len(rest)
        return struct.pack(">I", size) + head[4:] + rest


class FrameScanner:
    """Follows the AMQP byte streams (SASL layer included) of one client connection, both ways."""

    def __init__(self) -> None:
        self._buffer = b""
        self._handles: dict[tuple[int, int], _RemoteSender] = {}
        self._by_name: dict[str, _RemoteSender] = {}
        self._sessions: dict[int, _SessionIds] = {}  # by the client's channel
        self._out_buffer = b""
        self._local_to_remote: dict[int, int] = {}  # our channel -> the client's channel
        self.renumbered = 0  # incoming deliveries whose id was changed (for logs and tests)

    # --- incoming ----------------------------------------------------------------------------
    def feed(self, data: bytes) -> bytes:
        """Scan ``data`` (any split of the stream); returns the complete frames to push to proton.

        Frames come back unchanged unless their delivery-ids needed renumbering; only whole frames
        are returned, the rest waits for more bytes.
        """
        if self._buffer:
            data = self._buffer + data
        out, self._buffer = self._frames(data, self._incoming)
        return out

    def outgoing(self, data: bytes) -> bytes:
        """Scan what proton writes to the client; returns the complete frames to send (ids mapped back)."""
        if self._out_buffer:
            data = self._out_buffer + data
        out, self._out_buffer = self._frames(data, self._outgoing)
        return out

    @staticmethod
    def _frames(data: bytes, rewrite: Callable[[int, memoryview, int], bytes | None]) -> tuple[bytes, bytes]:
        """Split ``data`` into whole frames, letting ``rewrite`` replace AMQP frames; (out, rest)."""
        offset = 0
        end = len(data)
        pieces: list[bytes] = []
        run = 0  # start of the frames passed through unchanged since the last rewrite
        view = memoryview(data)
        while end - offset >= 8:
            if data[offset : offset + 4] == PROTOCOL_HEADER_PREFIX:
                offset += 8
                continue
            size, doff, frame_type, channel = struct.unpack_from(">IBBH", data, offset)
            if size < 8 or doff < 2:
                raise FrameError(f"malformed frame header (size {size}, doff {doff})")
            if end - offset < size:
                break
            start = doff * 4
            if frame_type == _FRAME_TYPE_AMQP and size > start:
                replaced = rewrite(channel, view[offset : offset + size], start)
                if replaced is not None:
                    pieces.append(data[run:offset])
                    pieces.append(replaced)
                    run = offset + size
            offset += size
        if not pieces:
            return (data if offset == end else data[:offset]), data[offset:]
        pieces.append(data[run:offset])
        return b"".join(pieces), data[offset:]

    def pop(self, link_name: str) -> IncomingDelivery:
        """The next delivery proton will hand out on the remote sender link ``link_name``."""
        sender = self._by_name.get(link_name)
        if sender is None or not sender.deliveries:
            raise FrameError(f"no transfer seen for a delivery on link {link_name!r}")
        return sender.deliveries.popleft()

    def _incoming(self, channel: int, frame: memoryview, start: int) -> bytes | None:
        descriptor = _descriptor_code(frame, start)
        if descriptor == _TRANSFER:
            return self._transfer(channel, frame, start)
        if descriptor == _DISPOSITION:
            return self._incoming_disposition(channel, frame, start)
        if descriptor == _ATTACH:
            reader = _Reader(frame[start:])
            reader.descriptor()
            self._attach(channel, reader)
        elif descriptor == _DETACH:
            reader = _Reader(frame[start:])
            reader.descriptor()
            fields = reader.list_fields(1)
            if fields:
                self._handles.pop((channel, fields[0]), None)  # type: ignore[arg-type]
        elif descriptor in (_END, _BEGIN):
            for key in [k for k in self._handles if k[0] == channel]:
                del self._handles[key]
            self._sessions.pop(channel, None)
        return None

    def _attach(self, channel: int, reader: _Reader) -> None:
        fields = reader.list_fields(3)
        fields += [None] * (3 - len(fields))
        name, handle, role = fields
        if role:  # the remote is the receiver: we never read transfers for it
            return
        if not isinstance(name, str) or not isinstance(handle, int):
            raise FrameError("attach frame without name or handle")
        sender = _RemoteSender(name)
        self._handles[(channel, handle)] = sender
        self._by_name[name] = sender

    def _transfer(self, channel: int, frame: memoryview, start: int) -> bytes | None:
        reader = _Reader(frame[start:])
        reader.descriptor()
        fields = reader.list_fields(10)
        fields += [None] * (10 - len(fields))
        handle, delivery_id, tag, message_format, _settled, more = fields[:6]
        aborted = fields[9]
        sender = self._handles.get((channel, handle))  # type: ignore[arg-type]
        if sender is None:
            raise FrameError(f"transfer on unknown handle {handle} of channel {channel}")
        ours: int | None = None
        if not sender.in_progress:
            if not isinstance(tag, bytes):
                raise FrameError("first transfer frame of a delivery without a delivery tag")
            fmt = message_format if isinstance(message_format, int) else PLAIN_MESSAGE_FORMAT
            sender.deliveries.append(IncomingDelivery(tag, fmt))
            session = self._sessions.get(channel)
            if session is None:
                session = self._sessions[channel] = _SessionIds()
            if isinstance(delivery_id, int):
                ours = delivery_id if session.next_id is None else session.next_id
                session.next_id = (ours + 1) & _SEQUENCE_MASK
                if ours != delivery_id:
                    session.theirs[ours] = delivery_id
                    self.renumbered += 1
            elif session.next_id is not None:  # no id: proton takes the next one itself
                ours = session.next_id
                session.next_id = (ours + 1) & _SEQUENCE_MASK
            sender.current_theirs = delivery_id if isinstance(delivery_id, int) else None
            sender.current_ours = ours
        elif isinstance(delivery_id, int) and delivery_id == sender.current_theirs:
            ours = sender.current_ours  # a continuation frame: the same id as its first frame
        sender.in_progress = bool(more) and not aborted
        if ours is None or not isinstance(delivery_id, int) or ours == delivery_id:
            return None
        return _Frame(frame, start).with_fields({1: encode_uint(ours)})

    def _incoming_disposition(self, channel: int, frame: memoryview, start: int) -> bytes | None:
        session = self._sessions.get(channel)
        if session is None or not session.theirs:
            return None
        parsed = _Frame(frame, start)
        role, first, last = (_Reader(parsed.raw(i)).value() for i in range(3))
        if role is not False and role is not None:  # role=receiver: about our transfers, our ids
            return None
        if not isinstance(first, int):
            return None
        last = last if isinstance(last, int) else first
        runs = _runs(session.preimage(first, last))
        if runs == [(first, last)]:
            return None
        return b"".join(
            parsed.with_fields({1: encode_uint(a), 2: encode_uint(b) if b != a else _NULL}) for a, b in runs
        )

    def forget(self, link_name: str) -> None:
        """The link is gone: drop what was noted for it."""
        self._by_name.pop(link_name, None)

    # --- outgoing ----------------------------------------------------------------------------
    def _outgoing(self, channel: int, frame: memoryview, start: int) -> bytes | None:
        descriptor = _descriptor_code(frame, start)
        if descriptor == _DISPOSITION:
            remote = self._local_to_remote.get(channel)
            session = None if remote is None else self._sessions.get(remote)
            if session is None or not session.theirs:
                return None
            return self._outgoing_disposition(session, frame, start)
        if descriptor == _BEGIN:
            reader = _Reader(frame[start:])
            reader.descriptor()
            fields = reader.list_fields(1)
            if fields and isinstance(fields[0], int):
                self._local_to_remote[channel] = fields[0]
        elif descriptor == _END:
            self._local_to_remote.pop(channel, None)
        return None

    def _outgoing_disposition(self, session: _SessionIds, frame: memoryview, start: int) -> bytes | None:
        parsed = _Frame(frame, start)
        role, first, last, settled = (_Reader(parsed.raw(i)).value() for i in range(4))
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
        return b"".join(
            parsed.with_fields({1: encode_uint(a), 2: encode_uint(b) if b != a else _NULL}) for a, b in runs
        )


def _descriptor_code(frame: memoryview, start: int) -> int | None:
    """The small-ulong descriptor of the performative at ``start`` (None for any other encoding)."""
    if len(frame) >= start + 3 and frame[start] == 0x00 and frame[start + 1] == 0x53:
        return int(frame[start + 2])
    if len(frame) >= start + 10 and frame[start] == 0x00 and frame[start + 1] == 0x80:
        return int(struct.unpack_from(">Q", frame, start + 2)[0])
    return None


class _Reader:
    """Just enough of the AMQP type system to read the leading fields of a performative."""

    def __init__(self, data: memoryview | bytes) -> None:
        self.data = data if isinstance(data, memoryview) else memoryview(data)
        self.pos = 0

    def _byte(self) -> int:
        if self.pos >= len(self.data):
            raise FrameError("performative ends early")
        value = self.data[self.pos]
        self.pos += 1
        return value

    def _take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise FrameError("performative ends early")
        value = bytes(self.data[self.pos : self.pos + n])
        self.pos += n
        return value

    def descriptor(self) -> int | None:
        if self._byte() != 0x00:
            raise FrameError("performative is not a described type")
        code = self._byte()
        if code == 0x53:
            return self._byte()
        if code == 0x80:
            return int(struct.unpack(">Q", self._take(8))[0])
        self.pos -= 1
        self.skip()  # a symbolic descriptor: not a performative we read
        return None

    def _list_header(self) -> int:
        code = self._byte()
        if code == 0x45:
            return 0
        if code == 0xC0:
            self._byte()
            return self._byte()
        if code == 0xD0:
            self._take(4)
            return int(struct.unpack(">I", self._take(4))[0])
        raise FrameError(f"performative body is not a list (constructor 0x{code:02x})")

    def list_fields(self, wanted: int) -> list[object]:
        count = self._list_header()
        return [self.value() for _ in range(min(count, wanted))]

    def field_spans(self) -> list[tuple[int, int]]:
        """The (start, end) of every field of the list here; leaves ``pos`` at the list's end."""
        count = self._list_header()
        spans = []
        for _ in range(count):
            begin = self.pos
            self.skip()
            spans.append((begin, self.pos))
        return spans

    def map_spans(self) -> list[tuple[int, int]]:
        """The (start, end) of every key and value of the map here; leaves ``pos`` at the map's end."""
        code = self._byte()
        if code == 0xC1:
            self._byte()
            count = self._byte()
        elif code == 0xD1:
            self._take(4)
            count = int(struct.unpack(">I", self._take(4))[0])
        else:
            raise FrameError(f"not a map (constructor 0x{code:02x})")
        if count % 2:
            raise FrameError("a map with an odd number of items")
        spans = []
        for _ in range(count):
            begin = self.pos
            self.skip()
            spans.append((begin, self.pos))
        return spans

    def value(self) -> object:
        code = self._byte()
        if code == 0x40:
            return None
        if code == 0x41:
            return True
        if code == 0x42:
            return False
        if code == 0x56:
            return self._byte() != 0
        if code == 0x43:
            return 0
        if code == 0x52:
            return self._byte()
        if code == 0x70:
            return int(struct.unpack(">I", self._take(4))[0])
        if code == 0xA0:
            return self._take(self._byte())
        if code == 0xB0:
            return self._take(int(struct.unpack(">I", self._take(4))[0]))
        if code == 0xA1:
            return self._take(self._byte()).decode("utf-8")
        if code == 0xB1:
            return self._take(int(struct.unpack(">I", self._take(4))[0])).decode("utf-8")
        if code == 0x60:
            return int(struct.unpack(">H", self._take(2))[0])
        self.pos -= 1
        self.skip()
        return _Other

    def _advance(self, n: int) -> None:
        if self.pos + n > len(self.data):
            raise FrameError("performative ends early")
        self.pos += n

    def skip(self) -> None:
        """Step over one value without decoding it."""
        code = self._byte()
        if code == 0x00:
            self.skip()  # descriptor
            self.skip()  # value
            return
        width = code >> 4
        if width == 0x4:
            return
        fixed = _FIXED_WIDTHS.get(width)
        if fixed is not None:
            self._advance(fixed)
        elif width in (0xA, 0xC, 0xE):
            self._advance(self._byte())
        elif width in (0xB, 0xD, 0xF):
            if self.pos + 4 > len(self.data):
                raise FrameError("performative ends early")
            (size,) = struct.unpack_from(">I", self.data, self.pos)
            self.pos += 4
            self._advance(size)
        else:
            raise FrameError(f"unknown AMQP constructor 0x{code:02x}")


_FIXED_WIDTHS = {0x5: 1, 0x6: 2, 0x7: 4, 0x8: 8, 0x9: 16}


class _OtherType:
    """A field the scanner skipped (not one it needs)."""


_Other = _OtherType()
