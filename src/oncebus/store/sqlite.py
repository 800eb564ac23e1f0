"""The embedded default store: one SQLite file in WAL mode, with group commit.

Units submitted by the broker queue up for a single writer thread, which
commits everything queued so far in one transaction (``synchronous=FULL``: a
unit is durable when its future resolves). A unit is never split across
transactions, so a send's messages and their dedup keys land together or not
at all.
"""

from __future__ import annotations

import json
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path

from oncebus.core.errors import StoreError
from oncebus.core.messages import StoredMessage
from oncebus.store.base import (
    DeleteEntity,
    DeleteMessage,
    Op,
    PruneDedupKeys,
    PutCounters,
    PutDedupKey,
    PutEntity,
    PutMessage,
    PutSessionState,
    Snapshot,
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS entity (
    path TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    properties TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS message (
    path TEXT NOT NULL,
    sequence_number INTEGER NOT NULL,
    state INTEGER NOT NULL,
    delivery_count INTEGER NOT NULL,
    enqueued_time_us INTEGER NOT NULL,
    expires_at_us INTEGER,
    body BLOB NOT NULL,
    wire BLOB,
    meta TEXT NOT NULL,
    PRIMARY KEY (path, sequence_number)
) WITHOUT ROWID;
-- time-ordered: inserts append, pruning cuts the front; the in-memory index keeps keys unique
CREATE TABLE IF NOT EXISTS dedup_key (
    entity TEXT NOT NULL,
    first_accepted_us INTEGER NOT NULL,
    key TEXT NOT NULL,
    PRIMARY KEY (entity, first_accepted_us, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS session_state (
    path TEXT NOT NULL,
    session_id TEXT NOT NULL,
    state BLOB NOT NULL,
    PRIMARY KEY (path, session_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS counters (
    entity TEXT PRIMARY KEY,
    next_sequence_number INTEGER NOT NULL,
    counters TEXT NOT NULL
);
"""

_INSERT_MESSAGE = (
    "INSERT OR REPLACE INTO message (path, sequence_number, state, delivery_count, enqueued_time_us,"
    " expires_at_us, body, wire, meta) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_INSERT_KEY = "INSERT OR REPLACE INTO dedup_key (entity, first_accepted_us, key) VALUES (?, ?, ?)"
_STOP = object()


def _message_row(m: StoredMessage) -> tuple[object, ...]:
    return (
        m.path,
        m.sequence_number,
        int(m.state),
        m.delivery_count,
        m.enqueued_time_us,
        m.expires_at_us,
        m.body,
        m.wire,
        m.meta_json(),
    )


_MAX_UNITS_PER_COMMIT = 512


class SqliteStore:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA)
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self.commits = 0
        self.units = 0
        self._failure: BaseException | None = None
        # called on the writer thread after each commit with (seconds, units): metrics, see broker/counters.py
        self.commit_observer: Callable[[float, int], None] | None = None
        self._writer = threading.Thread(target=self._write_loop, name="oncebus-sqlite-writer", daemon=True)
        self._writer.start()

    def load(self) -> Snapshot:
        db = self._db
        snapshot = Snapshot()
        for path, kind, props in db.execute("SELECT path, kind, properties FROM entity"):
            snapshot.entities.append(PutEntity(path, kind, json.loads(props)))
        for row in db.execute(
            "SELECT path, sequence_number, state, delivery_count, enqueued_time_us, expires_at_us, body, wire, meta"
            " FROM message ORDER BY sequence_number"
        ):
            path, seq, state, count, enq, exp, body, wire, meta = row
            snapshot.messages.append(
                StoredMessage.from_row(
                    path=path,
                    sequence_number=seq,
                    state=state,
                    delivery_count=count,
                    enqueued_time_us=enq,
                    expires_at_us=exp,
                    body=body,
                    wire=wire,
                    meta=meta,
                )
            )
        # a key accepted again after it left the window has two rows until pruning: the newest counts
        for entity, key, t0 in db.execute(
            "SELECT entity, key, MAX(first_accepted_us) AS t0 FROM dedup_key GROUP BY entity, key ORDER BY t0"
        ):
            snapshot.dedup_keys.append(PutDedupKey(entity, key, t0))
        for path, sid, state in db.execute("SELECT path, session_id, state FROM session_state"):
            snapshot.session_states.append(PutSessionState(path, sid, bytes(state)))
        for entity, next_seq, counters in db.execute("SELECT entity, next_sequence_number, counters FROM counters"):
            snapshot.counters[entity] = PutCounters(entity, next_seq, json.loads(counters))
        return snapshot

    def submit(self, unit: Sequence[Op]) -> Future[None]:
        future: Future[None] = Future()
        if self._failure is not None:
            future.set_exception(StoreError(f"the store at {self.path} failed earlier: {self._failure}"))
            return future
        self._queue.put((list(unit), future))
        return future

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            group = [item]
            stop = False
            while len(group) < _MAX_UNITS_PER_COMMIT:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is _STOP:
                    stop = True
                    break
                group.append(more)
            self._commit(group)  # type: ignore[arg-type]
            if stop:
                return

    def _commit(self, group: list[tuple[list[Op], Future[None]]]) -> None:
        # a unit whose waiter was cancelled is still written: the broker's memory already has it
        waiting = [(unit, future) for unit, future in group if future.set_running_or_notify_cancel()]
        ops = [op for unit, _ in group for op in unit]
        started = time.perf_counter()
        try:
            if ops:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    self._apply_all(ops)
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self.commits += 1
            self.units += len(group)
        except Exception as exc:  # the whole group failed; nothing of it is stored
            self._failure = exc
            error = StoreError(f"could not write to {self.path}: {exc}")
            for _, future in waiting:
                future.set_exception(error)
            return
        if ops and self.commit_observer is not None:
            self.commit_observer(time.perf_counter() - started, len(group))
        for _, future in waiting:
            future.set_result(None)

    def _apply_all(self, ops: list[Op]) -> None:
        """Apply a group's operations with the same effect as one by one, in fewer statements.

        Dedup keys and counters commute with message writes, so when the group
        touches no entity definitions or history pruning they are written last,
        and runs of message writes go through ``executemany``.
        """
        if any(isinstance(op, PutEntity | DeleteEntity | PruneDedupKeys | PutSessionState) for op in ops):
            for op in ops:
                self._apply(op)
            return
        messages: list[tuple[object, ...]] = []
        keys: list[tuple[str, int, str]] = []
        counters: dict[str, PutCounters] = {}
        for op in ops:
            if isinstance(op, PutMessage):
                messages.append(_message_row(op.message))
                if op.dedup_key is not None:
                    entity, key, t0 = op.dedup_key
                    keys.append((entity, t0, key))
            elif isinstance(op, PutDedupKey):
                keys.append((op.entity, op.first_accepted_us, op.key))
            elif isinstance(op, PutCounters):
                counters[op.entity] = op
            else:
                self._flush_messages(messages)
                self._apply(op)
        self._flush_messages(messages)
        if keys:
            self._db.executemany(_INSERT_KEY, keys)
        for op in counters.values():
            self._apply(op)

    def _flush_messages(self, rows: list[tuple[object, ...]]) -> None:
        if rows:
            self._db.executemany(_INSERT_MESSAGE, rows)
            rows.clear()

    def _apply(self, op: Op) -> None:
        db = self._db
        match op:
            case PutEntity(path=path, kind=kind, properties=props):
                db.execute(
                    "INSERT OR REPLACE INTO entity (path, kind, properties) VALUES (?, ?, ?)",
                    (path, kind, json.dumps(props)),
                )
            case DeleteEntity(path=path):
                like = path.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "/%"
                for table, column in (("entity", "path"), ("message", "path"), ("session_state", "path")):
                    db.execute(f"DELETE FROM {table} WHERE {column} = ? OR {column} LIKE ? ESCAPE '\\'", (path, like))
                db.execute("DELETE FROM counters WHERE entity = ? OR entity LIKE ? ESCAPE '\\'", (path, like))
                db.execute("DELETE FROM dedup_key WHERE entity = ?", (path,))
            case PutMessage(message=m, dedup_key=dedup_key):
                db.execute(_INSERT_MESSAGE, _message_row(m))
                if dedup_key is not None:
                    db.execute(_INSERT_KEY, (dedup_key[0], dedup_key[2], dedup_key[1]))
            case DeleteMessage(path=path, sequence_number=seq):
                db.execute("DELETE FROM message WHERE path = ? AND sequence_number = ?", (path, seq))
            case PutDedupKey(entity=entity, key=key, first_accepted_us=t0):
                db.execute(_INSERT_KEY, (entity, t0, key))
            case PruneDedupKeys(entity=entity, accepted_before_us=before):
                db.execute("DELETE FROM dedup_key WHERE entity = ? AND first_accepted_us < ?", (entity, before))
            case PutSessionState(path=path, session_id=sid, state=state):
                if state is None:
                    db.execute("DELETE FROM session_state WHERE path = ? AND session_id = ?", (path, sid))
                else:
                    db.execute(
                        "INSERT OR REPLACE INTO session_state (path, session_id, state) VALUES (?, ?, ?)",
                        (path, sid, state),
                    )
            case PutCounters(entity=entity, next_sequence_number=next_seq, counters=counters):
                db.execute(
                    "INSERT OR REPLACE INTO counters (entity, next_sequence_number, counters) VALUES (?, ?, ?)",
                    (entity, next_seq, json.dumps(counters)),
                )

    def close(self) -> None:
        if self._writer.is_alive():
            self._queue.put(_STOP)
            self._writer.join()
        self._db.close()
