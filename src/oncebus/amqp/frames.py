"""Check and read the AMQP frames a client sends: every byte bounded, every performative decoded once.

Bounds first. Every incoming byte is checked before it is buffered or handed
to the engine: the protocol header must be AMQP 1.0's (anything else, an HTTP
request or a TLS ClientHello, is refused at its first wrong byte); a frame
size is checked against the limit before the frame's bytes are awaited (512
bytes until the client's open, then oncebus's advertised max-frame-size); each
performative must be a known one whose encoding is well formed (decoded by
:mod:`oncebus.amqp.encoding`, which checks what it reads, nesting bounded); a
delivery is measured frame by frame against its link's max-message-size, and
once it passes, the rest of its payload is dropped here and the connection is
told, so it can detach the link at once. A partial frame waits in a buffer
that only grows by appends and is scanned once it is whole, so a client
trickling bytes costs linear time.

One pass. :meth:`FrameScanner.feed` hands back what it read as records
(:class:`ProtocolHeader`, :class:`Performative`): each performative's fields
are decoded once, here, while they are checked, and the engine
(:mod:`oncebus.amqp.engine`) reads those fields; nothing decodes a frame
again. A transfer's record carries its payload as a view of the bytes that
arrived; an ``attach`` also carries each field's bytes (the engine echoes the
client's termini as they were sent). The usual ``disposition`` (flags, ids, no
state or ``accepted``) is read without the general decoder.

Delivery-ids are kept as the client gave them: the SDK (azure-servicebus 7.15, ``_pyamqp``) takes a transfer's
delivery-id from its session counter without a lock, so two threads sending on one session at once can repeat
or reorder ids; oncebus's engine keys the deliveries by the ids the client gave and answers under them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import proton

from oncebus.amqp.encoding import DecodeError, list_fields, list_items
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
    FLOW,
    FRAME_TYPE_AMQP,
    FRAME_TYPE_SASL,
    OPEN,
    PROTOCOL_HEADER_PREFIX,
    SASL_HEADER,
    SASL_PERFORMATIVES,
    TRANSFER,
    descriptor_code,
    descriptor_length,
)

_U32 = struct.Struct(">I")
_HEAD = struct.Struct(">BBH")
_ACCEPTED = 0x24
_SASL_INIT = 0x41
# the fields the engine reads, by performative (those after them are checked, not decoded)
_DECODED = {OPEN: 5, BEGIN: 5, FLOW: 10, TRANSFER: 10, DISPOSITION: 6, DETACH: 3, END: 1, CLOSE: 1, _SASL_INIT: 1}
_HEADER, _SASL, _AMQP = "header", "sasl", "amqp"

FRAMING_ERROR = "amqp:connection:framing-error"
DECODE_ERROR = "amqp:decode-error"
RESOURCE_LIMIT = "amqp:resource-limit-exceeded"
UNATTACHED_HANDLE = "amqp:session:unattached-handle"


# a disposition's fields as the SDKs send them, read without the general decoder (anything else goes to it)
_FLAGS = {0x40: None, 0x41: True, 0x42: False}
_ACCEPTED_LIST0, _ACCEPTED_LIST8 = b"\x00\x53\x24\x45", b"\x00\x53\x24\xc0\x01\x00"  # its empty list, either way
# the ``accepted`` state the fast read gives: one shared value (read, never changed: the engine keeps its code only)
ACCEPTED_VALUE = proton.Described(proton.ulong(_ACCEPTED), [])
_DISPOSITION_DESCRIPTOR = b"\x00\x53\x15"


def disposition_fields(body: memoryview | bytes) -> list[Any] | None:
    """:func:`_disposition_fields`, None where the bytes run short (the general decoder says what is wrong)."""
    try:
        return _disposition_fields(body)
    except (IndexError, struct.error):
        return None


def _disposition_fields(body: memoryview | bytes) -> list[Any] | None:
    """The fields of a ``disposition`` body (its descriptor at 0..2) if it has the usual shape: flags, delivery
    ids as uint, and no state or ``accepted``; None for anything else (the general decoder reads it then).
    Gives what ``Reader.list_fields(6)`` gives for the same bytes (ids as plain ints)."""
    code = body[3]
    if code == 0xC0:
        end, count, pos = 5 + body[4], body[5], 6
    elif code == 0xD0:
        end, count, pos = 8 + int(_U32.unpack_from(body, 4)[0]), int(_U32.unpack_from(body, 8)[0]), 12
    elif code == 0x45:
        return []
    else:
        return None
    if count > 6 or end != len(body):
        return None
    fields: list[Any] = [None] * count  # (set by index: no append call for each field)
    for index in range(count):
        byte = body[pos]
        if byte in _FLAGS:
            fields[index] = _FLAGS[byte]
            pos += 1
        elif byte == 0x52:
            fields[index] = body[pos + 1]
            pos += 2
        elif byte == 0x56 and body[pos + 1] <= 1:  # a boolean in a byte: the Python SDK's flags
            fields[index] = body[pos + 1] == 1
            pos += 2
        elif byte == 0x43:
            fields[index] = 0
            pos += 1
        elif byte == 0x70:
            fields[index] = int(_U32.unpack_from(body, pos + 1)[0])
            pos += 5
        elif index == 4 and body[pos : pos + 4] == _ACCEPTED_LIST0:
            fields[index] = ACCEPTED_VALUE
            pos += 4
        elif index == 4 and body[pos : pos + 6] == _ACCEPTED_LIST8:
            fields[index] = ACCEPTED_VALUE
            pos += 6
        else:
            return None
    return fields if pos == end else None


class FrameError(ValueError):
    """The incoming bytes break AMQP (or a bound on them); ``condition`` is the AMQP error to close with."""

    def __init__(self, description: str, condition: str = FRAMING_ERROR) -> None:
        super().__init__(description)
        self.condition = condition


class NotAmqpError(FrameError):
    """The client did not send an AMQP 1.0 protocol header (an HTTP request, a TLS ClientHello, ...)."""


@dataclass(slots=True)
class ProtocolHeader:
    """The client's protocol header (AMQP, or SASL's before the SASL exchange)."""

    sasl: bool


@dataclass(slots=True)
class Performative:
    """One frame's performative, checked and decoded: ``fields`` as the engine reads them."""

    channel: int
    code: int  # the descriptor (OPEN .. CLOSE, or a SASL one)
    fields: list[Any]
    sasl: bool = False
    payload: memoryview | bytes = b""  # a transfer's (empty once its delivery passed its link's limit)
    raw: list[bytes] | None = None  # an attach's fields as sent
    size: int = 0  # a transfer: the payload bytes its delivery has had so far (dropped ones counted)
    oversized: bool = False  # a transfer: its delivery passed its link's max-message-size


Frame = ProtocolHeader | Performative


@dataclass
class _RemoteSender:
    name: str
    limit: int = 0  # max-message-size; 0 until oncebus accepts the link (a transfer before that is refused)
    in_progress: bool = False  # the last transfer frame said more=true
    size: int = 0  # payload bytes of the delivery in progress
    oversized: bool = False  # the delivery in progress passed ``limit``: the rest of its payload is dropped


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
    def feed(self, data: bytes) -> list[Frame]:
        """Check ``data`` (any split of the stream); return what its complete frames hold, decoded.

        Raises :class:`FrameError` (or :class:`NotAmqpError`) at the first byte that breaks AMQP or a
        bound. Only whole frames are read; empty frames (heartbeats) give nothing.
        """
        if self._buffer:
            self._buffer += data
            if len(self._buffer) < self._need:
                return []
            data = bytes(self._buffer)
            self._buffer.clear()
        out, offset, self._need = self._scan(data)
        if offset < len(data):
            self._buffer += memoryview(data)[offset:]
        return out

    def _scan(self, data: bytes) -> tuple[list[Frame], int, int]:
        """(what the frames hold, bytes consumed, bytes needed before scanning the rest)."""
        end = len(data)
        offset = 0
        out: list[Frame] = []
        view = memoryview(data)
        need = 0
        limits = self.limits
        limit = limits.max_frame_size if self.opened else limits.handshake_frame_size  # (frame_limit)
        while offset < end:
            if self._phase == _HEADER or (self._phase == _SASL and data[offset] == PROTOCOL_HEADER_PREFIX[0]):
                if not self._header(view[offset : offset + 8]):
                    need = 8
                    break
                out.append(ProtocolHeader(self._phase == _SASL))
                offset += 8
                continue
            if end - offset < 4:
                need = 8
                break
            (size,) = _U32.unpack_from(data, offset)
            if size > limit:
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
            doff, frame_type, channel = _HEAD.unpack_from(data, offset + 4)
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
                start = offset + doff * 4
                usual = None
                if frame_type == FRAME_TYPE_AMQP and data[start : start + 3] == _DISPOSITION_DESCRIPTOR:
                    try:  # the usual disposition (a completion): read at once, nothing else to note for it
                        usual = _disposition_fields(view[start : offset + size])
                    except (IndexError, struct.error):
                        usual = None
                if usual is not None:
                    out.append(Performative(channel, DISPOSITION, usual))
                else:
                    out.append(self._frame(channel, frame_type, view[offset : offset + size], doff * 4))
                    limit = self.frame_limit  # (the open raises it)
            elif self._phase == _SASL:
                raise FrameError("an empty SASL frame")
            offset += size
        return out, offset, need

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

    def _frame(self, channel: int, frame_type: int, frame: memoryview, start: int) -> Performative:
        """Check and decode one frame's performative; let the AMQP ones that matter update what is known."""
        names = SASL_PERFORMATIVES if frame_type == FRAME_TYPE_SASL else AMQP_PERFORMATIVES
        code: int | None = descriptor_code(frame, start)
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
        if frame_type == FRAME_TYPE_AMQP and code == DISPOSITION:  # (its descriptor as a ulong: the usual read)
            usual = disposition_fields(frame[start:])
            if usual is not None:
                return Performative(channel, DISPOSITION, usual)
        raw: list[bytes] | None = None
        fields: list[Any]
        try:
            if code == ATTACH and frame_type == FRAME_TYPE_AMQP:
                fields, raw, list_end = list_items(frame, list_at, self.limits.max_value_depth)
            else:
                fields, list_end = list_fields(frame, list_at, _DECODED.get(code, 16), self.limits.max_value_depth)
        except DecodeError as exc:
            raise FrameError(f"the {names[code]} performative cannot be decoded: {exc}", DECODE_ERROR) from None
        if list_end != len(frame) and code != TRANSFER:
            raise FrameError(f"{len(frame) - list_end} bytes follow the {names[code]} performative", DECODE_ERROR)
        performative = Performative(channel, code, fields, frame_type == FRAME_TYPE_SASL, raw=raw)
        if frame_type == FRAME_TYPE_SASL:
            return performative
        if code == TRANSFER:
            self._transfer(performative, frame[list_end:])
        elif code == OPEN:
            self.opened = True
        elif code == ATTACH:
            self._attach(channel, fields)
        elif code == DETACH:
            handle = fields[0] if fields else None
            if isinstance(handle, int) and not isinstance(handle, bool):
                self._handles.pop((channel, handle), None)
                self._attached.discard((channel, handle))
        elif code in (END, BEGIN):
            for key in [k for k in self._handles if k[0] == channel]:
                del self._handles[key]
            self._attached = {k for k in self._attached if k[0] != channel}
        return performative

    def _attach(self, channel: int, fields: list[Any]) -> None:
        name, handle, role = (fields + [None] * 3)[:3]
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

    def _transfer(self, performative: Performative, payload: memoryview) -> None:
        fields = performative.fields
        if len(fields) < 10:
            fields += [None] * (10 - len(fields))
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
        channel = performative.channel
        sender = self._handles.get((channel, handle))
        if sender is None:
            raise FrameError(f"a transfer on handle {handle} of channel {channel}, not attached", UNATTACHED_HANDLE)
        if not sender.in_progress:
            if not isinstance(tag, bytes):
                raise FrameError("the first transfer frame of a delivery has no delivery tag", DECODE_ERROR)
            sender.size, sender.oversized = 0, False
        sender.size += len(payload)
        if not sender.oversized and sender.size > sender.limit:
            sender.oversized = True
            self.oversized.append((sender.name, sender.size, sender.limit))
        performative.payload = b"" if sender.oversized else payload
        performative.size, performative.oversized = sender.size, sender.oversized
        sender.in_progress = bool(more) and not aborted

    def forget(self, link_name: str) -> None:
        """The link is gone: drop what was noted for it."""
        self._by_name.pop(link_name, None)
