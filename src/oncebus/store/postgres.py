"""A store on PostgreSQL for one node (``oncebus serve --store postgresql://...``), with group commit.

The same contract as the SQLite store (``oncebus.store.sqlite``): units submitted by the broker queue up for
one writer thread (the group-commit writer both stores share: ``oncebus.store.writer``), which commits
everything queued so far in one transaction, sent in one pipeline (a round trip or two per group, not per
statement). A unit is never split across transactions, so a send's messages
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

One writer per schema: the broker decides duplicates, locks and sequence numbers in memory, so two ``serve``
processes must not both write one database schema (the writer's session holds an advisory lock: see
``_take_node_lock``). A cluster's node (``leadership``, ``oncebus serve --cluster``: ``oncebus.server.cluster``)
waits for that lock instead of being refused, announces where it serves once it holds it, and gives up its
leadership with its writer session (it never reconnects it: another node may lead by then).
Dedup index images are stored while serving (``checkpoint_dedup``: a forked child
writes them to a temporary file, the writer stores them) and at a clean stop (``keep_dedup_images``): a start
reads them, then the key rows accepted since their mark.
Layout and schema versions: ``oncebus.store.postgres_layout``.
"""

from __future__ import annotations

import io
import json
import logging
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import Connection
from psycopg.pq import TransactionStatus
from psycopg.types.json import Jsonb

from oncebus.core.errors import StoreError, StoreWriteError
from oncebus.core.messages import StoredMessage
from oncebus.store import dedup_images
from oncebus.store import postgres_layout as layout
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
from oncebus.store.dedup_images import DedupImage
from oncebus.store.writer import Checkpoint, GroupCommitWriter

_LOG = logging.getLogger("oncebus.store")
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
LEADERSHIP_POLL_SECONDS = 0.2  # a standby tries the node lock this often (--cluster)
LEADER_CHECK_SECONDS = 1.0  # a leader checks its session this often when idle (--cluster)
NODE_LOCK_WAIT_SECONDS = 3.0  # a node killed a moment ago: its session (and lock) ends when the server notices
MAX_IMAGE_BYTES = 512 * 2**20  # a larger dedup index image is not stored (the entity is rebuilt from its rows)
SCHEMA_VERSION = layout.SCHEMA_VERSION


class LeadershipCancelled(Exception):
    """Waiting for the cluster's leadership was given up (the node stops)."""


def leader_of(db: Connection[Any]) -> tuple[str, dict[str, Any], int] | None:
    """The cluster's leader as ``db``'s schema knows it now: its node name, address and session's server process;
    None while no node leads (between one's death and the next one's start)."""
    row = db.execute(layout.LEADER, (layout.NODE_LOCK,)).fetchone()
    if row is None:
        return None
    return str(row[0]), dict(row[1]), int(row[2])


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


class PostgresStore(GroupCommitWriter):
    """The PostgreSQL store: its database's part of the shared group-commit writer (``store/writer.py``)."""

    def __init__(self, url: str, *, leadership: threading.Event | None = None) -> None:
        """Open the store at ``url``, holding its node lock. ``leadership`` (a node of a cluster, ``oncebus serve
        --cluster``): wait for the lock as long as another node holds it (the cluster's leader), checking every
        ``LEADERSHIP_POLL_SECONDS``, until it is taken or the event is set (``LeadershipCancelled``); a store
        opened so loses its leadership with its writer session (``on_deposed`` is called; it never reconnects)."""
        self._init_writer()
        self.url = url
        self.display = display_url(url)
        self.where = self.display
        self.reconnects = 0
        self.keys_read = 0  # dedup key rows read by load() and keys_of (what a start replayed)
        self.cluster = leadership is not None
        self.deposed: str | None = None  # why this node lost its leadership (cluster only)
        self.on_deposed: Callable[[str], None] | None = None  # called once, on any thread, when it does
        self.led_since = time.monotonic()  # when this node took the lock (monotonic)
        if self.cluster:
            self.idle_seconds = LEADER_CHECK_SECONDS  # a leader checks its session when idle (_idle)
        if leadership is not None:
            self._db: Connection[Any] | None = self._await_leadership(leadership)
        else:
            try:
                self._db = self._connect()
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
        self._reader: Connection[Any] | None = None  # read_messages, on the caller's thread
        self._reader_lock = threading.Lock()
        self._start_writer("oncebus-postgres-writer")

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

    def _await_leadership(self, cancelled: threading.Event) -> Connection[Any]:
        """A connection holding the node lock, once no other node holds it (a connection lost meanwhile, as when
        the server restarts, is opened again); raises ``LeadershipCancelled`` once ``cancelled`` is set."""
        failure: str | None = None
        while not cancelled.is_set():
            db = None
            try:
                db = self._connect()
                self._prepare(db)
                while not cancelled.is_set():
                    if self._try_node_lock(db):
                        self.led_since = time.monotonic()
                        db.execute(layout.FORGET_ENDED)
                        held, db = db, None
                        return held
                    cancelled.wait(LEADERSHIP_POLL_SECONDS)
            except psycopg.Error as exc:
                reason = _reason(exc)
                if reason != failure:  # once per cause, not every second
                    _LOG.warning("waiting for PostgreSQL at %s: %s", self.display, reason)
                    failure = reason
                cancelled.wait(1.0)
            finally:
                if db is not None:
                    db.close()
        raise LeadershipCancelled()

    def announce(self, node: str, address: dict[str, Any]) -> None:
        """Publish where this node serves, as the cluster's leader (in the session holding the lock)."""
        with self._lock:
            db = self._writer_connection()
            try:
                db.execute(layout.ANNOUNCE, (node, Jsonb(address)))
            except psycopg.Error as exc:  # the session is gone (and with it the lock): this term ends
                self._drop_connection()
                raise StoreWriteError(f"could not write to {self.display}: {_reason(exc)}") from None

    def _depose(self, reason: str) -> None:
        if self.deposed is not None:
            return
        self.deposed = reason
        _LOG.warning("this node is no longer the cluster's leader: %s", reason)
        if self.on_deposed is not None:
            self.on_deposed(reason)

    def _idle(self) -> None:
        """A leader's check of its session, when nothing was written for a while: a session that ended (the server
        restarted, the connection was cut) has let go of the lock another node may hold now."""
        db = self._db
        if not self.cluster or db is None or self.deposed is not None:
            return
        try:
            db.execute("SELECT 1")
        except psycopg.Error as exc:
            self._drop_connection()
            self._depose(f"its session with PostgreSQL ended ({_reason(exc)})")

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
            f"another oncebus serves {self.display}{who}: one oncebus process per database schema, unless every "
            "node runs with --cluster (one leads, the others forward to it); stop it, give this one another "
            "database or schema, or start every node with --cluster"
        )

    def _drop_connection(self) -> None:
        """Close the writer's connection after it failed (it is opened again for the next transaction; not in a
        cluster, where the node lost its leadership with it)."""
        db, self._db = self._db, None
        if db is None:
            return
        self._old_backend = self._backend
        db.close()
        if self.cluster:
            self._depose("its session with PostgreSQL failed, and with it the lock another node may take now")

    def _writer_connection(self) -> Connection[Any]:
        """The writer's connection, opened again if it was lost (raises ``psycopg.Error`` if it cannot be)."""
        db = self._db
        if db is not None and not db.closed and not db.broken:
            return db
        if db is not None:
            self._drop_connection()
        if self.cluster:  # never again: another node may lead now, with what it wrote since
            raise StoreWriteError(
                f"could not write to {self.display}: this node lost its session with PostgreSQL and with it the "
                f"cluster's leadership ({self.deposed}); it stops serving and forwards to the leader; "
                "nothing of this call was stored; reconnect"
            )
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
            self._note_load()
            try:
                return self._load()
            except psycopg.Error as exc:
                db = self._db
                if _connection_error(exc) or db is None or db.closed or db.broken:  # as a write's: opened again
                    self._drop_connection()  # (in a cluster: the leadership goes with it)
                raise StoreError(f"could not read the store from {self.display}: {_reason(exc)}") from None

    def _load(self) -> Snapshot:
        db = self._writer_connection()
        snapshot = Snapshot()
        for path, kind, props in db.execute("SELECT path, kind, properties FROM oncebus_entity ORDER BY path"):
            snapshot.entities.append(PutEntity(path, kind, json.loads(props)))
        row = db.execute(layout.NEWEST_KEY).fetchone()
        snapshot.newest_key_us = int(row[0]) if row is not None else 0
        for path, sid, state, updated_us in db.execute(
            "SELECT path, session_id, state, updated_us FROM oncebus_session_state"
        ):
            snapshot.session_states.append(PutSessionState(path, layout.decode(sid) or "", bytes(state), updated_us))
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

    def _apply(self, ops: list[Op], durable: bool) -> None:
        """Apply ``ops`` in one transaction, all or nothing; flushed by the server before it returns if
        ``durable``."""
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

    def _script_cursor(self, db: Connection[Any]) -> psycopg.ClientCursor[Any]:
        """A cursor of ``db`` that quotes values on the client (for ``settlement_script``)."""
        if self._quoting is None or self._quoting.connection is not db:
            self._quoting = psycopg.ClientCursor(db)
        return self._quoting

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

    # ------------------------------------------------------------------ the writer's hooks (store/writer.py)
    def _reason(self, exc: BaseException) -> str:
        return _reason(exc)

    def _retry_each(self, exc: BaseException) -> bool:
        return _worth_retrying(exc, self._db)

    def _take_deleted(self) -> list[str]:
        return self._ops.take_deleted()

    def _make_durable(self) -> None:
        """Make every committed transaction power-safe: a synchronous commit that writes a commit record (it takes
        a transaction id), so the server flushes its WAL up to it, and with it every commit before it."""
        db = self._writer_connection()
        with db.transaction():
            db.execute("SELECT txid_current()")

    def _new_image_path(self) -> Path:
        return dedup_images.new_image_path(Path(tempfile.gettempdir()) / "oncebus-postgres")

    def _store_checkpoint(self, checkpoint: Checkpoint, marks: dict[str, int]) -> None:
        # the file fork_write wrote (dedup_images' format): each entity's image, its length and CRC-32
        images = dedup_images._read_directory(checkpoint.path, checkpoint.token)
        rows = []
        for entity, since in marks.items():
            image = images.get(entity)
            if image is None or image.length > MAX_IMAGE_BYTES:
                continue
            with image.open() as file:
                data = file.read(image.length)
            rows.append((entity, data, image.crc, since))
        self._replace_images(rows)

    def _checkpoint_stored(self, checkpoint: Checkpoint) -> None:
        dedup_images.discard(checkpoint.path)

    def _write_images(self, indexes: DedupIndexes, since_us: int) -> None:
        rows = []
        for entity, index in indexes:
            buffer = io.BytesIO()
            index.dump(buffer)
            data = buffer.getvalue()
            if len(data) <= MAX_IMAGE_BYTES:  # larger: rebuilt from its rows (a bytea holds at most 1 GB)
                rows.append((entity, data, zlib.crc32(data), since_us))
        self._replace_images(rows)

    def _replace_images(self, rows: list[tuple[str, bytes, int, int]]) -> None:
        """Store ``rows`` (entity, image, CRC-32, mark) in place of every image stored before, durably."""
        db = self._writer_connection()
        with db.transaction():
            db.execute("DELETE FROM oncebus_dedup_image")
            db.cursor().executemany(
                "INSERT INTO oncebus_dedup_image (entity, image, crc, since_us) VALUES (%s, %s, %s, %s)", rows
            )

    def _close_connections(self) -> None:
        if self._db is not None:
            self._db.close()
        with self._reader_lock:
            if self._reader is not None:
                self._reader.close()


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


class LeaderReader:
    """Reads where the cluster's leader serves (``leader_of``) on a connection of its own, opened again after a
    failure (which is raised: the caller knows no leader until the database answers)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._db: Connection[Any] | None = None

    def read(self) -> tuple[str, dict[str, Any], int] | None:
        db = self._db
        if db is None or db.closed or db.broken:
            if db is not None:
                db.close()
            self._db = None
            db = self._db = psycopg.connect(self.url, autocommit=True, **_CONNECTION_SETTINGS)
        try:
            return leader_of(db)
        except psycopg.Error:
            db.close()
            self._db = None
            raise

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
