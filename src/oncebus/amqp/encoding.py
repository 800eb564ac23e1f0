"""The AMQP 1.0 type system (part 1 of the spec), read from bytes with every bound checked.

Everything a client sends passes through here before proton or the broker
sees it, so a hostile encoding becomes one :class:`DecodeError` naming what is
wrong, never a ``RecursionError``, a huge allocation or a loop over a count a
client made up:

* :func:`skip` steps over one value, checking it is well formed: known
  constructors, sizes within the data, a compound's items ending exactly at its
  declared size, item counts no larger than the bytes that hold them, nesting
  no deeper than ``max_depth``;
* :func:`decode` reads one value into Python, with proton's wrapper types
  where AMQP types differ from Python's (``symbol``, ``ulong``, ``timestamp``,
  ``Described``, ...) and hashable map keys (binary keys stay ``bytes``, list
  keys become tuples), which proton's own ``Data.get_object`` cannot do;
* :class:`Reader` reads the leading fields of a performative (what the frame
  scanner needs), with the same checks.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any

import proton

DEFAULT_MAX_DEPTH = 64


class DecodeError(ValueError):
    """The bytes are not a well-formed AMQP value."""


_FIXED_WIDTHS = {0x4: 0, 0x5: 1, 0x6: 2, 0x7: 4, 0x8: 8, 0x9: 16}
_KNOWN_FIXED = frozenset(
    {
        *(0x40, 0x41, 0x42, 0x43, 0x44, 0x45),  # null, true, false, uint0, ulong0, list0
        *(0x50, 0x51, 0x52, 0x53, 0x54, 0x55, 0x56),  # ubyte, byte, smalluint, smallulong, smallint, smalllong, bool
        *(0x60, 0x61),  # ushort, short
        *(0x70, 0x71, 0x72, 0x73, 0x74),  # uint, int, float, char, decimal32
        *(0x80, 0x81, 0x82, 0x83, 0x84),  # ulong, long, double, timestamp, decimal64
        *(0x94, 0x98),  # decimal128, uuid
    }
)
_VARIABLE = frozenset((0xA0, 0xA1, 0xA3, 0xB0, 0xB1, 0xB3))
_COMPOUND = frozenset((0xC0, 0xC1, 0xD0, 0xD1))
_ARRAY = frozenset((0xE0, 0xF0))
_U32 = struct.Struct(">I")
_ELEMENT_CODES = _KNOWN_FIXED | _VARIABLE | _COMPOUND | _ARRAY


def _width(code: int) -> int:
    return _FIXED_WIDTHS[code >> 4]


def _need(data: bytes | memoryview, pos: int, n: int, end: int) -> None:
    if n < 0 or pos + n > end:
        raise DecodeError(f"a value runs past the end of its data (needs {n} bytes at offset {pos}, has {end - pos})")


def _size_count(data: bytes | memoryview, code: int, pos: int, end: int) -> tuple[int, int, int]:
    """(position of the first item, item count, end of the compound) of a list8/32, map8/32 or array8/32."""
    if code in (0xC0, 0xC1, 0xE0):
        _need(data, pos, 2, end)
        size, count = data[pos], data[pos + 1]
        first, stop = pos + 2, pos + 1 + size
        if size < 1:
            raise DecodeError("a compound value's size is smaller than its count field")
    else:
        _need(data, pos, 8, end)
        size = _U32.unpack_from(data, pos)[0]
        count = _U32.unpack_from(data, pos + 4)[0]
        first, stop = pos + 8, pos + 4 + size
        if size < 4:
            raise DecodeError("a compound value's size is smaller than its count field")
    if stop > end:
        raise DecodeError(f"a compound value of {size} bytes runs past the end of its data")
    if count > stop - first and not (code in _ARRAY and count <= stop - first + 1):
        # every item takes at least one byte (an array's items share one constructor byte)
        raise DecodeError(f"a compound value claims {count} items in {stop - first} bytes")
    return first, count, stop


def skip(data: bytes | memoryview, pos: int, end: int | None = None, max_depth: int = DEFAULT_MAX_DEPTH) -> int:
    """Check the value at ``pos`` is well formed; return the position after it."""
    return _skip(data, pos, len(data) if end is None else end, max_depth)


def _skip(data: bytes | memoryview, pos: int, end: int, depth: int) -> int:
    if depth < 0:
        raise DecodeError("values are nested too deeply")
    _need(data, pos, 1, end)
    code = data[pos]
    pos += 1
    if code == 0x00:
        pos = _skip(data, pos, end, depth - 1)  # the descriptor
        return _skip(data, pos, end, depth - 1)
    if code in _KNOWN_FIXED:
        width = _width(code)
        _need(data, pos, width, end)
        return pos + width
    if code in _VARIABLE or code in _COMPOUND or code in _ARRAY:
        return _skip_body(data, code, pos, end, depth)
    raise DecodeError(f"unknown AMQP constructor 0x{code:02x}")


def _element_constructor(data: bytes | memoryview, pos: int, end: int, depth: int) -> tuple[int, int]:
    """An array's element constructor (a described one's descriptor is checked and skipped)."""
    _need(data, pos, 1, end)
    code = data[pos]
    if code == 0x00:
        pos = _skip(data, pos + 1, end, depth)
        _need(data, pos, 1, end)
        code = data[pos]
    if code in (0x00, 0x45) or code not in _ELEMENT_CODES:
        raise DecodeError(f"0x{code:02x} cannot be an array's element constructor")
    return pos + 1, code


def _skip_element(data: bytes | memoryview, code: int, pos: int, end: int, depth: int) -> int:
    """Skip one array element encoded without its constructor ``code``."""
    if code in _KNOWN_FIXED:
        width = _width(code)
        _need(data, pos, width, end)
        return pos + width
    if code in _VARIABLE or code in _COMPOUND or code in _ARRAY:
        # the element is the constructor's encoding without the constructor byte: reuse _skip on a shifted view
        return _skip_body(data, code, pos, end, depth)
    raise DecodeError(f"0x{code:02x} cannot be an array's element constructor")


def _skip_body(data: bytes | memoryview, code: int, pos: int, end: int, depth: int) -> int:
    """Skip a variable-width, compound or array value whose constructor ``code`` was read before ``pos``."""
    if depth < 0:
        raise DecodeError("values are nested too deeply")
    if code in _VARIABLE:
        if code < 0xB0:
            _need(data, pos, 1, end)
            size, pos = data[pos], pos + 1
        else:
            _need(data, pos, 4, end)
            size, pos = _U32.unpack_from(data, pos)[0], pos + 4
        _need(data, pos, size, end)
        if code in (0xA1, 0xB1):
            try:
                bytes(data[pos : pos + size]).decode("utf-8")
            except UnicodeDecodeError:
                raise DecodeError("a string value is not valid UTF-8") from None
        return pos + size
    item, count, stop = _size_count(data, code, pos, end)
    if code in _ARRAY:
        item, element = _element_constructor(data, item, stop, depth - 1)
        for _ in range(count):
            item = _skip_element(data, element, item, stop, depth - 1)
    else:
        if code in (0xC1, 0xD1) and count % 2:
            raise DecodeError("a map value has an odd number of items")
        for _ in range(count):
            item = _skip(data, item, stop, depth - 1)
    if item != stop:
        raise DecodeError("a compound value's items do not fill its declared size")
    return stop


def jump(data: bytes, pos: int) -> int:
    """The position after the value at ``pos``, from its constructor and declared size alone.

    Nothing inside the value is looked at: this is for encodings :func:`skip` checked when they
    arrived (a stored message), read again on their way out. It raises ``IndexError`` or
    :class:`DecodeError` on a constructor it does not know and may return a position past the end;
    the caller compares with the end.
    """
    code = data[pos]
    if code in _VARIABLE or code in _COMPOUND or code in _ARRAY:
        if code & 0x10 == 0:  # 0xa?, 0xc?, 0xe?: a one-byte size; 0xb?, 0xd?, 0xf?: four bytes
            return pos + 2 + data[pos + 1]
        return pos + 5 + int(_U32.unpack_from(data, pos + 1)[0])
    if code == 0x00:
        return jump(data, jump(data, pos + 1))
    if code in _KNOWN_FIXED:
        return pos + 1 + _FIXED_WIDTHS[code >> 4]
    raise DecodeError(f"unknown AMQP constructor 0x{code:02x}")


# ------------------------------------------------------------------------------------------ decoding
_UNPACK = {
    0x50: struct.Struct(">B"),
    0x51: struct.Struct(">b"),
    0x52: struct.Struct(">B"),
    0x53: struct.Struct(">B"),
    0x54: struct.Struct(">b"),
    0x55: struct.Struct(">b"),
    0x60: struct.Struct(">H"),
    0x61: struct.Struct(">h"),
    0x70: struct.Struct(">I"),
    0x71: struct.Struct(">i"),
    0x72: struct.Struct(">f"),
    0x80: struct.Struct(">Q"),
    0x81: struct.Struct(">q"),
    0x82: struct.Struct(">d"),
    0x83: struct.Struct(">q"),
}
_WRAP: dict[int, Any] = {
    0x50: proton.ubyte,
    0x51: proton.byte,
    0x52: proton.uint,
    0x53: proton.ulong,
    0x54: proton.int32,
    0x55: int,
    0x60: proton.ushort,
    0x61: proton.short,
    0x70: proton.uint,
    0x71: proton.int32,
    0x72: proton.float32,
    0x80: proton.ulong,
    0x81: int,
    0x82: float,
    0x83: proton.timestamp,
}


def hashable(value: Any) -> Any:
    """``value`` usable as a dict key: lists become tuples, maps tuples of pairs."""
    if isinstance(value, list):
        return tuple(hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple((hashable(k), hashable(v)) for k, v in value.items())
    if isinstance(value, proton.Described):  # unhashable in proton
        return (hashable(value.descriptor), hashable(value.value))
    return value


def decode(
    data: bytes | memoryview, pos: int = 0, end: int | None = None, max_depth: int = DEFAULT_MAX_DEPTH
) -> tuple[Any, int]:
    """The value at ``pos`` and the position after it (checked as :func:`skip` checks)."""
    return _decode(data, pos, len(data) if end is None else end, max_depth)


def _decode(data: bytes | memoryview, pos: int, end: int, depth: int) -> tuple[Any, int]:
    if depth < 0:
        raise DecodeError("values are nested too deeply")
    _need(data, pos, 1, end)
    code = data[pos]
    pos += 1
    if code == 0x00:
        descriptor, pos = _decode(data, pos, end, depth - 1)
        value, pos = _decode(data, pos, end, depth - 1)
        return proton.Described(hashable(descriptor), value), pos
    return _decode_body(data, code, pos, end, depth)


def _decode_body(data: bytes | memoryview, code: int, pos: int, end: int, depth: int) -> tuple[Any, int]:
    if code == 0x40:
        return None, pos
    if code == 0x41:
        return True, pos
    if code == 0x42:
        return False, pos
    if code == 0x43:
        return proton.uint(0), pos
    if code == 0x44:
        return proton.ulong(0), pos
    if code == 0x45:
        return [], pos
    if code == 0x56:
        _need(data, pos, 1, end)
        return data[pos] != 0, pos + 1
    unpack = _UNPACK.get(code)
    if unpack is not None:
        _need(data, pos, unpack.size, end)
        return _WRAP[code](unpack.unpack_from(data, pos)[0]), pos + unpack.size
    if code == 0x73:
        _need(data, pos, 4, end)
        point = _U32.unpack_from(data, pos)[0]
        if point > 0x10FFFF:
            raise DecodeError(f"char value U+{point:X} is not a Unicode code point")
        return proton.char(chr(point)), pos + 4
    if code == 0x98:
        _need(data, pos, 16, end)
        return uuid.UUID(bytes=bytes(data[pos : pos + 16])), pos + 16
    if code in (0x74, 0x84, 0x94):
        width = _width(code)
        _need(data, pos, width, end)
        raw = bytes(data[pos : pos + width])
        kind = {0x74: proton.decimal32, 0x84: proton.decimal64, 0x94: proton.decimal128}[code]
        number = int.from_bytes(raw, "big")
        return (kind(raw) if code == 0x94 else kind(number)), pos + width
    if code in _VARIABLE:
        if code < 0xB0:
            _need(data, pos, 1, end)
            size, pos = data[pos], pos + 1
        else:
            _need(data, pos, 4, end)
            size, pos = _U32.unpack_from(data, pos)[0], pos + 4
        _need(data, pos, size, end)
        raw = bytes(data[pos : pos + size])
        if code in (0xA0, 0xB0):
            return raw, pos + size
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise DecodeError("a string value is not valid UTF-8") from None
        return (text if code in (0xA1, 0xB1) else proton.symbol(text)), pos + size
    if code in _COMPOUND:
        item, count, stop = _size_count(data, code, pos, end)
        items = []
        for _ in range(count):
            value, item = _decode(data, item, stop, depth - 1)
            items.append(value)
        if item != stop:
            raise DecodeError("a compound value's items do not fill its declared size")
        if code in (0xC0, 0xD0):
            return items, stop
        if count % 2:
            raise DecodeError("a map value has an odd number of items")
        return {hashable(k): v for k, v in zip(items[0::2], items[1::2], strict=True)}, stop
    if code in _ARRAY:
        item, count, stop = _size_count(data, code, pos, end)
        described: Any = None
        _need(data, item, 1, stop)
        if data[item] == 0x00:
            described, item = _decode(data, item + 1, stop, depth - 1)
        item, element = _element_constructor(data, item, stop, depth - 1)
        values = []
        for _ in range(count):
            value, item = _decode_body(data, element, item, stop, depth - 1)
            values.append(value if described is None else proton.Described(hashable(described), value))
        if item != stop:
            raise DecodeError("an array's items do not fill its declared size")
        return values, stop
    raise DecodeError(f"unknown AMQP constructor 0x{code:02x}")


class Reader:
    """Reads the leading fields of a performative or section, checking each value it passes."""

    def __init__(self, data: memoryview | bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> None:
        self.data = data if isinstance(data, memoryview) else memoryview(data)
        self.pos = 0
        self.max_depth = max_depth

    def _byte(self) -> int:
        if self.pos >= len(self.data):
            raise DecodeError("the data ends early")
        value = self.data[self.pos]
        self.pos += 1
        return value

    def descriptor(self) -> int | None:
        """The numeric descriptor here (None for a symbolic one, which is skipped)."""
        if self._byte() != 0x00:
            raise DecodeError("not a described type")
        code = self._byte()
        if code == 0x53:
            return self._byte()
        if code == 0x80:
            if self.pos + 8 > len(self.data):
                raise DecodeError("the data ends early")
            value = int(struct.unpack_from(">Q", self.data, self.pos)[0])
            self.pos += 8
            return value
        self.pos -= 1
        self.skip()
        return None

    def skip(self) -> None:
        """Step over one value, checking it."""
        self.pos = _skip(self.data, self.pos, len(self.data), self.max_depth)

    def _list_header(self) -> tuple[int, int]:
        """(item count, end) of the list here."""
        code = self._byte()
        if code == 0x45:
            return 0, self.pos
        if code in (0xC0, 0xD0):
            first, count, stop = _size_count(self.data, code, self.pos, len(self.data))
            self.pos = first
            return count, stop
        raise DecodeError(f"not a list (constructor 0x{code:02x})")

    def field_spans(self) -> list[tuple[int, int]]:
        """The (start, end) of every field of the list here; leaves ``pos`` at the list's end."""
        count, stop = self._list_header()
        spans = []
        for _ in range(count):
            begin = self.pos
            self.pos = _skip(self.data, self.pos, stop, self.max_depth - 1)
            spans.append((begin, self.pos))
        if self.pos != stop:
            raise DecodeError("a list's items do not fill its declared size")
        return spans

    def map_spans(self) -> list[tuple[int, int]]:
        """The (start, end) of every key and value of the map here; leaves ``pos`` at the map's end."""
        code = self._byte()
        if code not in (0xC1, 0xD1):
            raise DecodeError(f"not a map (constructor 0x{code:02x})")
        first, count, stop = _size_count(self.data, code, self.pos, len(self.data))
        if count % 2:
            raise DecodeError("a map value has an odd number of items")
        self.pos = first
        spans = []
        for _ in range(count):
            begin = self.pos
            self.pos = _skip(self.data, self.pos, stop, self.max_depth - 1)
            spans.append((begin, self.pos))
        if self.pos != stop:
            raise DecodeError("a map's items do not fill its declared size")
        return spans

    def list_fields(self, wanted: int) -> list[Any]:
        """The first ``wanted`` fields of the list here, decoded (the rest are checked and skipped)."""
        count, stop = self._list_header()
        out = []
        for index in range(count):
            if index < wanted:
                value, self.pos = _decode(self.data, self.pos, stop, self.max_depth - 1)
                out.append(value)
            else:
                self.pos = _skip(self.data, self.pos, stop, self.max_depth - 1)
        if self.pos != stop:
            raise DecodeError("a list's items do not fill its declared size")
        return out

    def value(self) -> Any:
        """Decode the value here."""
        value, self.pos = _decode(self.data, self.pos, len(self.data), self.max_depth)
        return value


def _list_at(data: bytes | memoryview, pos: int, end: int) -> tuple[int, int, int]:
    """(position of the first item, item count, end) of the list at ``pos``."""
    _need(data, pos, 1, end)
    code = data[pos]
    if code == 0x45:
        return pos + 1, 0, pos + 1
    if code in (0xC0, 0xD0):
        return _size_count(data, code, pos + 1, end)
    raise DecodeError(f"not a list (constructor 0x{code:02x})")


def list_fields(
    data: bytes | memoryview, pos: int, wanted: int, max_depth: int = DEFAULT_MAX_DEPTH
) -> tuple[list[Any], int]:
    """The first ``wanted`` items of the list at ``pos`` decoded (the rest checked and skipped), and the position
    after the list: one pass over a performative's fields."""
    item, count, stop = _list_at(data, pos, len(data))
    out = []
    for index in range(count):
        if index < wanted:
            value, item = _decode(data, item, stop, max_depth - 1)
            out.append(value)
        else:
            item = _skip(data, item, stop, max_depth - 1)
    if item != stop:
        raise DecodeError("a list's items do not fill its declared size")
    return out, stop


def list_items(
    data: bytes | memoryview, pos: int, max_depth: int = DEFAULT_MAX_DEPTH
) -> tuple[list[Any], list[bytes], int]:
    """Every item of the list at ``pos``, decoded and as its bytes, and the position after the list (one pass)."""
    item, count, stop = _list_at(data, pos, len(data))
    values, raws = [], []
    for _ in range(count):
        value, after = _decode(data, item, stop, max_depth - 1)
        values.append(value)
        raws.append(bytes(data[item:after]))
        item = after
    if item != stop:
        raise DecodeError("a list's items do not fill its declared size")
    return values, raws, stop


# ------------------------------------------------------------------------------------------ encoding
NULL = b"\x40"


def encode_uint(value: int) -> bytes:
    if value == 0:
        return b"\x43"
    if value < 256:
        return bytes((0x52, value))
    return b"\x70" + _U32.pack(value & 0xFFFFFFFF)


def encode_string(value: str, code8: int = 0xA1) -> bytes:
    raw = value.encode("utf-8")
    if len(raw) < 256:
        return bytes((code8, len(raw))) + raw
    return bytes((code8 + 0x10,)) + _U32.pack(len(raw)) + raw


def encode_symbol(value: str) -> bytes:
    return encode_string(value, 0xA3)


def encode_list(items: list[bytes]) -> bytes:
    body = b"".join(items)
    if len(body) + 1 <= 255 and len(items) <= 255:
        return bytes((0xC0, len(body) + 1, len(items))) + body
    return b"\xd0" + _U32.pack(len(body) + 4) + _U32.pack(len(items)) + body


def encode_described(code: int, value: bytes) -> bytes:
    return bytes((0x00, 0x53, code)) + value
