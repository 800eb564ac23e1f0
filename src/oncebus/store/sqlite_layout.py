"""The SQLite store's layout: its tables, how a message is written and read, and migrations from older layouts.

Schema versions (``PRAGMA user_version``):

- 0: the layout before versions;
- 1: typed message ids (dedup key texts of string ids that start with NUL are escaped;
  see ``oncebus.core.keys``);
- 2: subscription rules (table ``subscription_rules``: every subscription of an older
  file gets the ``$Default`` rule, which is what it behaved as);
- 3: a message is two rows: ``message`` holds what the broker keeps in memory and needs at
  start (state, times, size, session id; small rows, read fast), ``message_data`` its
  content (the wire encoding, and the body only where it is not a slice of the encoding,
  plus the other fields as JSON), read when the message is delivered. A message deleted
  from ``message`` takes its content with it (trigger);
- 4: table ``dedup_snapshot``: the token of the dedup index images written at the last clean shutdown
  (see ``oncebus.store.dedup_images``); an older file gets the empty table (no images: keys are
  rebuilt from ``dedup_key`` once);
- 5: table ``dedup_checkpoint`` replaces ``dedup_snapshot``: per entity, the image file holding its index,
  the file's token and the image's high-water mark (``since_us``: the keys first accepted from then on are
  read from ``dedup_key`` on top of the image). Images are written while serving too, and serve every start
  until a newer one is committed. A schema 4 token (a clean stop) becomes one row per entity with duplicate
  detection, its mark the entity's newest key (the image held every key then).

An older file is migrated in place in one transaction (all or nothing); a newer one is refused.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from oncebus.core.keys import migrate_key_text_v0
from oncebus.core.messages import StoredMessage
from oncebus.core.rules import default_rule

SCHEMA_VERSION = 5

SCHEMA = """
CREATE TABLE IF NOT EXISTS entity (
    path TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    properties TEXT NOT NULL
);
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
-- schema 2: a subscription's rules, in order, as a JSON list of RuleProperties.to_dict()
CREATE TABLE IF NOT EXISTS subscription_rules (
    path TEXT PRIMARY KEY,
    rules TEXT NOT NULL
);
-- schema 5: the dedup index image each entity starts from (see store/dedup_images.py): its file (a name in
-- the store's directory), the file's token, and the mark: keys first accepted at or after since_us are read
-- from dedup_key on top of it. Deleting the entity deletes its row (its image is never used again).
CREATE TABLE IF NOT EXISTS dedup_checkpoint (
    entity TEXT PRIMARY KEY,
    image TEXT NOT NULL,
    token BLOB NOT NULL,
    since_us INTEGER NOT NULL
);
"""

MESSAGE_STATEMENTS = (
    """CREATE TABLE IF NOT EXISTS message (
    path TEXT NOT NULL,
    sequence_number INTEGER NOT NULL,
    state INTEGER NOT NULL,
    delivery_count INTEGER NOT NULL,
    enqueued_time_us INTEGER NOT NULL,
    expires_at_us INTEGER,
    size INTEGER NOT NULL,
    session_id TEXT,
    data_id INTEGER NOT NULL,
    dead_letter_reason TEXT,
    dead_letter_error_description TEXT,
    dead_letter_source TEXT,
    PRIMARY KEY (path, sequence_number)
) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS message_data (
    id INTEGER PRIMARY KEY,
    meta TEXT NOT NULL,
    body BLOB,  -- NULL: the body is wire[body_offset : body_offset + body_length]
    body_offset INTEGER,
    body_length INTEGER,
    wire BLOB
)""",
    """CREATE TRIGGER IF NOT EXISTS message_content_gone AFTER DELETE ON message BEGIN
    DELETE FROM message_data WHERE id = OLD.data_id;
END""",
)

INSERT_MESSAGE = (
    "INSERT OR REPLACE INTO message (path, sequence_number, state, delivery_count, enqueued_time_us, expires_at_us,"
    " size, session_id, data_id, dead_letter_reason, dead_letter_error_description, dead_letter_source)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
INSERT_DATA = "INSERT INTO message_data (id, meta, body, body_offset, body_length, wire) VALUES (?, ?, ?, ?, ?, ?)"
INSERT_KEY = "INSERT OR REPLACE INTO dedup_key (entity, first_accepted_us, key) VALUES (?, ?, ?)"
# the primary key's order (no sort): a key accepted again has a later row, which replaces the earlier one
SELECT_KEYS_OF = "SELECT key, first_accepted_us FROM dedup_key WHERE entity = ? ORDER BY first_accepted_us"
SELECT_KEYS_SINCE = (
    "SELECT key, first_accepted_us FROM dedup_key WHERE entity = ? AND first_accepted_us >= ?"
    " ORDER BY first_accepted_us"
)
DELETE_MESSAGE = "DELETE FROM message WHERE path = ? AND sequence_number = ?"
SELECT_ROWS = (
    "SELECT path, sequence_number, state, delivery_count, enqueued_time_us, expires_at_us, size, session_id"
    " FROM message ORDER BY path, sequence_number"
)
_SELECT_CONTENT = (
    "SELECT m.sequence_number, m.state, m.delivery_count, m.enqueued_time_us, m.expires_at_us, m.session_id,"
    " m.dead_letter_reason, m.dead_letter_error_description, m.dead_letter_source,"
    " d.meta, d.body, d.body_offset, d.body_length, d.wire"
    " FROM message AS m JOIN message_data AS d ON d.id = m.data_id"
    " WHERE m.path = ? AND m.sequence_number IN ({})"
)


def message_rows(m: StoredMessage, data_id: int) -> tuple[tuple[object, ...], tuple[object, ...]]:
    """The ``message`` and ``message_data`` rows of a message (its body kept once: as a slice of its wire
    encoding where it is one)."""
    body: bytes | None = m.body
    offset = length = None
    wire = m.wire
    if wire is not None:
        assert body is not None
        length = len(body)
        if wire.endswith(body):  # a single data section last: the usual encoding, and a memcmp
            offset, body = len(wire) - length, None
        else:
            found = wire.find(body) if body else 0
            if found >= 0:
                offset, body = found, None
            else:
                length = None
    light = (
        m.path,
        m.sequence_number,
        int(m.state),
        m.delivery_count,
        m.enqueued_time_us,
        m.expires_at_us,
        m.size,
        m.session_id,
        data_id,
        m.dead_letter_reason,
        m.dead_letter_error_description,
        m.dead_letter_source,
    )
    return light, (data_id, m.meta_json(), body, offset, length, wire)


def newest_key_us(db: sqlite3.Connection, entity: str) -> int:
    """The newest ``first_accepted_us`` of an entity's keys (0 without keys), from the primary key's order."""
    row = db.execute("SELECT MAX(first_accepted_us) FROM dedup_key WHERE entity = ?", (entity,)).fetchone()
    return row[0] or 0


def read_content(db: sqlite3.Connection, path: str, sequence_numbers: Sequence[int]) -> dict[int, StoredMessage]:
    found: dict[int, StoredMessage] = {}
    for start in range(0, len(sequence_numbers), 500):
        chunk = list(sequence_numbers[start : start + 500])
        query = _SELECT_CONTENT.format(", ".join("?" * len(chunk)))
        for row in db.execute(query, (path, *chunk)):
            seq, state, count, enq, exp, session, reason, description, source, meta, body, off, length, wire = row
            if body is None:
                body = wire[off : off + length]
            found[seq] = StoredMessage.from_row(
                path=path,
                sequence_number=seq,
                state=state,
                delivery_count=count,
                enqueued_time_us=enq,
                expires_at_us=exp,
                body=body,
                wire=wire,
                meta=meta,
                session_id=session,
                dead_letter_reason=reason,
                dead_letter_error_description=description,
                dead_letter_source=source,
            )
    return found


def patch_properties(db: sqlite3.Connection, path: str, seq: int, changes: dict[str, Any]) -> None:
    """Merge ``changes`` into a stored message's application properties (abandon with modifications)."""
    row = db.execute(
        "SELECT d.id, d.meta FROM message AS m JOIN message_data AS d ON d.id = m.data_id"
        " WHERE m.path = ? AND m.sequence_number = ?",
        (path, seq),
    ).fetchone()
    if row is None:
        return
    meta = json.loads(row[1])
    properties = dict(meta.get("application_properties") or {})
    properties.update(changes)
    meta["application_properties"] = properties
    db.execute(
        "UPDATE message_data SET meta = ? WHERE id = ?", (json.dumps(meta, separators=(",", ":"), default=str), row[0])
    )


def create(db: sqlite3.Connection) -> None:
    db.executescript(SCHEMA + "".join(statement + ";\n" for statement in MESSAGE_STATEMENTS))


def migrate(db: sqlite3.Connection, version: int, images: str = "oncebus.db.dedup") -> None:
    """Bring a layout at ``version`` up to ``SCHEMA_VERSION`` inside the caller's transaction (``images``: the name
    schema 4 gave its dedup image file, in the database's directory)."""
    if version < 1:
        _keys_v0_to_v1(db)
    if version < 2:
        _rules_v1_to_v2(db)
    if version < 3:
        _messages_v2_to_v3(db)
    if version < 5:
        _checkpoints_v4_to_v5(db, images)


def _keys_v0_to_v1(db: sqlite3.Connection) -> None:
    partitioned = {
        path
        for path, props in db.execute("SELECT path, properties FROM entity")
        if json.loads(props).get("enable_partitioning")
    }
    # only string ids starting with NUL change: their key text is escaped now
    rows = db.execute(
        "SELECT entity, first_accepted_us, key FROM dedup_key WHERE instr(CAST(key AS BLOB), X'00') > 0"
    ).fetchall()
    for entity, t0, key in rows:
        new = migrate_key_text_v0(key, partitioned=entity in partitioned)
        if new != key:
            db.execute(
                "DELETE FROM dedup_key WHERE entity = ? AND first_accepted_us = ? AND key = ?", (entity, t0, key)
            )
            db.execute(INSERT_KEY, (entity, t0, new))


def _rules_v1_to_v2(db: sqlite3.Connection) -> None:
    """Every subscription behaved as if it had the $Default rule: now it has it."""
    default = json.dumps([default_rule().to_dict()])
    db.execute(
        "INSERT OR IGNORE INTO subscription_rules (path, rules) SELECT path, ? FROM entity WHERE kind = 'subscription'",
        (default,),
    )


def _messages_v2_to_v3(db: sqlite3.Connection) -> None:
    """One ``message`` table with the body, wire and JSON of each message becomes ``message`` + ``message_data``."""
    old = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'message'").fetchone()
    if old is not None:
        db.execute("ALTER TABLE message RENAME TO message_v1")
    for statement in MESSAGE_STATEMENTS:  # execute, not executescript: that would commit the transaction
        db.execute(statement)
    if old is None:
        return
    cursor = db.execute(
        "SELECT path, sequence_number, state, delivery_count, enqueued_time_us, expires_at_us, body, wire, meta"
        " FROM message_v1"
    )
    data_id = 0
    while True:
        rows = cursor.fetchmany(1000)
        if not rows:
            break
        lights, datas = [], []
        for path, seq, state, count, enq, exp, body, wire, meta in rows:
            data_id += 1
            message = StoredMessage.from_row(
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
            light, data = message_rows(message, data_id)
            lights.append(light)
            datas.append(data)
        db.executemany(INSERT_DATA, datas)
        db.executemany(INSERT_MESSAGE, lights)
    db.execute("DROP TABLE message_v1")


def _checkpoints_v4_to_v5(db: sqlite3.Connection, image: str) -> None:
    """Schema 4's token (an image written at a clean stop, serving the next start) becomes a checkpoint per entity
    with duplicate detection: the image held every key then, so the keys to read on top of it are those of the
    entity's newest time (read again: harmless). An entity the file does not hold is rebuilt from its rows."""
    db.execute(
        "CREATE TABLE IF NOT EXISTS dedup_checkpoint"
        " (entity TEXT PRIMARY KEY, image TEXT NOT NULL, token BLOB NOT NULL, since_us INTEGER NOT NULL)"
    )
    old = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'dedup_snapshot'").fetchone()
    if old is None:
        return
    row = db.execute("SELECT token FROM dedup_snapshot").fetchone()
    if row is not None:
        for path, props in db.execute("SELECT path, properties FROM entity WHERE kind != 'subscription'").fetchall():
            if json.loads(props).get("requires_duplicate_detection"):
                db.execute(
                    "INSERT INTO dedup_checkpoint (entity, image, token, since_us) VALUES (?, ?, ?, ?)",
                    (path, image, bytes(row[0]), newest_key_us(db, path)),
                )
    db.execute("DROP TABLE dedup_snapshot")
