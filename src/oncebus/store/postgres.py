"""A store on PostgreSQL for one node (``oncebus serve --store postgresql://...``), with group commit.

The same contract as the SQLite store (``oncebus.store.sqlite``): units submitted by the broker queue up for
one writer thread, which commits everything queued so far in one transaction, sent in one pipeline (a round
trip or two per group, not per statement). A unit is never split across transactions, so a send's messages
and their dedup keys land together or not at all; its future resolves once the commit is durable
(``synchronous_commit`` at least ``local``: the server has flushed its WAL; a session whose setting is ``off``
is set to ``on``).

Settlements submitted with ``durable=False`` (see ``store.base``): a group made of them alone commits with
``SET LOCAL synchronous_commit = off``: committed and visible (the oncebus process can crash without losing it:
the server has it), flushed by the server's WAL writer shortly after. PostgreSQL's WAL is a log flushed as a
prefix, so the next durable commit makes it power-safe too; when none comes, the writer commits a small
synchronous transaction within ``SETTLEMENT_SYNC_SECONDS`` of the first unflushed one (as the SQLite writer
fsyncs its WAL).

Failures: a transaction that fails is rolled back and every unit in it gets a :class:`StoreWriteError` naming
the cause (a group that fails is retried unit by unit, so one bad unit fails alone). A connection that was
lost (the server restarted, the network dropped) is opened again before the next commit; a commit whose
connection broke during ``COMMIT`` may or may not have landed: the error says so, and the broker reloads
what the store holds before it accepts more work (a resend of such a send is then judged against the key
if it landed). A server that cannot be reached or a database written by a newer oncebus gives a one-line
:class:`StoreError` at start.

One node only: the broker decides duplicates, locks and sequence numbers in memory, so two ``serve``
processes must not share one database schema (the writer's session holds an advisory lock: see
``_take_node_lock``). Dedup index images are stored while serving (``checkpoint_dedup``: a forked child
writes them to a temporary file, the writer stores them) and at a clean stop (``keep_dedup_images``): a start
reads them, then the key rows accepted since their mark.
Layout and schema versions: ``oncebus.store.postgres_layout``.
"""

from __future__ import annotations

import io
import json
import logging
import os
import queue
import secrets
import signal
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import Connection
from psycopg.pq import TransactionStatus

from oncebus.core.errors import StoreError, StoreWriteError
from oncebus.core.messages import StoredMessage
from oncebus.store import dedup_images
from oncebus.store import postgres_layout as layout
from oncebus.store.base import (
    SETTLEMENT_SYNC_SECONDS,
    AddCounters,
    DeleteMessage,
    MessageRow,
    MoveMessage,
    Op,
    PutDedupKey,
    PutEntity,
    PutSessionState,
    Snapshot,
    UpdateMessage,
)
from oncebus.store.dedup_images import DedupImage, Dumpable

_LOG = logging.getLogger("oncebus.store")
_STOP = object()
_MAX_UNITS_PER_COMMIT = 512
_SETTLEMENT_OPS = (DeleteMessage, UpdateMessage, MoveMessage, AddCounters)  # what may commit before its flush
CONNECT_TIMEOUT_SECONDS = 10
# a server that stops answering (a cut network) fails the call in flight within about 10 s (unacknowledged data)
# or 25 s (an idle connection: keepalives), rather than TCP's minutes; the URL may set these itself
_CONNECTION_SETTINGS: dict[str, Any] = {
    "connect_timeout": CONNECT_TIMEOUT_SECONDS,
    "application_name": "oncebus",
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,
}
NODE_LOCK_WAIT_SECONDS = 3.0  # a node killed a moment ago: its session (and lock) ends when the server notices
MAX_IMAGE_BYTES = 512 * 2**20  # a larger dedup index image is not stored (the entity is rebuilt from its rows)
SCHEMA_VERSION = layout.SCHEMA_VERSION

_Unit = tuple[list[Op], Future[None] | None]


def display_url(url: str) -> str:
    """The URL without its password (for messages and logs)."""
    try:
        parts = urlsplit(url)
        netloc, query = parts.netloc, parts.query
        if parts.password is not None:
            host = parts.hostname or ""
            if ":" in host:
                host = f"[{host}]"
            netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port is not None else "")
        if "password=" in query:  # libpq also takes it as a parameter
            query = "&".join("password=***" if q.startswith("password=") else q for q in query.split("&"))
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        return "the PostgreSQL URL given"


def _root(exc: BaseException) -> BaseException:
    """The error that caused ``exc``: leaving a pipeline after a failure raises the driver's own error (no
    SQLSTATE, "cannot exit pipeline mode while busy") in place of the server's."""
    while isinstance(exc, psycopg.Error) and exc.sqlstate is None and isinstance(exc.__context__, psycopg.Error):
        exc = exc.__context__
    return exc


def _reason(exc: BaseException) -> str:
    exc = _root(exc)
    text = " ".join(str(exc).split())  # libpq's messages span lines
    return text or type(exc).__name__


class PostgresStore:
    def __init__(self, url: str) -> None:
        self.url = url
        self.display = display_url(url)
        self.commits = 0
        self.units = 0
        self.failures = 0
        self.reconnects = 0
        self.relaxed_commits = 0  # transactions committed without waiting for their flush (settlements only)
        self.syncs = 0  # small synchronous commits the writer made to flush them (when no durable commit came)
        self.keys_read = 0  # dedup key rows read by load() and keys_of (what a start replayed)
        self._keep_images: Callable[[], Iterable[tuple[str, Dumpable]]] | None = None
        self._keep_since_us = 0
        self._failures_at_load = 0  # a write failed since the broker last loaded: its memory may hold more
        self._loads = 0  # load() calls so far: a checkpoint forked before a reload holds memory from before it
        self._checkpointing: _Checkpoint | None = None  # the checkpoint being written, until stored or dropped
        self._closing = False
        self._submit_lock = threading.Lock()
        self._submitted = 0  # units queued so far (under _submit_lock)
        self._finished = 0  # units of those the writer has committed or failed
        self._deleted_at: dict[str, int] = {}  # entity -> the number of the last unit that deleted it (writer)
        self.checkpoints = 0  # dedup checkpoints stored while serving
        self.checkpoints_dropped = 0  # written but not stored (a write failed, a reload, the child failed)
        self._unsynced_since: float | None = None  # monotonic time of the first commit not flushed yet
        try:
            self._db: Connection[Any] | None = self._connect()
        except psycopg.Error as exc:
            raise _open_error(self.display, exc) from None
        try:
            self._prepare(self._db)
            self._take_node_lock(self._db, wait=NODE_LOCK_WAIT_SECONDS)
        except BaseException as exc:
            self._db.close()
            if isinstance(exc, psycopg.Error):
                raise StoreError(f"cannot prepare the oncebus tables in {self.display}: {_reason(exc)}") from None
            raise
        self._ops = layout.OpWriter()
        self._quoting: psycopg.ClientCursor[Any] | None = None
        self._backend = self._db.info.backend_pid  # the writer connection's server process
        self._old_backend: int | None = None  # the server process of a writer connection that failed
        self._connection_failed = False  # the last transaction failed with its connection
        self._lock = threading.Lock()  # the writer connection: the writer's transactions, load(), close()
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._reader: Connection[Any] | None = None  # read_messages, on the caller's thread
        self._reader_lock = threading.Lock()
        # called on the writer thread after each commit with (seconds, units): metrics, see broker/counters.py
        self.commit_observer: Callable[[float, int], None] | None = None
        self._writer = threading.Thread(target=self._write_loop, name="oncebus-postgres-writer", daemon=True)
        self._writer.start()

    # ------------------------------------------------------------------ connections and schema
    def _connect(self, *, autocommit: bool = True) -> Connection[Any]:
        db = psycopg.connect(self.url, autocommit=autocommit, **_CONNECTION_SETTINGS)
        try:
            setting = db.execute("SHOW synchronous_commit").fetchone()
            if setting is not None and setting[0] == "off":  # a commit must wait for the server's WAL flush
                db.execute("SET synchronous_commit = on")
            if not autocommit:
                db.commit()
        except BaseException:
            db.close()
            raise
        return db

    def _prepare(self, db: Connection[Any]) -> None:
        """Create the tables in an empty schema, migrate an older layout, refuse a newer one: one transaction,
        under an advisory lock (nodes starting together do it once)."""
        fsync = db.execute("SHOW fsync").fetchone()
        if fsync is not None and fsync[0] == "off":
            _LOG.warning(
                "PostgreSQL at %s runs with fsync=off: a crash of its machine can lose acknowledged sends", self.display
            )
        with db.transaction():
            db.execute("SELECT pg_advisory_xact_lock(%s)", (layout.SCHEMA_LOCK,))
            row = db.execute("SELECT current_schema()").fetchone()
            schema = None if row is None else row[0]
            if schema is None:
                path = db.execute("SHOW search_path").fetchone()
                raise StoreError(
                    f"{self.display}: no schema to create oncebus's tables in (search_path is "
                    f"{path[0] if path else '?'!r}, and none of it exists): create the schema, or name one that "
                    "exists with ?options=-csearch_path%3D<schema> in the URL"
                )
            found = {
                name
                for (name,) in db.execute(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = %s AND table_name = ANY(%s)",
                    (schema, [layout.VERSION_TABLE, *layout.TABLES]),
                )
            }
            if layout.VERSION_TABLE not in found:
                if found:
                    raise StoreError(
                        f"{self.display} (schema {schema}) holds tables named like oncebus's "
                        f"({', '.join(sorted(found))}) but no oncebus_schema table: "
                        "it was not written by oncebus; use another database or schema"
                    )
                db.execute(layout.CREATE)
                _LOG.info("created the oncebus tables (store schema %d) in %s", SCHEMA_VERSION, self.display)
                return
            versions = [v for (v,) in db.execute(f"SELECT version FROM {layout.VERSION_TABLE}")]
            if len(versions) != 1:
                raise StoreError(
                    f"{self.display} (schema {schema}): the table {layout.VERSION_TABLE} holds {len(versions)} rows, "
                    "not one: it was changed by hand; restore it from a backup"
                )
            version = versions[0]
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.display} (schema {schema}) was written by a newer oncebus (store schema {version}; this "
                    f"version reads up to {SCHEMA_VERSION}): run that version or a newer one on it"
                )
            if version < SCHEMA_VERSION:
                try:
                    for step in range(version, SCHEMA_VERSION):
                        for statement in layout.MIGRATIONS[step]:
                            db.execute(statement)
                    db.execute(f"UPDATE {layout.VERSION_TABLE} SET version = %s, written_at = now()", (SCHEMA_VERSION,))
                except psycopg.Error as exc:  # raised inside the transaction: all of it is rolled back
                    raise StoreError(
                        f"could not migrate {self.display} (schema {schema}) from store schema {version} to "
                        f"{SCHEMA_VERSION} ({_reason(exc)}); the database is unchanged: fix the cause, or run the "
                        "earlier oncebus on it"
                    ) from None
                _LOG.warning("migrating %s from store schema %d to %d", self.display, version, SCHEMA_VERSION)

    def _try_node_lock(self, db: Connection[Any]) -> bool:
        row = db.execute("SELECT pg_try_advisory_lock(%s, hashtext(current_schema()))", (layout.NODE_LOCK,)).fetchone()
        return row is not None and bool(row[0])

    def _take_node_lock(self, db: Connection[Any], *, wait: float = 0.0) -> None:
        """Hold the schema's node lock for the writer's session (one node per schema until nodes share work):
        a session-level advisory lock, let go when the session ends (a node that dies lets it go with its
        connection). Raises ``StoreError`` if another session holds it after ``wait`` seconds."""
        deadline = time.monotonic() + wait
        while True:
            if self._try_node_lock(db):
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        holder = db.execute(
            "SELECT a.pid, a.client_addr, a.backend_start FROM pg_locks AS l JOIN pg_stat_activity AS a"
            " ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.classid = %s AND l.objsubid = 2"
            " AND l.objid = hashtext(current_schema())::oid",
            (layout.NODE_LOCK,),
        ).fetchone()
        who = (
            ""
            if holder is None
            else f" (server process {holder[0]}, client {holder[1] or 'local'}, since {holder[2]:%Y-%m-%d %H:%M:%S})"
        )
        raise StoreError(
            f"another oncebus serves {self.display}{who}: one oncebus process per database schema (several nodes "
            "on one database are not supported yet); stop it, or give this one another database or schema"
        )

    def _drop_connection(self) -> None:
        """Close the writer's connection after it failed (it is opened again for the next transaction)."""
        db, self._db = self._db, None
        if db is None:
            return
        self._old_backend = self._backend
        db.close()

    def _writer_connection(self) -> Connection[Any]:
        """The writer's connection, opened again if it was lost (raises ``psycopg.Error`` if it cannot be)."""
        db = self._db
        if db is not None and not db.closed and not db.broken:
            return db
        if db is not None:
            self._drop_connection()
        old_backend, self._old_backend = self._old_backend, None
        db = self._connect()
        try:
            if old_backend and not self._try_node_lock(db):
                # the server may not have noticed yet that this node's previous session is gone (a cut network):
                # that session is this node's own, so end it rather than wait for the server's TCP timeout
                db.execute("SELECT pg_terminate_backend(%s)", (old_backend,))
            self._take_node_lock(db, wait=NODE_LOCK_WAIT_SECONDS if old_backend else 0.0)
        except StoreError as exc:  # another node took the schema while this one was cut off: write nothing
            db.close()
            raise StoreWriteError(f"could not write to {self.display}: {exc}") from None
        self._db = db
        self._backend = db.info.backend_pid
        self.reconnects += 1
        self._unsynced_since = None  # the old session's commits were flushed by the server, or lost with it
        _LOG.warning("reconnected to PostgreSQL at %s", self.display)
        return self._db

    # ------------------------------------------------------------------ reading
    def load(self) -> Snapshot:
        with self._lock:
            self._failures_at_load = self.failures
            self._loads += 1
            try:
                return self._load()
            except psycopg.Error as exc:
                raise StoreError(f"could not read the store from {self.display}: {_reason(exc)}") from None

    def _load(self) -> Snapshot:
        db = self._writer_connection()
        snapshot = Snapshot()
        for path, kind, props in db.execute("SELECT path, kind, properties FROM oncebus_entity ORDER BY path"):
            snapshot.entities.append(PutEntity(path, kind, json.loads(props)))
        row = db.execute(layout.NEWEST_KEY).fetchone()
        snapshot.newest_key_us = int(row[0]) if row is not None else 0
        for path, sid, state in db.execute("SELECT path, session_id, state FROM oncebus_session_state"):
            snapshot.session_states.append(PutSessionState(path, layout.decode(sid) or "", bytes(state)))
        for entity, next_seq, counters in db.execute(
            "SELECT entity, next_sequence_number, counters FROM oncebus_counters"
        ):
            snapshot.counters[entity] = AddCounters(entity, next_seq, dict(counters))
        for path, rules in db.execute("SELECT path, rules FROM oncebus_rules"):
            snapshot.rules[path] = json.loads(rules)
        snapshot.messages = self._stream(layout.SELECT_ROWS, (), _message_row, "rows")
        keyed = [
            record.path
            for record in snapshot.entities
            if record.kind != "subscription" and record.properties.get("requires_duplicate_detection")
        ]
        snapshot.dedup_images = self._images(db, keyed)
        marks = [image.since_us if (image := snapshot.dedup_images.get(path)) else 0 for path in keyed]
        snapshot.dedup_keys = self._stream(layout.SELECT_KEYS_SINCE, (keyed, marks), self._key, "keys")
        snapshot.keys_of = lambda entity: self._stream(layout.SELECT_KEYS, ([entity],), self._key, "keys")
        return snapshot

    def _images(self, db: Connection[Any], entities: list[str]) -> dict[str, DedupImage]:
        """The images written at the last clean stop, of ``entities`` (those with duplicate detection)."""
        found: dict[str, DedupImage] = {}
        rows = db.execute(
            "SELECT entity, image, crc, since_us FROM oncebus_dedup_image WHERE entity = ANY(%s)", (entities,)
        )
        for entity, image, crc, since in rows:
            data = bytes(image)
            where = Path(f"{self.display}#oncebus_dedup_image/{entity}")  # named in the broker's warnings
            found[entity] = _DatabaseImage(where, 0, len(data), crc, since, data)
        return found

    def keep_dedup_images(self, indexes: Callable[[], Iterable[tuple[str, Dumpable]]], since_us: int) -> None:
        """At ``close``, once every unit is committed, store images of ``indexes()`` (holding every key first
        accepted before ``since_us``) in ``oncebus_dedup_image``, in place of the previous ones, for the next
        start to read in bulk; unless a write failed since the last ``load`` (memory may then hold a key the
        store does not: the previous images stay). As the SQLite store's, at a clean stop only: a start after a
        crash reads the images of the last clean stop and the keys accepted since."""
        self._keep_images = indexes
        self._keep_since_us = since_us

    def _save_images(self) -> None:
        keep, self._keep_images = self._keep_images, None
        if keep is None or self.failures != self._failures_at_load or not self._queue.empty():
            return
        rows = []
        for entity, index in keep():
            buffer = io.BytesIO()
            index.dump(buffer)
            data = buffer.getvalue()
            if len(data) <= MAX_IMAGE_BYTES:  # larger: rebuilt from its rows (a bytea holds at most 1 GB)
                rows.append((entity, data, zlib.crc32(data), self._keep_since_us))
        try:
            db = self._writer_connection()
            with db.transaction():
                db.execute("DELETE FROM oncebus_dedup_image")
                db.cursor().executemany(
                    "INSERT INTO oncebus_dedup_image (entity, image, crc, since_us) VALUES (%s, %s, %s, %s)", rows
                )
        except (psycopg.Error, StoreWriteError) as exc:  # the rows stay the truth; the next start reads them
            _LOG.warning("could not store the dedup index images in %s: %s", self.display, _reason(exc))

    def checkpoint_dedup(self, indexes: Iterable[tuple[str, Dumpable]], since_us: int) -> bool:
        """Start a checkpoint of the dedup ``indexes`` as they are now, marked ``since_us`` (see
        ``SqliteStore.checkpoint_dedup``: call it on the thread that judges and submits, between two steps).

        A forked child writes the images to a temporary file (the fork is the caller's only pause); once it has,
        the checkpoint goes through the writer's queue, behind every unit submitted before the fork, and the
        writer stores the images in ``oncebus_dedup_image`` in place of the previous ones, only if none of those
        units failed and the store was not reloaded meanwhile (else they are dropped and the previous images
        stay). An entity deleted by a unit submitted after the fork is left out. Returns False (nothing started)
        while one is being written, while closing, or where processes cannot fork."""
        if self._checkpointing is not None or self._closing or not hasattr(os, "fork"):
            return False
        entries = list(indexes)
        if not entries:
            return False
        with self._submit_lock:
            submitted = self._submitted
        path = dedup_images.new_image_path(Path(tempfile.gettempdir()) / "oncebus-postgres")
        token = secrets.token_bytes(16)
        try:
            pid = dedup_images.fork_write(path, token, entries)
        except OSError as exc:  # out of memory or processes: the next one tries again
            _LOG.warning("could not start a dedup checkpoint: %s", exc)
            return False
        checkpoint = _Checkpoint(path, token, {name: since_us for name, _ in entries}, submitted, self._loads, pid)
        checkpoint.waiter = threading.Thread(
            target=self._await_checkpoint, args=(checkpoint,), name="oncebus-dedup-checkpoint", daemon=True
        )
        self._checkpointing = checkpoint
        checkpoint.waiter.start()
        return True

    def wait_checkpoint(self, timeout: float | None = None) -> bool:
        """Wait until no checkpoint is being written (stored or dropped); False if one still is."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._checkpointing is not None:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True

    def _await_checkpoint(self, checkpoint: _Checkpoint) -> None:
        """On a thread of its own: wait for the child, then queue the checkpoint behind the units before it."""
        try:
            _, status = os.waitpid(checkpoint.pid, 0)
        except ChildProcessError:  # reaped by someone else: unknown
            status = -1
        if status == 0 and not checkpoint.cancelled:
            self._queue.put(checkpoint)
            return
        if not checkpoint.cancelled:
            _LOG.warning("the dedup checkpoint's child process failed (status %s); the next one tries again", status)
        self._drop_checkpoint(checkpoint)

    def _drop_checkpoint(self, checkpoint: _Checkpoint) -> None:
        dedup_images.discard(checkpoint.path)
        dedup_images.discard(checkpoint.path.with_name(checkpoint.path.name + dedup_images.TMP_SUFFIX))
        self.checkpoints_dropped += 1
        self._checkpointing = None

    def _commit_checkpoint(self, checkpoint: _Checkpoint) -> None:
        """On the writer, under the lock; every unit submitted before the fork committed or failed by now."""
        if self.failures != self._failures_at_load or self._loads != checkpoint.loads:
            self._drop_checkpoint(checkpoint)  # memory may have held a key the store does not
            return
        try:
            # the file fork_write wrote (dedup_images' format): each entity's image, its length and CRC-32
            images = dedup_images._read_directory(checkpoint.path, checkpoint.token)
            rows = []
            for entity, since in checkpoint.marks.items():
                image = images.get(entity)
                if image is None or self._deleted_at.get(entity, 0) > checkpoint.submitted:
                    continue
                if image.length > MAX_IMAGE_BYTES:
                    continue
                with image.open() as file:
                    data = file.read(image.length)
                rows.append((entity, data, image.crc, since))
            db = self._writer_connection()
            with db.transaction():
                db.execute("DELETE FROM oncebus_dedup_image")
                db.cursor().executemany(
                    "INSERT INTO oncebus_dedup_image (entity, image, crc, since_us) VALUES (%s, %s, %s, %s)", rows
                )
        except (OSError, ValueError, psycopg.Error, StoreWriteError) as exc:  # the previous images stay
            _LOG.warning("could not store a dedup checkpoint in %s: %s", self.display, _reason(exc))
            self._drop_checkpoint(checkpoint)
            return
        self._unsynced_since = None  # its synchronous commit flushed every transaction before it
        self.checkpoints += 1
        dedup_images.discard(checkpoint.path)
        self._checkpointing = None

    def _key(self, row: tuple[Any, ...]) -> PutDedupKey:
        self.keys_read += 1
        return PutDedupKey(row[0], bytes(row[1]).decode("utf-8", "surrogatepass"), row[2])

    def _stream(
        self, query: str, params: tuple[Any, ...], convert: Callable[[tuple[Any, ...]], Any], name: str
    ) -> Iterator[Any]:
        """Rows of ``query`` as the store is now (its snapshot is taken here, with the first rows), streamed from a
        server-side cursor on a connection of its own, so the broker may take them while it serves and commits."""
        db = None
        try:
            db = self._connect(autocommit=False)
            cursor = db.cursor(name=f"oncebus_{name}")
            cursor.itersize = 4096
            cursor.execute(query, params)
            first = cursor.fetchmany(4096)
        except psycopg.Error as exc:
            if db is not None:
                db.close()
            raise StoreError(f"could not read the store from {self.display}: {_reason(exc)}") from None
        return self._more(db, cursor, first, convert)

    def _more(
        self,
        db: Connection[Any],
        cursor: psycopg.ServerCursor[Any],
        rows: list[Any],
        convert: Callable[[tuple[Any, ...]], Any],
    ) -> Iterator[Any]:
        try:
            while rows:
                for row in rows:
                    yield convert(row)
                rows = cursor.fetchmany(4096)
        except psycopg.Error as exc:
            raise StoreError(f"could not read the store from {self.display}: {_reason(exc)}") from None
        finally:
            db.close()

    def read_messages(self, path: str, sequence_numbers: Sequence[int]) -> dict[int, StoredMessage]:
        """The content of committed messages (those found), on the caller's thread (a connection of its own,
        opened again once if it was lost)."""
        with self._reader_lock:
            for attempt in (1, 2):
                try:
                    if self._reader is None or self._reader.closed or self._reader.broken:
                        if self._reader is not None:
                            self._reader.close()
                        self._reader = self._connect()
                    return layout.read_content(self._reader, path, sequence_numbers)
                except psycopg.Error as exc:
                    reader, lost = self._reader, _connection_error(exc)
                    if reader is not None and (lost or reader.closed or reader.broken):
                        reader.close()  # whatever libpq says of it: opened afresh
                        self._reader = None
                        lost = True
                    if attempt == 2 or not lost:
                        raise StoreWriteError(f"could not read messages from {self.display}: {_reason(exc)}") from None
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ writing
    def submit(self, unit: Sequence[Op], *, durable: bool = True) -> Future[None]:
        future: Future[None] = Future()
        if not durable and not all(isinstance(op, _SETTLEMENT_OPS) for op in unit):
            durable = True  # what stores a message, a key or a definition waits for its flush, whatever was asked
        with self._submit_lock:
            self._submitted += 1
            self._queue.put((list(unit), future, durable))
        return future

    def _write_loop(self) -> None:
        while True:
            timeout = None
            if self._unsynced_since is not None:  # wake to flush them in time
                timeout = max(self._unsynced_since + SETTLEMENT_SYNC_SECONDS - time.monotonic(), 0.0)
            try:
                item = self._queue.get(timeout=timeout)
            except queue.Empty:
                with self._lock:
                    self._sync_if_due()
                continue
            if item is _STOP:
                return
            if isinstance(item, _Checkpoint):
                with self._lock:
                    self._commit_checkpoint(item)
                continue
            group = [item]
            stop = False
            checkpoint: _Checkpoint | None = None  # after this group (it must not overtake it)
            while len(group) < _MAX_UNITS_PER_COMMIT:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is _STOP:
                    stop = True
                    break
                if isinstance(more, _Checkpoint):
                    checkpoint = more
                    break
                group.append(more)
            with self._lock:
                try:
                    self._commit_group(group)  # type: ignore[arg-type]
                finally:
                    self._finished += len(group)
                    for path in self._ops.take_deleted():  # a deletion tried counts, landed or not
                        self._deleted_at[path] = self._finished
                if checkpoint is not None:
                    self._commit_checkpoint(checkpoint)
                self._sync_if_due()
            if stop:
                return

    def _sync_if_due(self) -> None:
        if self._unsynced_since is not None and time.monotonic() >= self._unsynced_since + SETTLEMENT_SYNC_SECONDS:
            try:
                self._sync()
            except (psycopg.Error, StoreWriteError) as exc:  # tried again; a durable commit flushes them anyway
                _LOG.debug("store sync failed: %s", exc)
                if self._unsynced_since is not None:
                    self._unsynced_since = time.monotonic()  # not before SETTLEMENT_SYNC_SECONDS: no busy loop

    def _sync(self) -> None:
        """Make every committed transaction power-safe: a synchronous commit that writes a commit record (it takes
        a transaction id), so the server flushes its WAL up to it, and with it every commit before it."""
        db = self._writer_connection()
        with db.transaction():
            db.execute("SELECT txid_current()")
        self.syncs += 1
        self._unsynced_since = None

    def _commit_group(self, group: list[tuple[list[Op], Future[None], bool]]) -> None:
        # a unit whose waiter was cancelled is still written: the broker's memory already has it
        units: list[_Unit] = [
            (unit, future if future.set_running_or_notify_cancel() else None) for unit, future, _ in group
        ]
        durable = [d for _, _, d in group]
        self.units += len(units)
        started = time.perf_counter()
        try:
            self._transaction([op for unit, _ in units for op in unit], any(durable))
        except Exception as exc:
            if len(units) == 1 or not _worth_retrying(exc, self._db):
                self._fail(units, exc)
                return
            # nothing of the group is stored; one unit's failure must not fail the others: each on its own
            for (unit, future), unit_durable in zip(units, durable, strict=True):
                try:
                    self._transaction(unit, unit_durable)
                except Exception as unit_exc:
                    self._fail([(unit, future)], unit_exc)
                else:
                    if future is not None:
                        future.set_result(None)
            return
        if self.commit_observer is not None and any(unit for unit, _ in units):
            self.commit_observer(time.perf_counter() - started, len(units))
        for _, future in units:
            if future is not None:
                future.set_result(None)

    def _transaction(self, ops: list[Op], durable: bool = True) -> None:
        """Apply ``ops`` in one transaction, all or nothing; flushed by the server before it returns if
        ``durable``."""
        if not ops:
            return
        self._connection_failed = False
        db = self._writer_connection()
        try:
            script = None if durable else layout.settlement_script(self._script_cursor(db), ops)
            if script is not None:
                try:
                    db.execute(script, prepare=False)
                except BaseException:
                    if not db.closed and not db.broken and db.info.transaction_status != TransactionStatus.IDLE:
                        db.execute("ROLLBACK")
                    raise
            else:
                with db.pipeline(), db.transaction():
                    if not durable:
                        db.execute("SET LOCAL synchronous_commit = off")
                    self._ops.apply_all(db, ops)
        except psycopg.Error as exc:
            if _connection_error(exc) or db.closed or db.broken:  # whatever libpq says of it, never trust it again
                self._connection_failed = True
                self._drop_connection()
            raise
        self.commits += 1
        if durable:  # its flush carried every transaction committed before it
            self._unsynced_since = None
        else:
            self.relaxed_commits += 1
            if self._unsynced_since is None:
                self._unsynced_since = time.monotonic()

    def _script_cursor(self, db: Connection[Any]) -> psycopg.ClientCursor[Any]:
        """A cursor of ``db`` that quotes values on the client (for ``settlement_script``)."""
        if self._quoting is None or self._quoting.connection is not db:
            self._quoting = psycopg.ClientCursor(db)
        return self._quoting

    def _fail(self, units: list[_Unit], exc: BaseException) -> None:
        self.failures += 1
        error = exc if isinstance(exc, StoreWriteError) else self._write_error(exc)
        for _, future in units:
            if future is not None:
                future.set_exception(error)

    def _write_error(self, exc: BaseException) -> StoreWriteError:
        db = self._db
        if self._connection_failed or db is None or db.closed or db.broken:
            return StoreWriteError(
                f"could not write to {self.display}: the connection to PostgreSQL failed ({_reason(exc)}); this "
                "call may not have been stored (if the commit was under way); oncebus reconnects with the next call"
            )
        return StoreWriteError(
            f"could not write to {self.display}: {_reason(exc)}; nothing of this call was stored; "
            "oncebus tries again with the next call"
        )

    def close(self) -> None:
        self._closing = True
        checkpoint = self._checkpointing
        if checkpoint is not None and checkpoint.waiter is not None:  # a clean stop stores newer images anyway
            checkpoint.cancelled = True
            try:
                os.kill(checkpoint.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            checkpoint.waiter.join()
        if self._writer.is_alive():
            self._queue.put(_STOP)
            self._writer.join()
        with self._lock:
            if self._unsynced_since is not None:
                try:
                    self._sync()
                except (psycopg.Error, StoreWriteError) as exc:
                    _LOG.warning("could not flush the last settlements to %s on close: %s", self.display, exc)
            self._save_images()
            if self._db is not None:
                self._db.close()
        with self._reader_lock:
            if self._reader is not None:
                self._reader.close()


@dataclass(slots=True)
class _Checkpoint:
    """A dedup checkpoint being written by a forked child (see ``PostgresStore.checkpoint_dedup``)."""

    path: Path
    token: bytes
    marks: dict[str, int]  # entity -> since_us
    submitted: int  # units submitted before the fork: the image holds their keys, and no later unit's
    loads: int  # the store's loads before the fork: a reload since means memory was rebuilt
    pid: int
    waiter: threading.Thread | None = None
    cancelled: bool = False


@dataclass(frozen=True, slots=True)
class _DatabaseImage(DedupImage):
    """An image read from ``oncebus_dedup_image`` (in memory; ``open`` gives it as a file)."""

    data: bytes = b""

    def open(self) -> BinaryIO:
        return io.BytesIO(self.data)


def _message_row(row: tuple[Any, ...]) -> MessageRow:
    path, seq, state, count, enqueued, expires, size, session = row
    return (path, seq, state, count, enqueued, expires, size, layout.decode(session))


def _worth_retrying(exc: BaseException, db: Connection[Any] | None) -> bool:
    """Whether to try a failed group's units one by one: not when the connection is gone (each would fail)."""
    return db is not None and not db.closed and not db.broken and not _connection_error(exc)


def _connection_error(exc: BaseException) -> bool:
    """An error of the connection rather than of the statements: the driver's own (no SQLSTATE), a connection
    exception (class 08) or the server going away (class 57: shut down, session terminated)."""
    exc = _root(exc)
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    return state is None or state[:2] in ("08", "57")


def _open_error(display: str, exc: BaseException) -> StoreError:
    """One line for a database that cannot be reached: what, where, what to do."""
    return StoreError(
        f"cannot connect to PostgreSQL at {display} ({_reason(exc)}): check that the server runs and accepts "
        "connections from here, and the URL's host, port, database, user and password"
    )
