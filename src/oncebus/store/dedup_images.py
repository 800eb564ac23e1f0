"""Images of the dedup indexes, written at a clean shutdown so the next start reads them in bulk.

Rebuilding an index from the ``dedup_key`` rows costs a few microseconds of Python per key
(4.5 s per million keys): an image is the index's own arrays (``DedupIndex.dump``), read back with
``readinto`` at disk speed. The SQLite rows stay the truth; an image is used only when it is known to
hold exactly what they hold:

- it is written after the store's writer has stopped (every unit committed) and only if no write
  failed since the broker last loaded (memory never held a key the store does not);
- its random token is committed to the ``dedup_snapshot`` table after the file is durable (written to
  a temporary name, fsynced, renamed, directory fsynced); a crash before that leaves no token;
- the next ``load`` takes the token out of the table (committed before anything else is written), so
  the image serves that one start: a crash later, or any other start, rebuilds from the rows;
- each entity's image carries its length and CRC-32; one that does not check out is rebuilt from the
  rows (``ImageError``), as is an entity the file does not hold.

File layout (little-endian): magic ``ONCEDDUP``, format version (u32), token (16 bytes), entity count
(u32); per entity: path length (u32), path (UTF-8), image length (u64), image CRC-32 (u32), image.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

MAGIC = b"ONCEDDUP"
FORMAT = 1
_HEADER = struct.Struct("<8sI16sI")
_ENTRY = struct.Struct("<I")
_IMAGE = struct.Struct("<QI")


class Dumpable(Protocol):
    def dump(self, file: BinaryIO) -> None: ...


@dataclass(frozen=True, slots=True)
class DedupImage:
    """Where one entity's index image is: ``open`` gives the file at its first byte."""

    path: Path
    offset: int
    length: int
    crc: int

    def open(self) -> BinaryIO:
        file = open(self.path, "rb")
        file.seek(self.offset)
        return file


class _Counting:
    """A file writer keeping the CRC-32 and length of what went through it."""

    def __init__(self, file: BinaryIO) -> None:
        self.file = file
        self.crc = 0
        self.length = 0

    def write(self, data: bytes | memoryview) -> int:
        self.crc = zlib.crc32(data, self.crc)
        self.length += self.file.write(data)
        return len(data)


def image_path(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + ".dedup")


def save(db: sqlite3.Connection, path: Path, indexes: Iterable[tuple[str, Dumpable]]) -> None:
    """Write the images and commit their token (``db`` in autocommit mode, nothing else writing)."""
    token = secrets.token_bytes(16)
    entries = list(indexes)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as file:
            file.write(_HEADER.pack(MAGIC, FORMAT, token, len(entries)))
            for name, index in entries:
                encoded = name.encode()
                file.write(_ENTRY.pack(len(encoded)) + encoded)
                at = file.tell()
                file.write(_IMAGE.pack(0, 0))
                counting = _Counting(file)  # type: ignore[arg-type]
                index.dump(counting)  # type: ignore[arg-type]
                end = file.tell()
                file.seek(at)
                file.write(_IMAGE.pack(counting.length, counting.crc))
                file.seek(end)
            file.flush()
            os.fsync(file.fileno())
    except BaseException:
        discard(tmp)  # a full disk: nothing half-written is left behind
        raise
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    db.execute("DELETE FROM dedup_snapshot")
    db.execute("INSERT INTO dedup_snapshot (token) VALUES (?)", (token,))


def take(db: sqlite3.Connection, path: Path) -> dict[str, DedupImage]:
    """The images the store's token vouches for (none without one); the token is taken out, committed, first."""
    row = db.execute("SELECT token FROM dedup_snapshot").fetchone()
    if row is None:
        return {}
    db.execute("DELETE FROM dedup_snapshot")
    try:
        return _read_directory(path, bytes(row[0]))
    except (OSError, ValueError, struct.error, UnicodeDecodeError):
        return {}


def discard(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _read_directory(path: Path, token: bytes) -> dict[str, DedupImage]:
    images: dict[str, DedupImage] = {}
    size = path.stat().st_size
    with open(path, "rb") as file:
        magic, version, stored_token, count = _HEADER.unpack(file.read(_HEADER.size))
        if magic != MAGIC or version != FORMAT or stored_token != token:
            return {}
        for _ in range(count):
            (name_length,) = _ENTRY.unpack(file.read(_ENTRY.size))
            name = file.read(name_length).decode()
            length, crc = _IMAGE.unpack(file.read(_IMAGE.size))
            offset = file.tell()
            if offset + length > size:
                return {}
            images[name] = DedupImage(path, offset, length, crc)
            file.seek(offset + length)
    return images
