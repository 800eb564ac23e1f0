"""Images of the dedup indexes: checkpoints written while serving and at a clean stop, read in bulk at start.

Rebuilding an index from the ``dedup_key`` rows costs a few microseconds of Python per key
(4.5 s per million keys): an image is the index's own arrays (``DedupIndex.dump``), read back with
``readinto`` at disk speed. The SQLite rows stay the truth; an image is used only as far as it is known to
hold what they hold:

- each image has a *mark* (``since_us``, per entity): it holds every key first accepted before the mark that
  the rows held when the image was committed, and nothing the rows do not hold; a start loads the image and
  then reads only the rows first accepted at or after the mark (a key read again is harmless);
- it is written to a new file (a temporary name, fsynced, renamed, directory fsynced), and only then are its
  token, file name and marks committed to ``dedup_checkpoint``, in place of the previous checkpoint's; the
  previous file is deleted after that commit. A crash at any point leaves the previous checkpoint (its rows
  and its file) or the new one, never a file the rows do not vouch for;
- deleting an entity deletes its row in the same transaction: a queue made again under the same name starts
  from its own rows;
- each entity's image carries its length and CRC-32; one that does not check out (or a file that is missing,
  or holds another token) is rebuilt from all its rows (``ImageError``).

While serving, an image is written by a forked child process (``fork_write``): the fork is the only pause of
the broker's loop (copying the page tables: measured 7 ms at 90 MB of memory, 30 to 55 ms at 700 MB; the child
sees the memory as it was at the fork, copy-on-write, as Redis's BGSAVE does), the child writes and fsyncs the
file and exits. The
store commits the checkpoint's rows only once every unit submitted before the fork is committed, and only if
no write failed meanwhile (see ``GroupCommitWriter.checkpoint_dedup`` in ``store/writer.py``).

File layout (little-endian): magic ``ONCEDDUP``, format version (u32), token (16 bytes), entity count
(u32); per entity: path length (u32), path (UTF-8), image length (u64), image CRC-32 (u32), image.
"""

from __future__ import annotations

import contextlib
import gc
import os
import secrets
import signal
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
TMP_SUFFIX = ".tmp"


class Dumpable(Protocol):
    def dump(self, file: BinaryIO) -> None: ...


@dataclass(frozen=True, slots=True)
class DedupImage:
    """Where one entity's index image is (``open`` gives the file at its first byte), and its mark: the keys
    first accepted at or after ``since_us`` are not all in it (read them from the rows)."""

    path: Path
    offset: int
    length: int
    crc: int
    since_us: int = 0

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
    """The name schema 4 gave its one image file (read once more after a migration)."""
    return db_path.with_name(db_path.name + ".dedup")


def new_image_path(db_path: Path) -> Path:
    """A fresh name for a checkpoint's file, next to the database."""
    return db_path.with_name(f"{db_path.name}.dedup.{secrets.token_hex(8)}")


def write(path: Path, token: bytes, entries: list[tuple[str, Dumpable]]) -> None:
    """Write the images to ``path`` durably (temporary name, fsync, rename, directory fsync); nothing is left
    behind if it fails (a full disk)."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    try:
        with open(tmp, "wb") as file:
            file.write(_HEADER.pack(MAGIC, FORMAT, token, len(entries)))
            for name, index in entries:
                encoded = name.encode()
                file.write(_ENTRY.pack(len(encoded)) + encoded)
                at = file.tell()
                file.write(_IMAGE.pack(0, 0))
                counting = _Counting(file)
                index.dump(counting)  # type: ignore[arg-type]
                end = file.tell()
                file.seek(at)
                file.write(_IMAGE.pack(counting.length, counting.crc))
                file.seek(end)
            file.flush()
            os.fsync(file.fileno())
    except BaseException:
        discard(tmp)
        raise
    os.replace(tmp, path)
    _sync_directory(path.parent)


def fork_write(path: Path, token: bytes, entries: list[tuple[str, Dumpable]]) -> int:
    """``write`` in a forked child process, on the memory as it is now; returns the child's pid (exit status 0:
    the file is durable). The child runs nothing but this: no collector, no inherited descriptor (a listening
    socket or the data directory's lock must not outlive the parent), no exit handler."""
    pid = os.fork()
    if pid:
        return pid
    status = 1
    try:
        gc.disable()
        os.closerange(3, _max_fd())
        for number in (signal.SIGINT, signal.SIGTERM):
            signal.signal(number, signal.SIG_DFL)
        write(path, token, entries)
        status = 0
    except BaseException:  # the parent sees the status, and the next checkpoint tries again
        pass
    finally:
        os._exit(status)


def _max_fd() -> int:
    try:
        return int(os.sysconf("SC_OPEN_MAX"))
    except (ValueError, OSError):
        return 65536


def commit(db: sqlite3.Connection, path: Path, token: bytes, marks: dict[str, int]) -> None:
    """Make ``path`` (written by ``write``) the checkpoint of the entities in ``marks`` (entity -> since_us), in
    place of every earlier one, inside the caller's transaction."""
    db.execute("DELETE FROM dedup_checkpoint")
    db.executemany(
        "INSERT INTO dedup_checkpoint (entity, image, token, since_us) VALUES (?, ?, ?, ?)",
        [(entity, path.name, token, since) for entity, since in marks.items()],
    )


def save(db: sqlite3.Connection, db_path: Path, indexes: Iterable[tuple[str, Dumpable]], since_us: int) -> None:
    """At a clean stop (``db`` in autocommit mode, nothing else writing): images of ``indexes`` marked
    ``since_us``, written and committed; the files of earlier checkpoints are deleted."""
    entries = list(indexes)
    token = secrets.token_bytes(16)
    path = new_image_path(db_path)
    write(path, token, entries)
    db.execute("BEGIN IMMEDIATE")
    try:
        commit(db, path, token, {name: since_us for name, _ in entries})
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        discard(path)
        raise
    remove_unreferenced(db, db_path)


def take(db: sqlite3.Connection, db_path: Path) -> dict[str, DedupImage]:
    """The images the committed checkpoint vouches for, per entity (none for an entity whose file is missing or
    holds another token: it is rebuilt from its rows)."""
    files: dict[tuple[str, bytes], dict[str, int]] = {}
    for entity, image, token, since in db.execute("SELECT entity, image, token, since_us FROM dedup_checkpoint"):
        files.setdefault((image, bytes(token)), {})[entity] = since
    found: dict[str, DedupImage] = {}
    for (image, token), marks in files.items():
        try:
            images = _read_directory(db_path.with_name(image), token)
        except (OSError, ValueError, struct.error, UnicodeDecodeError):
            continue
        for entity, since in marks.items():
            if entity in images:
                found[entity] = DedupImage(
                    images[entity].path, images[entity].offset, images[entity].length, images[entity].crc, since
                )
    return found


def remove_unreferenced(db: sqlite3.Connection, db_path: Path, *, temporary: bool = False) -> None:
    """Delete the image files no committed checkpoint names (and, with ``temporary``, half-written ones: only
    when no checkpoint of this process is being written)."""
    keep = {row[0] for row in db.execute("SELECT DISTINCT image FROM dedup_checkpoint")}
    for file in db_path.parent.glob(db_path.name + ".dedup*"):
        if file.name in keep or (file.name.endswith(TMP_SUFFIX) and not temporary):
            continue
        discard(file)


def discard(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
