"""Read the few facts proton's Python binding hides from the incoming AMQP frames.

proton decodes every frame itself but does not expose a transfer's
``message-format`` (nor its raw delivery tag). Service Bus batches travel as
ONE transfer with message-format ``0x80013700`` whose data sections each hold
an encoded message; telling them from a plain message whose data sections
merely look encoded is only possible from the transfer performative. So every
incoming byte passes through :class:`FrameScanner` before ``transport.push()``.

The scanner follows frame boundaries, notes which remote link (by name) each
``(channel, handle)`` names from the attach frames, and queues, per link, the
``(delivery tag, message format)`` of each delivery as its first transfer
frame passes. proton hands out a link's deliveries in the same order, so the
connection pops the head of the queue when it reads a delivery, and checks
that the tags agree (they always do unless the scanner is wrong, which is then
a loud protocol error, never a silent misreading).
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass, field

PROTOCOL_HEADER_PREFIX = b"AMQP"
BATCH_MESSAGE_FORMAT = 0x80013700
PLAIN_MESSAGE_FORMAT = 0

_FRAME_TYPE_AMQP = 0
_BEGIN = 0x11
_ATTACH = 0x12
_TRANSFER = 0x14
_DETACH = 0x16
_END = 0x17


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


class FrameScanner:
    """Follows an AMQP byte stream (SASL layer included) from the client."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._handles: dict[tuple[int, int], _RemoteSender] = {}
        self._by_name: dict[str, _RemoteSender] = {}

    def feed(self, data: bytes) -> bytes:
        """Scan ``data`` (any split of the stream); returns the complete frames to push to proton.

        Frames come back unchanged; only whole frames are returned, the rest waits for more bytes.
        """
        buffer = self._buffer
        buffer += data
        offset = 0
        end = len(buffer)
        out = bytearray()
        while end - offset >= 8:
            if buffer[offset : offset + 4] == PROTOCOL_HEADER_PREFIX:
                out += buffer[offset : offset + 8]
                offset += 8
                continue
            size, doff, frame_type, channel = struct.unpack_from(">IBBH", buffer, offset)
            if size < 8 or doff < 2:
                raise FrameError(f"malformed frame header (size {size}, doff {doff})")
            if end - offset < size:
                break
            frame = bytes(buffer[offset : offset + size])
            if frame_type == _FRAME_TYPE_AMQP and size > doff * 4:
                frame = self._performative(channel, frame, doff * 4)
            out += frame
            offset += size
        del buffer[:offset]
        return bytes(out)

    def pop(self, link_name: str) -> IncomingDelivery:
        """The next delivery proton will hand out on the remote sender link ``link_name``."""
        sender = self._by_name.get(link_name)
        if sender is None or not sender.deliveries:
            raise FrameError(f"no transfer seen for a delivery on link {link_name!r}")
        return sender.deliveries.popleft()

    def _performative(self, channel: int, frame: bytes, start: int) -> bytes:
        reader = _Reader(memoryview(frame)[start:])
        descriptor = reader.descriptor()
        if descriptor == _TRANSFER:
            return self._transfer(channel, reader, frame, start)
        if descriptor == _ATTACH:
            self._attach(channel, reader)
        elif descriptor == _DETACH:
            fields = reader.list_fields(1)
            if fields:
                self._handles.pop((channel, fields[0]), None)  # type: ignore[arg-type]
        elif descriptor in (_END, _BEGIN):
            for key in [k for k in self._handles if k[0] == channel]:
                del self._handles[key]
        return frame

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

    def _transfer(self, channel: int, reader: _Reader, frame: bytes, start: int) -> bytes:
        fields = reader.list_fields(10)
        fields += [None] * (10 - len(fields))
        handle, _delivery_id, tag, message_format, _settled, more = fields[:6]
        aborted = fields[9]
        sender = self._handles.get((channel, handle))  # type: ignore[arg-type]
        if sender is None:
            raise FrameError(f"transfer on unknown handle {handle} of channel {channel}")
        if not sender.in_progress:
            if not isinstance(tag, bytes):
                raise FrameError("first transfer frame of a delivery without a delivery tag")
            fmt = message_format if isinstance(message_format, int) else PLAIN_MESSAGE_FORMAT
            sender.deliveries.append(IncomingDelivery(tag, fmt))
        sender.in_progress = bool(more) and not aborted
        return frame

    def forget(self, link_name: str) -> None:
        """The link is gone: drop what was noted for it."""
        self._by_name.pop(link_name, None)


class _Reader:
    """Just enough of the AMQP type system to read the leading fields of a performative."""

    def __init__(self, data: memoryview) -> None:
        self.data = data
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

    def list_fields(self, wanted: int) -> list[object]:
        code = self._byte()
        if code == 0x45:
            return []
        if code == 0xC0:
            self._byte()
            count = self._byte()
        elif code == 0xD0:
            self._take(4)
            count = int(struct.unpack(">I", self._take(4))[0])
        else:
            raise FrameError(f"performative body is not a list (constructor 0x{code:02x})")
        return [self.value() for _ in range(min(count, wanted))]

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
