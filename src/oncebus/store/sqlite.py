"""The embedded default store: one SQLite file in WAL mode, with group commit.

Units submitted by the broker queue up for a single writer thread (the
group-commit writer both stores share: ``oncebus.store.writer``; this module
gives it SQLite's part), which commits everything queued so far in one
transaction (``synchronous=FULL``: a unit is durable when its future resolves). A unit is never split across
transactions, so a send's messages and their dedup keys land together or not
at all.

Settlements submitted with ``durable=False`` (see ``store.base``): a group made of
them alone commits with ``synchronous=NORMAL`` (in WAL mode: the transaction is
written to the WAL, in the OS's hands, but not fsynced), so a crash of the process
cannot lose it but a power failure can. The WAL is a log replayed as a prefix: the
next ``synchronous=FULL`` commit's fsync makes every transaction before it durable
too, and while settlements are unsynced the writer fsyncs the WAL (and its directory)
itself within ``SETTLEMENT_SYNC_SECONDS``. A group holding any durable unit commits
with ``synchronous=FULL`` as a whole.

Failures: a transaction that fails (disk full, I/O error) is rolled back and
every unit in it gets a :class:`StoreWriteError` naming the real cause; the
store stays usable, and the next unit is tried afresh (the broker reloads what
was committed before it accepts more work). A store file that cannot be
opened or read gives a one-line :class:`StoreError` (what, which file, what to
do). If the database file or its WAL is deleted while the store is open, the
writer recreates the file from its open connection (which still sees every
committed transaction) before its next commit, or within a second when idle.

Layout and schema versions: see ``oncebus.store.sqlite_layout``. Message content
(the wire encoding, the body where it is not part of it) is read when a message is
delivered (``read_messages``, on a read-only connection of the caller's thread); start-up
reads only what the broker keeps in memory per message.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

from oncebus.core.errors import DataDirBusyError, StoreError, StoreWriteError
from oncebus.core.messages import StoredMessage
from oncebus.store import dedup_images, settlement_log
from oncebus.store import sqlite_layout as layout
from oncebus.store.base import (
    AddCounters,
    DedupIndexes,
    MessageRow,
    Op,
    PutDedupKey,
    PutEntity,
    PutSessionState,
    Snapshot,
)
from oncebus.store.settlement_log import SettlementLog
from oncebus.store.sqlite_apply import OpWriter
from oncebus.store.sqlite_layout import SCHEMA_VERSION
from oncebus.store.writer import Checkpoint, GroupCommitWriter

_LOG = logging.getLogger("oncebus.store")
IDLE_CHECK_SECONDS = 1.0
AUTOCHECKPOINT_PAGES = 1000  # SQLite's default: the writer's commits checkpoint the WAL past this many pages
# the page size of a database this store creates: SQLite's default, kept on measurement (16 KiB pages cost the writer
# 6 % more a send and 57 % more applying completions: `python bench/send_inprocess.py --page-sizes 4096,16384`,
# docs/performance-log.md, session 21)
PAGE_SIZE = 4096
# a deleted row's bytes are zeroed where that writes no more pages (its b-tree page is written anyway), not in the
# pages it frees: Debian's SQLite zeroes those too (built with SQLITE_SECURE_DELETE: about 1 us more for each
# completed message on the writer, bench/send_inprocess.py --secure-delete 1,FAST), other builds zero nothing
SECURE_DELETE = "FAST"


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    return info.st_dev, info.st_ino


def _reason(exc: BaseException) -> str:
    if isinstance(exc, sqlite3.Error):
        return str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {exc}"


class SqliteStore(GroupCommitWriter):
    """The SQLite store: its database's part of the shared group-commit writer (``store/writer.py``)."""

    idle_seconds = IDLE_CHECK_SECONDS  # the writer checks the files are still there this often when idle

    def __init__(self, path: str | Path) -> None:
        self._init_writer()
        self.path = Path(path)
        self.where = str(self.path)
        self.wal_path = self.path.with_name(self.path.name + "-wal")
        self.keys_read = 0  # dedup key rows read by load() and keys_of (what a restart replayed)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._owner = _own(self.path)
        except OSError as exc:
            raise _open_error(self.path, exc) from None
        try:
            self._db = self._connect()
        except (sqlite3.Error, OSError) as exc:
            _disown(self._owner)
            raise _open_error(self.path, exc) from None
        try:
            self._prepare()
        except BaseException as exc:
            self._db.close()
            _disown(self._owner)
            if isinstance(exc, sqlite3.Error | OSError | ValueError):
                raise _open_error(self.path, exc) from None
            raise
        try:  # files of checkpoints that were never committed, or were replaced (a crash in between)
            dedup_images.remove_unreferenced(self._db, self.path, temporary=True)
        except (OSError, sqlite3.Error) as exc:
            _LOG.warning("could not remove stale dedup index images next to %s: %s", self.path, _reason(exc))
        self._db_identity = _identity(self.path)
        self._wal_identity = _identity(self.wal_path)
        self.recreated = 0
        self._synchronous = "FULL"  # the writer connection's setting now (PRAGMA synchronous)
        self.direct_commits = 0  # settlements committed on the caller's thread (``commit_now``)
        self._autocheckpoint = AUTOCHECKPOINT_PAGES  # the writer connection's wal_autocheckpoint now
        self._checkpoint_due = False  # direct commits (which never checkpoint) since the writer's last checkpoint
        self._ops = OpWriter(self._db.execute("SELECT COALESCE(MAX(id), 0) FROM content").fetchone()[0])
        self._reader: sqlite3.Connection | None = None  # the caller's thread reads message content on its own
        self._reader_generation = -1
        # settlements confirmed by a record in the log, not applied to the database yet (``commit_now``)
        self.log_path = self.path.with_name(self.path.name + "-settled")
        self._logged: list[tuple[int, list[Op]]] = []
        self._log_clear_due = False  # applied records are in the file: emptied once their commit is durable
        self._log_broken = False  # a failed append could not be cut back: settlements commit, until emptied
        self.logged_settlements = 0
        try:
            self._log = SettlementLog(self.log_path)
        except OSError as exc:
            self._db.close()
            _disown(self._owner)
            raise _open_error(self.log_path, exc) from None
        self._log_identity = _identity(self.log_path)
        try:
            self._log_number = self._replay_log()
        except BaseException as exc:
            self._log.close()
            self._db.close()
            _disown(self._owner)
            if isinstance(exc, sqlite3.Error | OSError):
                raise _open_error(self.path, exc) from None
            raise
        self._start_writer("oncebus-sqlite-writer")

    def _replay_log(self) -> int:
        """Apply the log's records after the database's mark (what a crash left unapplied), durably; empty the
        log. Returns the number of its last record (records go on from there)."""
        db = self._db
        row = db.execute(layout.SETTLEMENT_LOG_MARK).fetchone()
        if row is None:  # a new file
            db.execute(layout.NEW_SETTLEMENT_LOG, (uuid.uuid4().hex,))
            row = db.execute(layout.SETTLEMENT_LOG_MARK).fetchone()
        applied, self._store_id = int(row[0]), str(row[1])
        records, end = settlement_log.decode(self._log.read(), self._store_id)
        if end < self._log.size:
            _LOG.warning(
                "ignoring the last %d bytes of %s: a record cut short by a crash (it was never confirmed)",
                self._log.size - end,
                self.log_path,
            )
        self._logged = [(number, ops) for number, ops in records if number > applied]
        if self._logged:
            _LOG.info("applying %d settlements from %s", len(self._logged), self.log_path)
            self._apply([], durable=True)  # with the mark, fsynced; then the log is emptied
        if self._log.size:  # records already held, or a record cut short
            self._log.clear()
        return max([applied, *(number for number, _ in records)])

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            db.execute(f"PRAGMA page_size={PAGE_SIZE}")  # (takes effect only on a file with no pages yet)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute(f"PRAGMA secure_delete={SECURE_DELETE}")
            db.execute("PRAGMA recursive_triggers=ON")  # a replaced message row releases its content
        except BaseException:
            db.close()
            raise
        return db

    def _prepare(self) -> None:
        """Create the tables of a new file, migrate an older one, refuse a newer one."""
        db = self._db
        version = db.execute("PRAGMA user_version").fetchone()[0]
        tables = db.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} was written by a newer oncebus (store schema {version}; this version reads up to "
                f"{SCHEMA_VERSION}): run that version or a newer one on it"
            )
        if tables == 0:  # a crash before the version is set leaves empty tables at 0: migrated next time
            layout.create(db)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            return
        db.executescript(layout.SCHEMA)  # IF NOT EXISTS: a table missing from an older file is added
        if version < SCHEMA_VERSION:
            self._migrate(version)

    def _migrate(self, version: int) -> None:
        """Bring an older layout up to date in one transaction: all of it, or nothing (the file stays as it was)."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            layout.migrate(db, version, dedup_images.image_path(self.path).name)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            db.execute("COMMIT")
        except Exception as exc:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise StoreError(
                f"could not migrate {self.path} from store schema {version} to {SCHEMA_VERSION} ({_reason(exc)}); "
                "the file is unchanged: free disk space if it is full, or run the earlier oncebus on it"
            ) from None
        _LOG.warning("migrated %s from store schema %d to %d", self.path, version, SCHEMA_VERSION)

    def load(self) -> Snapshot:
        with self._lock:
            self._note_load()
            try:
                self._apply_logged()  # what memory is rebuilt from holds every settlement confirmed so far
                return self._load()
            except (sqlite3.Error, ValueError, TypeError, KeyError) as exc:
                raise StoreError(
                    f"{self.path} could not be read ({_reason(exc)}): the file is damaged; restore it from a "
                    "backup, or move it (and its -wal file) away to start with an empty store"
                ) from None

    def _read_connection(self) -> sqlite3.Connection:
        """The read-only connection for ``read_messages`` and start-up's message rows (reopened after the file
        was recreated, so it reads the file the writer writes)."""
        if self._reader is None or self._reader_generation != self.recreated:
            if self._reader is not None:
                self._reader.close()
            self._reader_generation = self.recreated
            self._reader = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._reader.execute("PRAGMA query_only=ON")
        return self._reader

    def _message_rows(self) -> Iterator[MessageRow]:
        """Every stored message's in-memory part, by path and sequence number, read lazily (never its content),
        as the store is now: a read transaction (begun here, with the first rows) on a connection of its own,
        so the broker may restore them while it serves and commits more (``read_messages`` sees those)."""
        db = None
        try:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA query_only=ON")
            cursor = db.execute(layout.SELECT_ROWS)
            first = cursor.fetchmany(4096)
        except sqlite3.Error as exc:
            if db is not None:
                db.close()
            raise self._damaged(exc) from None
        return self._more_rows(db, cursor, first)

    def _more_rows(
        self, db: sqlite3.Connection, cursor: sqlite3.Cursor, rows: list[MessageRow]
    ) -> Iterator[MessageRow]:
        try:
            while rows:
                yield from rows
                rows = cursor.fetchmany(4096)
        except sqlite3.Error as exc:
            raise self._damaged(exc) from None
        finally:
            db.close()

    def _damaged(self, exc: BaseException) -> StoreError:
        return StoreError(
            f"{self.path} could not be read ({_reason(exc)}): the file is damaged; restore it from a "
            "backup, or move it (and its -wal file) away to start with an empty store"
        )

    def read_messages(self, path: str, sequence_numbers: Sequence[int]) -> dict[int, StoredMessage]:
        """The content of committed messages (those found), on the caller's thread (a read connection of its own)."""
        try:
            return layout.read_content(self._read_connection(), path, sequence_numbers)
        except sqlite3.Error as exc:
            raise StoreWriteError(f"could not read messages from {self.path}: {_reason(exc)}") from None

    def _load(self) -> Snapshot:
        db = self._db
        snapshot = Snapshot()
        for path, kind, props in db.execute("SELECT path, kind, properties FROM entity"):
            snapshot.entities.append(PutEntity(path, kind, json.loads(props)))
        snapshot.messages = self._message_rows()
        images = dedup_images.take(db, self.path)
        snapshot.dedup_images = {e.path: images[e.path] for e in snapshot.entities if e.path in images}
        # a checkpoint's mark too: a key accepted after this start must not be first accepted before it, or the
        # next start would not read its row (the clock may have been set back)
        marks = db.execute("SELECT COALESCE(MAX(since_us), 0) FROM dedup_checkpoint").fetchone()[0]
        snapshot.newest_key_us = max(
            [marks, *(layout.newest_key_us(db, e.path) for e in snapshot.entities if e.kind != "subscription")]
        )
        snapshot.keys_of = self._keys_of
        # from the rows (each entity's range of the primary key): an entity with an image, the keys since its
        # mark; one without, all of them
        snapshot.dedup_keys = self._key_rows(
            [
                (record.path, image.since_us if (image := snapshot.dedup_images.get(record.path)) else None)
                for record in snapshot.entities
                if record.kind != "subscription" and record.properties.get("requires_duplicate_detection")
            ]
        )
        for path, sid, state, updated_us in db.execute("SELECT path, session_id, state, updated_us FROM session_state"):
            snapshot.session_states.append(PutSessionState(path, sid, bytes(state), updated_us))
        for entity, next_seq, counters in db.execute("SELECT entity, next_sequence_number, counters FROM counters"):
            snapshot.counters[entity] = AddCounters(entity, next_seq, json.loads(counters))
        for path, rules in db.execute("SELECT path, rules FROM subscription_rules"):
            snapshot.rules[path] = json.loads(rules)
        return snapshot

    def _keys_of(self, entity: str) -> Iterator[PutDedupKey]:
        """One entity's keys from the rows (its image did not load), in ``first_accepted_us`` order."""
        return self._key_rows([(entity, None)])

    def _key_rows(self, entities: list[tuple[str, int | None]]) -> Iterator[PutDedupKey]:
        """The keys of ``entities`` (each with the time its keys are read from, or None: all of them) as the
        store is now (a read transaction of its own, begun here), streamed."""
        db = None
        try:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA query_only=ON")
            db.execute("BEGIN")
            db.execute("SELECT count(*) FROM entity").fetchone()  # the read transaction starts here
        except sqlite3.Error as exc:
            if db is not None:
                db.close()
            raise self._damaged(exc) from None
        return self._more_keys(db, entities)

    def _more_keys(self, db: sqlite3.Connection, entities: list[tuple[str, int | None]]) -> Iterator[PutDedupKey]:
        try:
            for entity, since in entities:
                if since is None:
                    cursor = db.execute(layout.SELECT_KEYS_OF, (entity,))
                else:
                    cursor = db.execute(layout.SELECT_KEYS_SINCE, (entity, since))
                while rows := cursor.fetchmany(4096):
                    self.keys_read += len(rows)
                    for key, t0 in rows:
                        yield PutDedupKey(entity, key, t0)
        except sqlite3.Error as exc:
            raise self._damaged(exc) from None
        finally:
            db.close()

    def checkpoint_files(self) -> list[Path]:
        """The image files the committed checkpoint names (read on a connection of its own: also once closed)."""
        db = sqlite3.connect(self.path)
        try:
            rows = db.execute("SELECT DISTINCT image FROM dedup_checkpoint ORDER BY image").fetchall()
        finally:
            db.close()
        return [self.path.with_name(name) for (name,) in rows]

    def commit_now(self, unit: Sequence[Op]) -> bool:
        """Store a settlement unit on the caller's thread, as safely as ``submit(unit, durable=False)`` would, when
        that cannot reorder it: the writer has nothing queued or in hand. Returns False (nothing done: submit it)
        otherwise; raises ``StoreWriteError`` if it failed (nothing of it stored).

        A unit of plain settlements is one record appended to the settlement log (``store/settlement_log.py``):
        a crash of the process cannot lose it once this returns; the writer applies the log's records to the
        database within ``SETTLEMENT_SYNC_SECONDS`` (or with its next transaction, before that transaction's
        units), syncs, and empties the log. Any other settlement unit is committed here. Saves the hand-over
        to the writer thread and back. It never waits: not for the writer (its lock is only tried), nor for a
        disk (no fsync, no checkpoint: the writer's).
        """
        loggable = settlement_log.loggable(unit)  # (a non-empty unit of settlements of plain values)
        if not loggable and (not unit or not settlement_log.settlements_only(unit)):
            return False
        if not self._lock.acquire(blocking=False):
            return False
        try:
            # no check of the files here (two stats a commit): if they were deleted, the writer's next check
            # (within SETTLEMENT_SYNC_SECONDS, it is woken) recreates them from this connection, which has it
            if self._finished != self._submitted:
                return False
            wake = self._unsynced_since is None
            started = time.perf_counter()
            if not self._log_broken and loggable:
                number = self._log_number + 1
                try:
                    self._log.append(settlement_log.encode(self._store_id, number, unit))
                except OSError as exc:
                    self.failures += 1
                    self._log_broken = self._log.damaged  # then settlements commit until it is emptied
                    raise _write_error(self.log_path, exc) from None
                self._log_number = number
                self._logged.append((number, list(unit)))
                self.logged_settlements += 1
                self.commits += 1  # the record is the unit's commit (what ``commit_observer`` is told of)
                if self._unsynced_since is None:  # the writer applies it within SETTLEMENT_SYNC_SECONDS
                    self._unsynced_since = time.monotonic()
            else:
                if self._autocheckpoint != 0:  # a checkpoint fsyncs: that is the writer's to do
                    self._db.execute("PRAGMA wal_autocheckpoint=0")
                    self._autocheckpoint = 0
                try:
                    self._transaction(list(unit), False)
                except Exception as exc:
                    self.failures += 1
                    raise _write_error(self.path, exc) from None
                self._checkpoint_due = True  # (a record instead writes no page: the writer's commit of it does)
            self.units += 1
            self.direct_commits += 1
            if self.commit_observer is not None:
                self.commit_observer(time.perf_counter() - started, 1)
        finally:
            self._lock.release()
        if wake:
            self._wake_writer()
        return True

    def _make_durable(self) -> None:
        """Make every committed transaction power-safe: fsync the WAL (what a ``synchronous=FULL`` commit does)
        and its directory (the WAL may have been created by a commit that did not sync). After transactions
        ``commit_now`` committed (which never checkpoint), checkpoint first, so the WAL stays bounded; the writer's
        own commits (the log's records applied, here too) checkpoint past ``AUTOCHECKPOINT_PAGES``, not at each sync:
        a page written again by the next ones is copied to the database once (about 1 us a completion less)."""
        if self._autocheckpoint != AUTOCHECKPOINT_PAGES:  # (turned off by a transaction ``commit_now`` committed)
            self._db.execute(f"PRAGMA wal_autocheckpoint={AUTOCHECKPOINT_PAGES}")
            self._autocheckpoint = AUTOCHECKPOINT_PAGES
        self._apply_logged()  # the log's records go to the database first (the log is emptied after the fsync)
        if self._checkpoint_due:
            self._checkpoint_due = False
            try:
                self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            except sqlite3.Error as exc:  # tried again after the next direct commit
                _LOG.debug("store checkpoint failed: %s", exc)
        for target, flags in ((self.wal_path, os.O_RDONLY), (self.path.parent, os.O_RDONLY)):
            try:
                fd = os.open(target, flags)
            except FileNotFoundError:  # no WAL: checkpointed into the file and removed (or deleted: recreated)
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self._clear_log()

    def _apply(self, ops: list[Op], durable: bool) -> None:
        """Apply ``ops`` in one transaction, all or nothing; fsynced before it returns if ``durable``."""
        db = self._db
        synchronous = "FULL" if durable else "NORMAL"
        if synchronous != self._synchronous:  # only between transactions: it applies from the next commit on
            db.execute(f"PRAGMA synchronous={synchronous}")
            self._synchronous = synchronous
        logged = self._logged
        if logged:  # settlements the log confirmed come first: they were confirmed before anything queued now
            ops = [op for _, unit in logged for op in unit] + ops
        db.execute("BEGIN IMMEDIATE")
        try:
            self._ops.apply_all(self._db, ops)
            if logged:
                db.execute(layout.SET_APPLIED_THROUGH, (logged[-1][0],))
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:  # SQLite has already rolled back after some errors (disk full)
                db.execute("ROLLBACK")
            raise
        if logged:
            self._logged = []
            self._log_clear_due = True
        if durable:
            self._clear_log()
        if self._wal_identity is None:
            self._wal_identity = _identity(self.wal_path)

    def _apply_logged(self) -> None:
        """Apply the records the log confirmed and the database does not hold yet, if any (no fsync)."""
        if self._logged:
            self._apply([], False)

    def _clear_log(self) -> None:
        """Empty the settlement log once every record in it is applied by a durable commit."""
        if (self._log_clear_due or self._log_broken) and not self._logged:
            try:
                self._log.clear()
            except OSError as exc:  # the records are applied: a replay skips them; tried again next time
                _LOG.debug("could not empty %s: %s", self.log_path, exc)
                return
            self._log_clear_due = False
            self._log_broken = False

    def _check_files(self) -> None:
        """Recreate the database file if it (or its WAL) was deleted under the open connection.

        The open connection still reads every committed transaction from the deleted files; a copy of
        it replaces them, so nothing acknowledged is lost at the next start. A file put in the database's
        place by someone else is not overwritten: writes are refused, naming it.
        """
        if _identity(self.log_path) != self._log_identity:  # the settlement log was deleted: a new one
            self._reopen_log()
        db_now = _identity(self.path)
        if db_now == self._db_identity:
            if self._wal_identity is None or _identity(self.wal_path) == self._wal_identity:
                return
        elif db_now is not None:
            raise StoreWriteError(
                f"could not write to {self.path}: the file was replaced by another one while oncebus ran; "
                "nothing more is written to it. Stop oncebus; what it acknowledged since it started is in the "
                "file it opened, which is now unlinked"
            )
        self._recreate()

    def _reopen_log(self) -> None:
        """Its records go to the database first (the deleted file would not be replayed), then appends go to a new
        log file."""
        self._apply_logged()
        log = SettlementLog(self.log_path)
        self._log.close()
        self._log, self._log_identity = log, _identity(self.log_path)
        self._log_clear_due = self._log_broken = False

    def _recreate(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".restore")
        tmp.unlink(missing_ok=True)
        copy = sqlite3.connect(tmp)
        try:
            self._db.backup(copy)
        finally:
            copy.close()
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, self.path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        self._db.close()  # the old connection's files are gone; it may only unlink names that are free now
        self._db = self._connect()
        self._synchronous = "FULL"
        self._autocheckpoint = AUTOCHECKPOINT_PAGES
        self._unsynced_since = None  # the copy holds every committed transaction, fsynced
        self._db_identity = _identity(self.path)
        self._wal_identity = _identity(self.wal_path)
        self.recreated += 1
        _LOG.error(
            "the store file %s (or its -wal file) was deleted while oncebus ran; recreated it from the open "
            "database: everything committed is kept",
            self.path,
        )

    # ------------------------------------------------------------------ the writer's hooks (store/writer.py)
    def _reason(self, exc: BaseException) -> str:
        return _reason(exc)

    def _write_error(self, exc: BaseException) -> StoreWriteError:
        return _write_error(self.path, exc)

    def _before_group(self) -> None:
        if self._autocheckpoint != AUTOCHECKPOINT_PAGES:
            self._db.execute(f"PRAGMA wal_autocheckpoint={AUTOCHECKPOINT_PAGES}")
            self._autocheckpoint = AUTOCHECKPOINT_PAGES
            self._checkpoint_due = False  # its commit checkpoints if the WAL is past the limit
        try:
            self._check_files()
        except StoreWriteError:
            raise
        except Exception as exc:  # the file is gone or not ours: nothing written now would last
            raise StoreWriteError(
                f"could not write to {self.path}: the file was deleted while oncebus ran and could not be "
                f"recreated ({_reason(exc)}); nothing of this call was stored"
            ) from None

    def _idle(self) -> None:
        self._check_files()

    def _take_deleted(self) -> list[str]:
        return self._ops.take_deleted()

    def _new_image_path(self) -> Path:
        return dedup_images.new_image_path(self.path)

    def _store_checkpoint(self, checkpoint: Checkpoint, marks: dict[str, int]) -> None:
        db = self._db
        self._check_files()
        # the log's records first: this durable commit makes every commit before it durable, and the writer then
        # counts nothing as unsynced (``_commit_checkpoint``), so none of them may be left in the log alone
        self._apply_logged()
        if self._synchronous != "FULL":
            db.execute("PRAGMA synchronous=FULL")
            self._synchronous = "FULL"
        db.execute("BEGIN IMMEDIATE")
        try:
            dedup_images.commit(db, checkpoint.path, checkpoint.token, marks)
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def _checkpoint_stored(self, checkpoint: Checkpoint) -> None:
        _LOG.info(
            "dedup checkpoint committed: %s (%.0f MB) written in %.2f s; the fork paused the loop %.1f ms",
            checkpoint.path.name,
            _size_mb(checkpoint.path),
            time.monotonic() - checkpoint.started,
            checkpoint.pause_seconds * 1000,
        )
        try:
            dedup_images.remove_unreferenced(self._db, self.path)
        except (OSError, sqlite3.Error) as exc:
            _LOG.debug("could not remove replaced dedup index images: %s", exc)

    def _write_images(self, indexes: DedupIndexes, since_us: int) -> None:
        dedup_images.save(self._db, self.path, indexes, since_us)

    def _close_connections(self) -> None:
        self._log.close()
        self._db.close()
        if self._reader is not None:
            self._reader.close()
        _disown(self._owner)  # last: another process may open the file now


def _own(path: Path) -> int:
    """Take the store file's owner lock (an exclusive ``flock`` on ``<file>-owner``, which holds the owner's pid):
    one process writes a store, so another process's writes never go behind its back (a server's memory would not
    see them). The kernel drops the lock with the process, so a crash leaves nothing to clean up. A separate file,
    not the database: closing a descriptor of the database would drop SQLite's own locks on it. Within one process
    the lock is shared (counted), as SQLite's own locks are: a program may open its file again before closing it.
    Returns a descriptor to give to ``_disown``."""
    owner = path.with_name(path.name + "-owner")
    fd = os.open(owner, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        stat = os.fstat(fd)
        key = (stat.st_dev, stat.st_ino)
        with _OWNED_LOCK:
            held = _OWNED.get(key)
            if held is not None:
                held[1] += 1
                os.close(fd)
                return held[0]
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = "?"
                with contextlib.suppress(OSError):
                    pid = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
                raise DataDirBusyError(
                    f"{path} is in use by another process (pid {pid}): one process owns a store; reach the running "
                    "oncebus serve through AMQP, the administration API or the oncebus CLI, or stop it first"
                ) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode("ascii"), 0)
            _OWNED[key] = [fd, 1]
            return fd
    except BaseException:
        os.close(fd)
        raise


def _disown(fd: int) -> None:
    with _OWNED_LOCK:
        for key, held in _OWNED.items():
            if held[0] == fd:
                held[1] -= 1
                if held[1] == 0:
                    del _OWNED[key]
                    os.close(fd)  # the lock goes with the last descriptor
                return


_OWNED: dict[tuple[int, int], list[int]] = {}  # owner file (device, inode) -> [descriptor, stores open on it]
_OWNED_LOCK = threading.Lock()


def _open_error(path: Path, exc: BaseException) -> StoreError:
    """One line for a store that cannot be opened: what is wrong, which file, what to do."""
    reason = _reason(exc)
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    if code in (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT) or isinstance(exc, ValueError):
        return StoreError(
            f"{path} is not a readable oncebus database ({reason}): restore it from a backup, or move it (and "
            "its -wal file) away to start with an empty store"
        )
    if code == sqlite3.SQLITE_FULL:
        return StoreError(f"cannot open {path}: {reason}; free disk space and start again")
    return StoreError(
        f"cannot open {path} ({reason}): check that the file and its directory exist, are readable and writable "
        "by this user, and are on a local disk"
    )


def _write_error(path: Path, exc: BaseException) -> StoreWriteError:
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    advice = (
        "free disk space; oncebus accepts writes again as soon as it can write (no restart needed)"
        if code == sqlite3.SQLITE_FULL
        else "oncebus tries again with the next call"
    )
    return StoreWriteError(f"could not write to {path}: {_reason(exc)}; nothing of this call was stored; {advice}")


def _size_mb(path: Path) -> float:
    try:
        return path.stat().st_size / 2**20
    except OSError:
        return float("nan")
