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

Delivery-ids are kept as the client gave them: the SDK (azure-servicebus 7.15, ``_pyamqp``) takes a transfer's
delivery-id from its session counter without a lock, so two threads sending on one session at once can repeat
or reorder ids; oncebus's engine keys the deliveries by the ids the client gave and answers under them.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass, field

from oncebus.amqp.encoding import (
    DecodeError,
    Reader,
    skip,
)
from oncebus.amqp.limits import DEFAULT_LIMITS, AmqpLimits
from oncebus.amqp.performatives import (
    AMQP_HEADER,
    AMQP_PERFORMATIVES,
    ATTACH,
    BEGIN,
    DETACH,
    END,
    FRAME_TYPE_AMQP,
    FRAME_TYPE_SASL,
    OPEN,
    PLAIN_MESSAGE_FORMAT,
    PROTOCOL_HEADER_PREFIX,
    SASL_HEADER,
    SASL_PERFORMATIVES,
    TRANSFER,
    descriptor_code,
    descriptor_length,
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


class FrameScanner:
    """Follows the AMQP byte streams (SASL layer included) of one client connection, both ways."""

    def __init__(self, limits: AmqpLimits = DEFAULT_LIMITS) -> None:
        self.limits = limits
        self._buffer = bytearray()
        self._need = 0  # bytes the buffer must hold before scanning it again is worth it
        self._phase = _HEADER
        self._sasl_seen = False
        self.opened = False  # the client's open has been read
        self._handles: dict[tuple[int, int], _RemoteSender] = {}
        self._attached: set[tuple[int, int]] = set()  # every link the client attached (both roles)
        self._by_name: dict[str, _RemoteSender] = {}
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
        payload = len(frame) - list_end
        if not sender.in_progress:
            if not isinstance(tag, bytes):
                raise FrameError("the first transfer frame of a delivery has no delivery tag", DECODE_ERROR)
            fmt = message_format if isinstance(message_format, int) else PLAIN_MESSAGE_FORMAT
            sender.current = IncomingDelivery(tag, fmt)
            sender.deliveries.append(sender.current)
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
        if not strip:
            return None
        return struct.pack(">I", list_end) + bytes(frame[4:list_end])  # the payload past the limit is dropped

    def pop(self, link_name: str) -> IncomingDelivery:
        """The next delivery proton will hand out on the remote sender link ``link_name``."""
        sender = self._by_name.get(link_name)
        if sender is None or not sender.deliveries:
            raise FrameError(f"no transfer seen for a delivery on link {link_name!r}")
        return sender.deliveries.popleft()

    def discard(self, link_name: str) -> None:
        """proton handed out a delivery on ``link_name`` that nobody reads (the link has no handler)."""
        sender = self._by_name.get(link_name)
        if sender is not None and sender.deliveries:
            sender.deliveries.popleft()

    def forget(self, link_name: str) -> None:
        """The link is gone: drop what was noted for it."""
        self._by_name.pop(link_name, None)
