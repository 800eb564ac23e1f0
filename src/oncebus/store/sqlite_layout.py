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
  detection, its mark the entity's newest key (the image held every key then);
- 6: content stored once per unit: table ``content`` holds each distinct encoding a submitted unit wrote once (a
  topic's subscription copies share their sender's wire bytes: one row for all of them) with a reference count;
  ``message_data`` is gone: a ``message`` row carries its own meta JSON (properties differ per message and copy)
  and addresses its content (``content_id``; the wire is ``data[:wire_length]``, the body
  ``data[body_offset : body_offset + body_length]``). Deleting a message row releases its content (trigger);
  the last reference deletes it. Schema 5's rows move over one content row per message;
- 7: ``session_state.updated_us``: when the state was set (what ``get-message-sessions`` with a last-updated time
  compares). An older file's states get NULL: not known, they count as set at the start that reads them;
- 8: table ``settlement_log``: the settlement log's mark (``store/settlement_log.py``);
- 9: the message record: a message whose wire encoding holds its application properties (the door's reader said
  where: ``StoredMessage.sections``) does not write them again in ``meta``, which says where they are in the wire
  (``"ap": [start, end]``, offsets into ``data[:wire_length]``); they are read from there when asked
  (``core.messages.WireProperties``), and the body's offset is the door's, not searched for. Schema 8's rows are
  read as they are (their ``meta`` holds the properties): the migration only sets the version;
- 10: nor the properties section's text fields (subject, content type, correlation id, to, reply to, reply-to
  session id): ``meta`` says where the section's list is in the wire (``"pr": [start, end]``) and they are read
  from there (``core.messages.read_wire_texts``) when the message is read. Schema 9's rows are read as they are
  (their ``meta`` holds them): the migration only sets the version.

An older file is migrated in place in one transaction (all or nothing); a newer one is refused.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Sequence
from typing import Any

from oncebus.core.keys import migrate_key_text_v0
from oncebus.core.messages import MessageState, StoredMessage, read_wire_properties
from oncebus.core.rules import default_rule

SCHEMA_VERSION = 10

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
    updated_us INTEGER,  -- schema 7: when it was set (NULL: set before schema 7, time not known)
    PRIMARY KEY (path, session_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS counters (
    entity TEXT PRIMARY KEY,
    next_sequence_number INTEGER NOT NULL,
    counters TEXT NOT NULL
);
-- schema 8: the last record of the settlement log (the file beside the database, ``store/settlement_log.py``)
-- whose settlements this database holds (a restart replays only the records after it), and the name this
-- database gives its records (a log left beside another database is not applied to it); one row, id 0
CREATE TABLE IF NOT EXISTS settlement_log (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    applied_through INTEGER NOT NULL,
    store_id TEXT NOT NULL
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

# schema 3 to 5: a message is a light row plus a message_data row (kept to migrate older files through it)
MESSAGE_STATEMENTS_V5 = (
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

INSERT_MESSAGE_V5 = (
    "INSERT OR REPLACE INTO message (path, sequence_number, state, delivery_count, enqueued_time_us, expires_at_us,"
    " size, session_id, data_id, dead_letter_reason, dead_letter_error_description, dead_letter_source)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
INSERT_DATA = "INSERT INTO message_data (id, meta, body, body_offset, body_length, wire) VALUES (?, ?, ?, ?, ?, ?)"

# schema 6: content once per distinct encoding of a unit, referenced by its messages (``refs``); the trigger
# deletes the last reference's content and else counts one down (a queue's message: one delete, one miss)
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
    content_id INTEGER NOT NULL,
    dead_letter_reason TEXT,
    dead_letter_error_description TEXT,
    dead_letter_source TEXT,
    meta TEXT NOT NULL,
    wire_length INTEGER,  -- NULL: no wire encoding
    body_offset INTEGER NOT NULL,
    body_length INTEGER NOT NULL,
    PRIMARY KEY (path, sequence_number)
) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS content (
    id INTEGER PRIMARY KEY,
    data BLOB NOT NULL,
    refs INTEGER NOT NULL
)""",
    """CREATE TRIGGER IF NOT EXISTS message_content_released AFTER DELETE ON message BEGIN
    DELETE FROM content WHERE id = OLD.content_id AND refs = 1;
    UPDATE content SET refs = refs - 1 WHERE id = OLD.content_id;
END""",
)

INSERT_MESSAGE = (
    "INSERT OR REPLACE INTO message (path, sequence_number, state, delivery_count, enqueued_time_us, expires_at_us,"
    " size, session_id, content_id, dead_letter_reason, dead_letter_error_description, dead_letter_source, meta,"
    " wire_length, body_offset, body_length) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
# a new message as most sends store it: active (0), never delivered, no expiry, no session, not dead-lettered
INSERT_NEW_MESSAGE = (
    "INSERT OR REPLACE INTO message (path, sequence_number, state, delivery_count, enqueued_time_us, expires_at_us,"
    " size, session_id, content_id, dead_letter_reason, dead_letter_error_description, dead_letter_source, meta,"
    " wire_length, body_offset, body_length) VALUES (?, ?, 0, 0, ?, NULL, ?, NULL, ?, NULL, NULL, NULL, ?, ?, ?, ?)"
)
INSERT_CONTENT = "INSERT INTO content (id, data, refs) VALUES (?, ?, ?)"
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
    " m.meta, m.wire_length, m.body_offset, m.body_length, c.data"
    " FROM message AS m JOIN content AS c ON c.id = m.content_id"
    " WHERE m.path = ? AND m.sequence_number IN ({})"
)


def content_of(m: StoredMessage) -> tuple[bytes, int | None, int, int]:
    """A message's content row data (its wire encoding, with the body appended only where it is not a slice of
    it; the body alone without a wire), the wire's length (None: no wire) and where the body is in the data."""
    body = m.body
    wire = m.wire
    if wire is None:
        return body, None, 0, len(body)
    length = len(body)
    sections = m.sections
    if sections is not None:  # the door's reader found it there: no search
        return wire, len(wire), sections.body_offset, length
    if wire.endswith(body):  # a single data section last: the usual encoding, and a memcmp
        return wire, len(wire), len(wire) - length, length
    found = wire.find(body) if body else 0
    if found >= 0:
        return wire, len(wire), found, length
    return wire + body, len(wire), len(wire), length


class ContentRows:
    """Builds one unit's ``message`` and ``content`` rows: a content row per distinct encoding (the same wire and
    body objects: a topic's subscription copies of one send), numbered from ``next_id``.

    A message as most sends store it (active, never delivered, no expiry, no session, not dead-lettered) goes
    through :data:`INSERT_NEW_MESSAGE`, which binds 9 values instead of 16 (binding is most of a row's cost:
    ``docs/performance-log.md``); the others through :data:`INSERT_MESSAGE`. Rows are written in the order
    added (runs of each statement), so a message put twice in one unit keeps its last row."""

    __slots__ = ("_seen", "contents", "messages", "next_id", "runs")

    def __init__(self, next_id: int) -> None:
        self.next_id = next_id
        self.messages = 0  # message rows added since the last flush
        self.runs: list[tuple[str, list[tuple[object, ...]]]] = []  # (statement, its rows), in order
        self.contents: list[list[object]] = []  # [id, data, refs]
        self._seen: dict[tuple[int, int], tuple[list[object], int | None, int, int]] = {}

    def add(self, m: StoredMessage) -> None:
        key = (id(m.wire), id(m.body))  # the objects stay alive in the unit's ops while this runs
        place = self._seen.get(key)
        if place is None:
            data, wire_length, offset, length = content_of(m)
            self.next_id += 1
            row: list[object] = [self.next_id, data, 0]
            self.contents.append(row)
            place = self._seen[key] = (row, wire_length, offset, length)
        row, wire_length, offset, length = place
        row[2] = row[2] + 1  # type: ignore[operator]
        self.messages += 1
        runs = self.runs
        size = wire_length if wire_length is not None else m.size  # with a wire, its length (as ``m.size``)
        if (
            m.state is MessageState.ACTIVE
            and m.delivery_count == 0
            and m.expires_at_us is None
            and m.session_id is None
            and m.dead_letter_reason is None
            and m.dead_letter_error_description is None
            and m.dead_letter_source is None
        ):
            values: tuple[object, ...] = (
                m.path,
                m.sequence_number,
                m.enqueued_time_us,
                size,
                row[0],
                m.meta_json(),
                wire_length,
                offset,
                length,
            )
            statement = INSERT_NEW_MESSAGE
        else:
            values = (
                m.path,
                m.sequence_number,
                int(m.state),
                m.delivery_count,
                m.enqueued_time_us,
                m.expires_at_us,
                size,
                m.session_id,
                row[0],
                m.dead_letter_reason,
                m.dead_letter_error_description,
                m.dead_letter_source,
                m.meta_json(),
                wire_length,
                offset,
                length,
            )
            statement = INSERT_MESSAGE
        if runs and runs[-1][0] is statement:
            runs[-1][1].append(values)
        else:
            runs.append((statement, [values]))

    def flush(self, db: sqlite3.Connection) -> None:
        """Write the rows built so far (contents first) and start over; the numbering goes on."""
        if self.contents:
            db.executemany(INSERT_CONTENT, self.contents)
            for statement, rows in self.runs:
                db.executemany(statement, rows)
            self.contents.clear()
            self.runs.clear()
            self.messages = 0
            self._seen.clear()


def message_rows(m: StoredMessage, data_id: int) -> tuple[tuple[object, ...], tuple[object, ...]]:
    """Schema 5's ``message`` and ``message_data`` rows of a message (its body kept once: as a slice of its wire
    encoding where it is one). Used to migrate older files, and by the PostgreSQL layout for its own split."""
    body: bytes | None = m.body
    offset = length = None
    wire = m.wire
    if wire is not None:
        assert body is not None
        length = len(body)
        if m.sections is not None:  # the door's reader found it there: no search
            offset, body = m.sections.body_offset, None
        elif wire.endswith(body):  # a single data section last: the usual encoding, and a memcmp
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
            seq, state, count, enq, exp, session, reason, description, source, meta, wire_length, off, length, data = (
                row
            )
            body = data[off : off + length]
            wire = None if wire_length is None else (data if wire_length == len(data) else data[:wire_length])
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
                body_offset=off if wire_length is not None and off + length <= wire_length else None,
            )
    return found


def patch_properties(db: sqlite3.Connection, path: str, seq: int, changes: dict[str, Any]) -> None:
    """Merge ``changes`` into a stored message's application properties (abandon with modifications)."""
    row = db.execute(
        "SELECT m.meta, c.data FROM message AS m JOIN content AS c ON c.id = m.content_id"
        " WHERE m.path = ? AND m.sequence_number = ?",
        (path, seq),
    ).fetchone()
    if row is None:
        return
    meta = json.loads(row[0])
    span = meta.pop("ap", None)  # schema 9: held in the wire (the data's first bytes), not in the meta
    if span is not None:
        properties = read_wire_properties(bytes(row[1]), span[0], span[1])
    else:
        properties = dict(meta.get("application_properties") or {})
    properties.update(changes)
    meta["application_properties"] = properties
    # the sender's encoding no longer holds them: a receiver gets it encoded again (StoredMessage.rewritten)
    meta["rewritten"] = sorted({*meta.get("rewritten", ()), "application_properties"})
    db.execute(
        "UPDATE message SET meta = ? WHERE path = ? AND sequence_number = ?",
        (json.dumps(meta, separators=(",", ":"), default=str), path, seq),
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
    if version < 6:
        _content_v5_to_v6(db)
    if version < 7:
        _session_times_v6_to_v7(db)
    if version < 8:
        _settlement_log_v7_to_v8(db)
    # 8 -> 9 and 9 -> 10: nothing to rewrite (a schema 8 row's meta holds its application properties, a schema 9
    # row's its text fields, which are read as they were); the version keeps an earlier release, which would not
    # find them in the wire, from opening the file


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
    for statement in MESSAGE_STATEMENTS_V5:  # execute, not executescript: that would commit the transaction
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
        db.executemany(INSERT_MESSAGE_V5, lights)
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


def _content_v5_to_v6(db: sqlite3.Connection) -> None:
    """``message`` + ``message_data`` become ``message`` (with its meta) + ``content`` (one row per message, as
    schema 5 held it: its id the data row's, referenced once). A file without messages yet gets the new tables."""
    old = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'message_data'").fetchone()
    if old is None:
        for statement in MESSAGE_STATEMENTS:
            db.execute(statement)
        return
    db.execute("DROP TRIGGER IF EXISTS message_content_gone")
    db.execute("ALTER TABLE message RENAME TO message_v5")
    for statement in MESSAGE_STATEMENTS:
        db.execute(statement)
    # the data: the wire (the body a slice of it, or appended to it), or the body alone
    db.execute(
        "INSERT INTO content (id, data, refs) SELECT d.id, CASE WHEN d.wire IS NULL THEN d.body"
        " WHEN d.body IS NULL THEN d.wire ELSE CAST(d.wire || d.body AS BLOB) END, 1"
        " FROM message_data AS d WHERE d.id IN (SELECT data_id FROM message_v5)"
    )
    db.execute(
        "INSERT INTO message (path, sequence_number, state, delivery_count, enqueued_time_us, expires_at_us, size,"
        " session_id, content_id, dead_letter_reason, dead_letter_error_description, dead_letter_source, meta,"
        " wire_length, body_offset, body_length)"
        " SELECT m.path, m.sequence_number, m.state, m.delivery_count, m.enqueued_time_us, m.expires_at_us, m.size,"
        " m.session_id, m.data_id, m.dead_letter_reason, m.dead_letter_error_description, m.dead_letter_source,"
        " d.meta, length(d.wire),"
        " CASE WHEN d.body IS NULL THEN d.body_offset WHEN d.wire IS NULL THEN 0 ELSE length(d.wire) END,"
        " CASE WHEN d.body IS NULL THEN d.body_length ELSE length(d.body) END"
        " FROM message_v5 AS m JOIN message_data AS d ON d.id = m.data_id"
    )
    db.execute("DROP TABLE message_v5")
    db.execute("DROP TABLE message_data")


def _session_times_v6_to_v7(db: sqlite3.Connection) -> None:
    """Session states get the time they were set: NULL for those already stored (not known)."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(session_state)")}
    if "updated_us" not in columns:  # a file whose tables were created before its version was set has it
        db.execute("ALTER TABLE session_state ADD COLUMN updated_us INTEGER")


def _settlement_log_v7_to_v8(db: sqlite3.Connection) -> None:
    """The settlement log's mark (its table is added by ``SCHEMA``): no record applied yet, as an earlier release
    wrote no log."""
    db.execute(NEW_SETTLEMENT_LOG, (uuid.uuid4().hex,))


NEW_SETTLEMENT_LOG = "INSERT OR IGNORE INTO settlement_log (id, applied_through, store_id) VALUES (0, 0, ?)"
SETTLEMENT_LOG_MARK = "SELECT applied_through, store_id FROM settlement_log WHERE id = 0"
SET_APPLIED_THROUGH = "UPDATE settlement_log SET applied_through = ? WHERE id = 0"
