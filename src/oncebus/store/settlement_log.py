"""The settlement log: a settlement confirmed by one appended record instead of a SQLite commit.

A completion (and an abandon, a deferral, a dead-letter move) committed on the caller's thread used to be a
SQLite transaction of its own: about 65 us of server CPU a completed message (the message row, its index, its
content's reference count, the counters, each a page written to the WAL). Here it is one record appended to
``<database>-settled`` with one ``write``: in the OS's hands when the call returns, so a crash of the process
cannot lose it, exactly as the ``synchronous=NORMAL`` commit it replaces. The writer thread applies the records
to the database in batches, with the database's mark of the last record applied (``settlement_log`` table) in
the same transaction, and empties the file once that transaction is durable; a start replays the records after
the mark, so a record is applied once whatever crashes between.

A record: payload length and CRC-32 (4 bytes each, big-endian), then the payload, JSON
``[store id, number, [op, ...]]``. A record cut short or failing its CRC can only be the last write before a crash,
never confirmed: replay stops there. A record of another store id was left by another database (one moved away
with its log left behind) and is not applied. Only settlements whose fields are plain values are logged
(``loggable``); an abandon that merges application properties commits as before.
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


def encode(store_id: str, number: int, unit: Sequence[Op]) -> bytes:
    ops = ",".join(_op_json(op) for op in unit)
    payload = f"[{_json_text(store_id)},{int(number)},[{ops}]]".encode()
    return HEADER.pack(len(payload), zlib.crc32(payload)) + payload


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
            owner, number, ops = json.loads(payload)
            if owner == store_id:
                records.append((int(number), [_op(fields) for fields in ops]))
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
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
