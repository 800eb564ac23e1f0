"""The settlement log: a settlement confirmed by one appended record instead of a SQLite commit.

A completion (and an abandon, a deferral, a dead-letter move) committed on the caller's thread used to be a
SQLite transaction of its own: about 65 us of server CPU a completed message (the message row, its index, its
content's reference count, the counters, each a page written to the WAL). Here it is one record appended to
``<database>-settled`` with one ``write``: in the OS's hands when the call returns, so a crash of the process
cannot lose it, exactly as the ``synchronous=NORMAL`` commit it replaces. The writer thread applies the records
to the database in batches, with the database's mark of the last record applied (``settlement_log`` table) in
the same transaction, and empties the file once that transaction is durable; a start replays the records after
the mark, so a record is applied once whatever crashes between.

A record: payload length and CRC-32 of the payload (4 bytes each, big-endian), then the payload. The payload's first
byte names its format:

- ``0x02`` (written since session 18): binary. After the format byte: the store id (a text), the record's number
  (8 bytes), the count of ops (4 bytes), then each op: one byte for its kind and its fields in order, ``d`` (a
  delete: path, sequence number), ``u`` (an update: path, sequence number, state, delivery count), ``m`` (a move:
  path, sequence number, to path, state, dead-letter reason, description, source, the last three optional texts),
  ``c`` (counters: entity, next sequence number, count of counters, then name and delta each). Integers are 8
  bytes signed, the count of counters 2 bytes, a text is its UTF-8 length (2 bytes; ``0xFFFE`` then 4 bytes when
  it is that long or longer) and its bytes, an optional text absent is the length ``0xFFFF``; all big-endian.
- ``[`` (the first format, still read: a log the release before wrote is replayed after an upgrade): JSON
  ``[store id, number, [op, ...]]``, each op a list of its kind and fields as above (counters an object).

A record cut short or failing its CRC or its format (any error decoding it) can only be the last write before a crash,
never confirmed: replay stops there. A record of another store id was left by another database (one moved away with
its log left behind) and is not applied. Only settlements whose fields are plain values are logged (``loggable``); an
abandon that merges application properties commits as before.
"""

from __future__ import annotations

import functools
import json
import os
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from oncebus.store.base import AddCounters, DeleteMessage, MoveMessage, Op, UpdateMessage

HEADER = struct.Struct(">II")
MAX_PAYLOAD = 16 * 1024 * 1024  # a larger length is damage, not a record


def settlements_only(unit: Sequence[Op]) -> bool:
    """A unit of settlements only: what may commit before it is durable (``GroupCommitWriter.submit``)."""
    for op in unit:
        if not isinstance(op, DeleteMessage | UpdateMessage | MoveMessage | AddCounters):
            return False
    return True


def loggable(unit: Sequence[Op]) -> bool:
    """A unit the log can carry: settlements of plain values only."""
    for op in unit:
        if isinstance(op, UpdateMessage):
            if op.application_properties is not None:
                return False
        elif not isinstance(op, DeleteMessage | MoveMessage | AddCounters):
            return False
    return bool(unit)


def _op_fields(op: Op) -> list[Any]:
    match op:
        case DeleteMessage(path=path, sequence_number=seq):
            return ["d", path, seq]
        case UpdateMessage(path=path, sequence_number=seq, state=state, delivery_count=count):
            return ["u", path, seq, state, count]
        case MoveMessage():
            return [
                "m",
                op.path,
                op.sequence_number,
                op.to_path,
                op.state,
                op.dead_letter_reason,
                op.dead_letter_error_description,
                op.dead_letter_source,
            ]
        case AddCounters(entity=entity, next_sequence_number=next_seq, counters=counters):
            return ["c", entity, next_seq, counters]
    raise ValueError(f"the settlement log cannot carry {type(op).__name__}")


def _op(fields: list[Any]) -> Op:
    kind = fields[0]
    if kind == "d":
        return DeleteMessage(fields[1], int(fields[2]))
    if kind == "u":
        return UpdateMessage(fields[1], int(fields[2]), int(fields[3]), int(fields[4]))
    if kind == "m":
        return MoveMessage(fields[1], int(fields[2]), fields[3], int(fields[4]), fields[5], fields[6], fields[7])
    if kind == "c":
        return AddCounters(fields[1], int(fields[2]), {str(k): int(v) for k, v in fields[3].items()})
    raise ValueError(f"unknown settlement record {kind!r}")


_json_text = functools.lru_cache(maxsize=4096)(json.dumps)  # entity paths and counter names recur


def _op_json(op: Op) -> str:
    """An op's record fields as compact JSON: the same text ``json.dumps`` gives, built directly for the ops every
    completion writes (a delete and its counters), so appending a record costs little on the loop."""
    if type(op) is DeleteMessage and type(op.sequence_number) is int:
        return f'["d",{_json_text(op.path)},{op.sequence_number}]'
    if (
        type(op) is AddCounters
        and type(op.next_sequence_number) is int
        and all(type(k) is str and type(v) is int for k, v in op.counters.items())
    ):
        counts = ",".join(f"{_json_text(k)}:{v}" for k, v in op.counters.items())
        return f'["c",{_json_text(op.entity)},{op.next_sequence_number},{{{counts}}}]'
    return json.dumps(_op_fields(op), separators=(",", ":"))


def encode_json(store_id: str, number: int, unit: Sequence[Op]) -> bytes:
    """A record in the first format (JSON), as the release before session 18 wrote it (for tests and benchmarks:
    ``encode`` writes the binary one)."""
    ops = ",".join(_op_json(op) for op in unit)
    payload = f"[{_json_text(store_id)},{int(number)},[{ops}]]".encode()
    return HEADER.pack(len(payload), zlib.crc32(payload)) + payload


BINARY = 2  # the binary format's first payload byte (a JSON payload starts with ``[``, 0x5B)
_JSON = ord("[")
_INT = struct.Struct(">q")
_COUNT = struct.Struct(">H")
_LONG = struct.Struct(">I")
_LONG_TEXT = 0xFFFE  # a text of this many bytes or more: this, then its length in 4 bytes
_ABSENT = 0xFFFF  # an optional text absent


@functools.lru_cache(maxsize=4096)  # entity paths, counter names and the store id recur
def _text(value: str) -> bytes:
    data = value.encode()
    if len(data) >= _LONG_TEXT:
        return _COUNT.pack(_LONG_TEXT) + _LONG.pack(len(data)) + data
    return _COUNT.pack(len(data)) + data


def _optional(value: str | None) -> bytes:
    return _COUNT.pack(_ABSENT) if value is None else _text(value)


_pack_int = _INT.pack
_pack_count = _COUNT.pack


@functools.lru_cache(maxsize=4096)
def _head(kind: bytes, path: str) -> bytes:
    return kind + _text(path)


@functools.lru_cache(maxsize=4096)  # a completion's counters are the same few deltas of the same few entities
def _counter(name: str, delta: int) -> bytes:
    return _text(name) + _pack_int(delta)


def _op_binary(op: Op) -> bytes:
    kind = type(op)
    if kind is DeleteMessage:
        return _head(b"d", op.path) + _pack_int(op.sequence_number)  # type: ignore[union-attr]
    if kind is AddCounters:
        assert isinstance(op, AddCounters)
        counters = op.counters
        head = _head(b"c", op.entity) + _pack_int(op.next_sequence_number) + _pack_count(len(counters))
        return head + b"".join([_counter(name, delta) for name, delta in counters.items()])
    if kind is UpdateMessage:
        assert isinstance(op, UpdateMessage)
        return _head(b"u", op.path) + _pack_int(op.sequence_number) + _pack_int(op.state) + _pack_int(op.delivery_count)
    if kind is MoveMessage:
        assert isinstance(op, MoveMessage)
        return b"".join(
            (
                _head(b"m", op.path),
                _pack_int(op.sequence_number),
                _text(op.to_path),
                _pack_int(op.state),
                _optional(op.dead_letter_reason),
                _optional(op.dead_letter_error_description),
                _optional(op.dead_letter_source),
            )
        )
    raise ValueError(f"the settlement log cannot carry {type(op).__name__}")


def encode(store_id: str, number: int, unit: Sequence[Op]) -> bytes:
    """A record in the binary format (``BINARY``)."""
    payload = _head(b"\x02", store_id) + _pack_int(number) + _LONG.pack(len(unit)) + b"".join(map(_op_binary, unit))
    return HEADER.pack(len(payload), zlib.crc32(payload)) + payload


class _Reader:
    """Reads a binary payload's fields in order (``struct.error``, ``UnicodeDecodeError`` or ``ValueError`` if
    it is not one)."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        value = self.data[self.pos]
        self.pos += 1
        return value

    def integer(self) -> int:
        (value,) = _INT.unpack_from(self.data, self.pos)
        self.pos += 8
        return int(value)

    def count(self) -> int:
        (value,) = _COUNT.unpack_from(self.data, self.pos)
        self.pos += 2
        return int(value)

    def long(self) -> int:
        (value,) = _LONG.unpack_from(self.data, self.pos)
        self.pos += 4
        return int(value)

    def optional(self) -> str | None:
        length = self.count()
        if length == _ABSENT:
            return None
        if length == _LONG_TEXT:
            length = self.long()
            if length < _LONG_TEXT:
                raise ValueError("a short text in the long form")  # never written so: one unit, one encoding
        end = self.pos + length
        if end > len(self.data):
            raise ValueError("a text runs past its record")
        value = self.data[self.pos : end].decode()
        self.pos = end
        return value

    def text(self) -> str:
        value = self.optional()
        if value is None:
            raise ValueError("a text is missing")
        return value


def _decode_binary(payload: bytes) -> tuple[str, int, list[Op]]:
    read = _Reader(payload)
    if read.byte() != BINARY:
        raise ValueError("not a binary record")
    owner = read.text()
    number = read.integer()
    ops: list[Op] = []
    for _ in range(read.long()):
        kind = read.byte()
        if kind == 0x64:  # d
            ops.append(DeleteMessage(read.text(), read.integer()))
        elif kind == 0x75:  # u
            ops.append(UpdateMessage(read.text(), read.integer(), read.integer(), read.integer()))
        elif kind == 0x6D:  # m
            path, seq, to_path, state = read.text(), read.integer(), read.text(), read.integer()
            ops.append(MoveMessage(path, seq, to_path, state, read.optional(), read.optional(), read.optional()))
        elif kind == 0x63:  # c
            entity, next_seq = read.text(), read.integer()
            counters = {}
            count = read.count()
            for _ in range(count):
                name = read.text()
                counters[name] = read.integer()
            if len(counters) != count:
                raise ValueError("a counter named twice")  # never written so: a dict's names are distinct
            ops.append(AddCounters(entity, next_seq, counters))
        else:
            raise ValueError(f"unknown settlement op {kind!r}")
    if read.pos != len(payload):
        raise ValueError("bytes after the record's ops")
    return owner, number, ops


def _decode_payload(payload: bytes) -> tuple[str, int, list[Op]]:
    if payload and payload[0] == BINARY:
        return _decode_binary(payload)
    if payload and payload[0] == _JSON:
        owner, number, ops = json.loads(payload)
        return owner, int(number), [_op(fields) for fields in ops]
    raise ValueError("a record of no known format")


def decode(data: bytes, store_id: str) -> tuple[list[tuple[int, list[Op]]], int]:
    """The whole records of ``store_id`` at the start of ``data`` and the offset where the whole records end (less
    than ``len(data)`` when the rest is a record cut short or damaged: the crash's last write)."""
    records: list[tuple[int, list[Op]]] = []
    pos = 0
    while pos + HEADER.size <= len(data):
        length, crc = HEADER.unpack_from(data, pos)
        start = pos + HEADER.size
        if length > MAX_PAYLOAD or start + length > len(data):
            break
        payload = data[start : start + length]
        if zlib.crc32(payload) != crc:
            break
        try:
            owner, number, ops = _decode_payload(payload)
            if owner == store_id:
                records.append((number, ops))
        except Exception:  # not a record this log wrote (json's NaN or Infinity, nesting past its limit, ...)
            break
        pos = start + length
    return records, pos


class SettlementLog:
    """The log file, opened for appending (one ``write`` a record; cut back to its size if a write fails)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        self.size = os.fstat(self._fd).st_size
        self.damaged = False  # a failed append could not be cut back: a torn record may stand before later ones

    def read(self) -> bytes:
        return os.pread(self._fd, self.size, 0)

    def append(self, record: bytes) -> None:
        """Append ``record`` whole, or raise with the file as it was (``OSError``)."""
        written = 0
        try:
            while written < len(record):
                written += os.write(self._fd, record[written:])
        except OSError:
            if written:
                try:
                    os.ftruncate(self._fd, self.size)  # no part of a failed record stays to stop a replay early
                except OSError:
                    self.damaged = True
            raise
        self.size += len(record)

    def clear(self) -> None:
        os.ftruncate(self._fd, 0)
        self.size = 0
        self.damaged = False

    def sync(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        os.close(self._fd)
