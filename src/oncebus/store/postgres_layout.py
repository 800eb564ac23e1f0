"""The PostgreSQL store's layout: its tables, its schema version, and the store's operations as SQL.

Tables are created in the connection's current schema (the first of its ``search_path`` that exists:
``public`` by default; ``?options=-csearch_path%3Dname`` in the URL picks another, so one database can hold
several namespaces), named ``oncebus_*`` so they sit beside other tables without clashing.

Schema versions (table ``oncebus_schema``, one row):

- 1: the first layout. A message is one row (what the broker keeps in memory and reads at start, and its
  content: the wire encoding, with the body kept once as a slice of it where it is one, and the other fields
  as JSON text); TOAST keeps large contents out of the row, so start-up's scan of the small columns does not
  read them. A dedup key is one row per (entity, key) with its first-accepted time: the primary key a later
  multi-node step decides duplicates with, in the transaction that stores the message (``INSERT ... ON
  CONFLICT (entity, key) DO UPDATE ... WHERE`` the stored time left the window), instead of in memory.
  ``oncebus_dedup_image`` holds the dedup index images of the last clean stop (one row per entity).
- 2: ``oncebus_session_state.updated_us``: when the state was set (what ``get-message-sessions`` with a
  last-updated time compares). A version 1 database's states get NULL: not known, they count as set at the start
  that reads them.
- 3: ``oncebus_node``: the address a cluster's leader serves on (``oncebus serve --cluster``), one row per
  leadership, keyed by the server process of the session that holds the node lock; standbys find the leader by
  joining it with ``pg_locks`` (see ``LEADER``), so a row left by a node that died is never taken for the leader's.
  A version 2 database gets the table, empty.
- 4: the message record (see ``StoredMessage.meta_json``): a message whose wire encoding holds its application
  properties no longer writes them again in ``meta``; ``meta`` says where they are in ``wire`` (``"ap": [start,
  end]``) and they are read from there when asked. A version 3 database's rows are read as they are (their
  ``meta`` holds the properties); the version says an earlier release, which would not read them, must not open it.
- 5: nor the properties section's text fields (subject, content type, correlation id, to, reply to, reply-to
  session id): ``meta`` says where the section's list is in ``wire`` (``"pr": [start, end]``), read from there
  when the message is read. A version 4 database's rows are read as they are (their ``meta`` holds them).

``MIGRATIONS[n]`` brings version ``n`` to ``n + 1``; a database at an older version is migrated in one
transaction at start (PostgreSQL's DDL is transactional: all of it or none), a newer one is refused.

Texts a client chooses freely (dedup keys, session ids, dead-letter reasons) are stored as UTF-8 ``bytea``:
PostgreSQL's ``text`` cannot hold NUL, which typed dedup keys start with (see ``oncebus.core.keys``). Paths
are ``text COLLATE "C"``: ordered by code point, as the range queries of ``owned_ranges`` and Python need.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from psycopg import ClientCursor, Connection
from psycopg.types.json import Jsonb

from oncebus.core.messages import StoredMessage, read_wire_properties
from oncebus.store.base import (
    AddCounters,
    DeleteEntity,
    DeleteMessage,
    MoveMessage,
    Op,
    PruneDedupKeys,
    PutDedupKey,
    PutEntity,
    PutMessage,
    PutRules,
    PutSessionState,
    UpdateMessage,
    owned_ranges,
)
from oncebus.store.sqlite_layout import message_rows

SCHEMA_VERSION = 5
VERSION_TABLE = "oncebus_schema"
TABLES = (
    "oncebus_entity",
    "oncebus_message",
    "oncebus_dedup_key",
    "oncebus_session_state",
    "oncebus_counters",
    "oncebus_rules",
    "oncebus_dedup_image",
    "oncebus_node",
)
SCHEMA_LOCK = 0x6F6E63656275  # pg_advisory_xact_lock key: nodes starting together create or migrate once
NODE_LOCK = 0x6F6E6365  # pg_try_advisory_lock(NODE_LOCK, hashtext(schema)): the one node serving a schema

# a cluster's leader (oncebus serve --cluster): where it serves, keyed by its writer session's server process
NODE_TABLE = """CREATE TABLE oncebus_node (
    backend_pid integer PRIMARY KEY,
    node text NOT NULL,
    address jsonb NOT NULL,
    since timestamptz NOT NULL DEFAULT now()
)"""

CREATE = f"""
CREATE TABLE {VERSION_TABLE} (
    version integer NOT NULL,
    written_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE oncebus_entity (
    path text COLLATE "C" PRIMARY KEY,
    kind text NOT NULL,
    properties text NOT NULL
);
CREATE TABLE oncebus_message (
    path text COLLATE "C" NOT NULL,
    sequence_number bigint NOT NULL,
    state smallint NOT NULL,
    delivery_count integer NOT NULL,
    enqueued_time_us bigint NOT NULL,
    expires_at_us bigint,
    size integer NOT NULL,
    session_id bytea,
    dead_letter_reason bytea,
    dead_letter_error_description bytea,
    dead_letter_source bytea,
    meta text NOT NULL,
    body bytea,
    body_offset integer,
    body_length integer,
    wire bytea,
    PRIMARY KEY (path, sequence_number)
);
CREATE TABLE oncebus_dedup_key (
    entity text COLLATE "C" NOT NULL,
    key bytea NOT NULL,
    first_accepted_us bigint NOT NULL,
    PRIMARY KEY (entity, key)
);
CREATE INDEX oncebus_dedup_key_by_time ON oncebus_dedup_key (entity, first_accepted_us);
CREATE TABLE oncebus_session_state (
    path text COLLATE "C" NOT NULL,
    session_id bytea NOT NULL,
    state bytea NOT NULL,
    updated_us bigint,
    PRIMARY KEY (path, session_id)
);
CREATE TABLE oncebus_counters (
    entity text COLLATE "C" PRIMARY KEY,
    next_sequence_number bigint NOT NULL,
    counters jsonb NOT NULL
);
CREATE TABLE oncebus_rules (
    path text COLLATE "C" PRIMARY KEY,
    rules text NOT NULL
);
-- an image of each dedup index written at the last clean stop (DedupIndex.dump), its CRC-32 and its mark: the keys
-- first accepted at or after since_us are read from oncebus_dedup_key on top of it; deleting the entity deletes it
CREATE TABLE oncebus_dedup_image (
    entity text COLLATE "C" PRIMARY KEY,
    image bytea NOT NULL,
    crc bigint NOT NULL,
    since_us bigint NOT NULL
);
{NODE_TABLE};
INSERT INTO {VERSION_TABLE} (version) VALUES ({SCHEMA_VERSION});
"""

# version n -> the statements that bring it to n + 1
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: ("ALTER TABLE oncebus_session_state ADD COLUMN updated_us bigint",),
    2: (NODE_TABLE,),
    3: (),  # the rows stay as they are: a version 3 message's meta holds its application properties
    4: (),  # the rows stay as they are: a version 4 message's meta holds its text fields
}
# the leader of this schema's cluster: the node row of the session holding the node lock (none: no leader now)
LEADER = (
    "SELECT n.node, n.address, n.backend_pid FROM pg_locks AS l JOIN oncebus_node AS n ON n.backend_pid = l.pid"
    " WHERE l.locktype = 'advisory' AND l.granted AND l.classid = %s AND l.objsubid = 2"
    " AND l.objid = hashtext(current_schema())::oid"
)
# the leader's announcement, in the session holding the lock; rows of sessions that ended go
ANNOUNCE = (
    "INSERT INTO oncebus_node (backend_pid, node, address) VALUES (pg_backend_pid(), %s, %s)"
    " ON CONFLICT (backend_pid) DO UPDATE SET node = EXCLUDED.node, address = EXCLUDED.address, since = now()"
)
FORGET_ENDED = "DELETE FROM oncebus_node WHERE backend_pid NOT IN (SELECT pid FROM pg_stat_activity)"

_MESSAGE_COLUMNS = (
    "path, sequence_number, state, delivery_count, enqueued_time_us, expires_at_us, size, session_id,"
    " dead_letter_reason, dead_letter_error_description, dead_letter_source, meta, body, body_offset, body_length,"
    " wire"
)
INSERT_MESSAGE = (
    f"INSERT INTO oncebus_message ({_MESSAGE_COLUMNS}) VALUES"
    " (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
    " ON CONFLICT (path, sequence_number) DO UPDATE SET state = EXCLUDED.state,"
    " delivery_count = EXCLUDED.delivery_count, enqueued_time_us = EXCLUDED.enqueued_time_us,"
    " expires_at_us = EXCLUDED.expires_at_us, size = EXCLUDED.size, session_id = EXCLUDED.session_id,"
    " dead_letter_reason = EXCLUDED.dead_letter_reason,"
    " dead_letter_error_description = EXCLUDED.dead_letter_error_description,"
    " dead_letter_source = EXCLUDED.dead_letter_source, meta = EXCLUDED.meta, body = EXCLUDED.body,"
    " body_offset = EXCLUDED.body_offset, body_length = EXCLUDED.body_length, wire = EXCLUDED.wire"
)
DELETE_MESSAGE = "DELETE FROM oncebus_message WHERE path = %s AND sequence_number = %s"
# one row per (entity, key): a key accepted again (it had left the window) takes its new time
INSERT_KEY = (
    "INSERT INTO oncebus_dedup_key (entity, key, first_accepted_us) VALUES (%s, %s, %s)"
    " ON CONFLICT (entity, key) DO UPDATE SET first_accepted_us = EXCLUDED.first_accepted_us"
)
ADD_COUNTERS = """
INSERT INTO oncebus_counters AS c (entity, next_sequence_number, counters) VALUES (%s, %s, %s)
ON CONFLICT (entity) DO UPDATE SET
    next_sequence_number = GREATEST(c.next_sequence_number, EXCLUDED.next_sequence_number),
    counters = COALESCE((
        SELECT jsonb_object_agg(name, COALESCE((c.counters ->> name)::bigint, 0)
                                      + COALESCE((EXCLUDED.counters ->> name)::bigint, 0))
        FROM (SELECT jsonb_object_keys(c.counters) UNION SELECT jsonb_object_keys(EXCLUDED.counters)) AS names(name)
    ), '{}'::jsonb)
"""
SELECT_ROWS = (
    "SELECT path, sequence_number, state, delivery_count, enqueued_time_us, expires_at_us, size, session_id"
    " FROM oncebus_message ORDER BY path, sequence_number"
)
SELECT_KEYS = (
    "SELECT entity, key, first_accepted_us FROM oncebus_dedup_key WHERE entity = ANY(%s)"
    " ORDER BY entity, first_accepted_us"
)
# the keys of each entity first accepted at or after its mark (0: all of them)
SELECT_KEYS_SINCE = (
    "SELECT k.entity, k.key, k.first_accepted_us FROM unnest(%s::text[], %s::bigint[]) AS w(entity, since_us)"
    " JOIN oncebus_dedup_key AS k ON k.entity = w.entity AND k.first_accepted_us >= w.since_us"
    " ORDER BY k.entity, k.first_accepted_us"
)
NEWEST_KEY = (
    "SELECT GREATEST(COALESCE(MAX((SELECT MAX(k.first_accepted_us) FROM oncebus_dedup_key AS k"
    " WHERE k.entity = e.path)), 0), (SELECT COALESCE(MAX(since_us), 0) FROM oncebus_dedup_image))"
    " FROM oncebus_entity AS e"
)
_SELECT_CONTENT = (
    "SELECT sequence_number, state, delivery_count, enqueued_time_us, expires_at_us, session_id, dead_letter_reason,"
    " dead_letter_error_description, dead_letter_source, meta, body, body_offset, body_length, wire"
    " FROM oncebus_message WHERE path = %s AND sequence_number = ANY(%s)"
)


def encode(text: str | None) -> bytes | None:
    return None if text is None else text.encode("utf-8", "surrogatepass")


def decode(data: bytes | None) -> str | None:
    return None if data is None else bytes(data).decode("utf-8", "surrogatepass")


def message_row(m: StoredMessage) -> tuple[object, ...]:
    _, data = message_rows(m, 0)  # the SQLite layout's split (the body once, as a slice of the wire)
    _, meta, body, offset, length, wire = data
    return (
        m.path,
        m.sequence_number,
        int(m.state),
        m.delivery_count,
        m.enqueued_time_us,
        m.expires_at_us,
        m.size,
        encode(m.session_id),
        encode(m.dead_letter_reason),
        encode(m.dead_letter_error_description),
        encode(m.dead_letter_source),
        meta,
        body,
        offset,
        length,
        wire,
    )


def read_content(db: Connection[Any], path: str, sequence_numbers: Sequence[int]) -> dict[int, StoredMessage]:
    found: dict[int, StoredMessage] = {}
    for start in range(0, len(sequence_numbers), 1000):
        chunk = list(sequence_numbers[start : start + 1000])
        for row in db.execute(_SELECT_CONTENT, (path, chunk)):
            seq, state, count, enq, exp, session, reason, description, source, meta, body, off, length, wire = row
            wire = None if wire is None else bytes(wire)
            body_offset = None
            if body is None:
                assert wire is not None
                body = wire[off : off + length]
                body_offset = off
            found[seq] = StoredMessage.from_row(
                path=path,
                sequence_number=seq,
                state=state,
                delivery_count=count,
                enqueued_time_us=enq,
                expires_at_us=exp,
                body=bytes(body),
                wire=wire,
                meta=meta,
                session_id=decode(session),
                dead_letter_reason=decode(reason),
                dead_letter_error_description=decode(description),
                dead_letter_source=decode(source),
                body_offset=body_offset,
            )
    return found


_SETTLEMENT_SQL = {
    "delete": DELETE_MESSAGE,
    "update": "UPDATE oncebus_message SET state = %s, delivery_count = %s WHERE path = %s AND sequence_number = %s",
    "move": (
        "UPDATE oncebus_message SET path = %s, state = %s, dead_letter_reason = %s,"
        " dead_letter_error_description = %s, dead_letter_source = %s WHERE path = %s AND sequence_number = %s"
    ),
}


def settlement_script(cursor: ClientCursor[Any], ops: list[Op]) -> str | None:
    """A settlements-only transaction as one script (one round trip: ``BEGIN; ...; COMMIT``), its values quoted
    by the driver (``ClientCursor.mogrify``); None when ``ops`` hold anything else (or a change of properties,
    which reads the stored ones first). The per-statement machinery of a pipeline costs more than the work here.
    """
    statements = ["BEGIN", "SET LOCAL synchronous_commit = off"]
    counters: dict[str, AddCounters] = {}
    values: tuple[object, ...]
    for op in ops:
        if isinstance(op, DeleteMessage):
            statements.append(cursor.mogrify(_SETTLEMENT_SQL["delete"], (op.path, op.sequence_number)))
        elif isinstance(op, UpdateMessage) and not op.application_properties:
            values = (op.state, op.delivery_count, op.path, op.sequence_number)
            statements.append(cursor.mogrify(_SETTLEMENT_SQL["update"], values))
        elif isinstance(op, MoveMessage):
            values = (
                op.to_path,
                op.state,
                encode(op.dead_letter_reason),
                encode(op.dead_letter_error_description),
                encode(op.dead_letter_source),
                op.path,
                op.sequence_number,
            )
            statements.append(cursor.mogrify(_SETTLEMENT_SQL["move"], values))
        elif isinstance(op, AddCounters):
            merged = counters.get(op.entity)
            if merged is None:
                counters[op.entity] = AddCounters(op.entity, op.next_sequence_number, dict(op.counters))
            else:
                merged.next_sequence_number = max(merged.next_sequence_number, op.next_sequence_number)
                for name, delta in op.counters.items():
                    merged.counters[name] = merged.counters.get(name, 0) + delta
        else:
            return None
    for merged in counters.values():
        values = (merged.entity, merged.next_sequence_number, Jsonb(merged.counters))
        statements.append(cursor.mogrify(ADD_COUNTERS, values))
    statements.append("COMMIT")
    return ";\n".join(statements)


class OpWriter:
    """Applies units' operations inside the caller's transaction (its pipeline: few round trips)."""

    def __init__(self) -> None:
        self._deleted: list[str] = []  # entities deleted by the operations applied since ``take_deleted``

    def take_deleted(self) -> list[str]:
        """The entities deleted since the last call (whether their transaction committed or not)."""
        deleted, self._deleted = self._deleted, []
        return deleted

    def apply_all(self, db: Connection[Any], ops: list[Op]) -> None:
        """Apply a group's operations with the same effect as one by one, in fewer statements.

        As in the SQLite store: dedup keys and counters commute with message writes, so when the group touches
        no definitions, history pruning or session state they are written last, and runs of message writes
        (and of deletions) go through ``executemany``; a group's counters are merged into one row per entity.
        """
        if any(isinstance(op, PutEntity | DeleteEntity | PruneDedupKeys | PutSessionState | PutRules) for op in ops):
            for op in ops:
                self.apply(db, op)
            return
        puts: list[tuple[object, ...]] = []
        deletes: list[tuple[str, int]] = []
        keys: dict[tuple[str, bytes], int] = {}  # the last time given to each key wins, as one by one
        counters: dict[str, AddCounters] = {}
        cursor = db.cursor()

        def flush() -> None:
            if puts:
                cursor.executemany(INSERT_MESSAGE, puts)
                puts.clear()
            if deletes:
                cursor.executemany(DELETE_MESSAGE, deletes)
                deletes.clear()

        for op in ops:
            if isinstance(op, PutMessage):
                if deletes:
                    flush()
                puts.append(message_row(op.message))
                if op.dedup_key is not None:
                    entity, key, t0 = op.dedup_key
                    keys[(entity, key.encode("utf-8", "surrogatepass"))] = t0
            elif isinstance(op, DeleteMessage):
                if puts:
                    flush()
                deletes.append((op.path, op.sequence_number))
            elif isinstance(op, PutDedupKey):
                keys[(op.entity, op.key.encode("utf-8", "surrogatepass"))] = op.first_accepted_us
            elif isinstance(op, AddCounters):
                merged = counters.get(op.entity)
                if merged is None:
                    counters[op.entity] = AddCounters(op.entity, op.next_sequence_number, dict(op.counters))
                else:
                    merged.next_sequence_number = max(merged.next_sequence_number, op.next_sequence_number)
                    for name, delta in op.counters.items():
                        merged.counters[name] = merged.counters.get(name, 0) + delta
            else:
                flush()
                self.apply(db, op)
        flush()
        if keys:
            cursor.executemany(INSERT_KEY, [(entity, key, t0) for (entity, key), t0 in keys.items()])
        for op in counters.values():
            self.apply(db, op)

    def apply(self, db: Connection[Any], op: Op) -> None:
        match op:
            case PutEntity(path=path, kind=kind, properties=props):
                db.execute(
                    "INSERT INTO oncebus_entity (path, kind, properties) VALUES (%s, %s, %s)"
                    " ON CONFLICT (path) DO UPDATE SET kind = EXCLUDED.kind, properties = EXCLUDED.properties",
                    (path, kind, json.dumps(props)),
                )
            case DeleteEntity(path=path):
                # exactly what belongs to the entity (base.owned_by): never another entity named path + "/..."
                (own, dead_letter), (low, high) = owned_ranges(path)
                for table in ("oncebus_entity", "oncebus_message", "oncebus_session_state", "oncebus_rules"):
                    db.execute(
                        f"DELETE FROM {table} WHERE path IN (%s, %s) OR (path >= %s AND path < %s)",
                        (own, dead_letter, low, high),
                    )
                db.execute("DELETE FROM oncebus_counters WHERE entity = %s", (path,))
                db.execute("DELETE FROM oncebus_dedup_key WHERE entity = %s", (path,))
                db.execute("DELETE FROM oncebus_dedup_image WHERE entity = %s", (path,))  # void now
                self._deleted.append(path)
            case PutMessage(message=m, dedup_key=dedup_key):
                db.execute(INSERT_MESSAGE, message_row(m))
                if dedup_key is not None:
                    db.execute(INSERT_KEY, (dedup_key[0], dedup_key[1].encode("utf-8", "surrogatepass"), dedup_key[2]))
            case UpdateMessage(path=path, sequence_number=seq, state=state, delivery_count=count):
                db.execute(
                    "UPDATE oncebus_message SET state = %s, delivery_count = %s"
                    " WHERE path = %s AND sequence_number = %s",
                    (state, count, path, seq),
                )
                if op.application_properties:
                    _patch_properties(db, path, seq, op.application_properties)
            case MoveMessage(path=path, sequence_number=seq, to_path=to_path, state=state):
                db.execute(
                    "UPDATE oncebus_message SET path = %s, state = %s, dead_letter_reason = %s,"
                    " dead_letter_error_description = %s, dead_letter_source = %s"
                    " WHERE path = %s AND sequence_number = %s",
                    (
                        to_path,
                        state,
                        encode(op.dead_letter_reason),
                        encode(op.dead_letter_error_description),
                        encode(op.dead_letter_source),
                        path,
                        seq,
                    ),
                )
            case DeleteMessage(path=path, sequence_number=seq):
                db.execute(DELETE_MESSAGE, (path, seq))
            case PutDedupKey(entity=entity, key=key, first_accepted_us=t0):
                db.execute(INSERT_KEY, (entity, key.encode("utf-8", "surrogatepass"), t0))
            case PruneDedupKeys(entity=entity, accepted_before_us=before):
                db.execute(
                    "DELETE FROM oncebus_dedup_key WHERE entity = %s AND first_accepted_us < %s", (entity, before)
                )
            case PutSessionState(path=path, session_id=sid, state=state):
                if state is None:
                    db.execute(
                        "DELETE FROM oncebus_session_state WHERE path = %s AND session_id = %s", (path, encode(sid))
                    )
                else:
                    db.execute(
                        "INSERT INTO oncebus_session_state (path, session_id, state, updated_us)"
                        " VALUES (%s, %s, %s, %s)"
                        " ON CONFLICT (path, session_id) DO UPDATE SET state = EXCLUDED.state,"
                        " updated_us = EXCLUDED.updated_us",
                        (path, encode(sid), state, op.updated_us),
                    )
            case PutRules(path=path, rules=rules):
                db.execute(
                    "INSERT INTO oncebus_rules (path, rules) VALUES (%s, %s)"
                    " ON CONFLICT (path) DO UPDATE SET rules = EXCLUDED.rules",
                    (path, json.dumps(rules)),
                )
            case AddCounters(entity=entity, next_sequence_number=next_seq, counters=deltas):
                db.execute(ADD_COUNTERS, (entity, next_seq, Jsonb(deltas)))


def _patch_properties(db: Connection[Any], path: str, seq: int, changes: dict[str, Any]) -> None:
    """Merge ``changes`` into a stored message's application properties (abandon with modifications)."""
    row = db.execute(
        "SELECT meta, wire FROM oncebus_message WHERE path = %s AND sequence_number = %s", (path, seq)
    ).fetchone()
    if row is None:
        return
    meta = json.loads(row[0])
    span = meta.pop("ap", None)  # version 4: held in the wire, not in the meta
    if span is not None and row[1] is not None:
        properties = read_wire_properties(bytes(row[1]), span[0], span[1])
    else:
        properties = dict(meta.get("application_properties") or {})
    properties.update(changes)
    meta["application_properties"] = properties
    # the sender's encoding no longer holds them: a receiver gets it encoded again (StoredMessage.rewritten)
    meta["rewritten"] = sorted({*meta.get("rewritten", ()), "application_properties"})
    db.execute(
        "UPDATE oncebus_message SET meta = %s WHERE path = %s AND sequence_number = %s",
        (json.dumps(meta, separators=(",", ":"), default=str), path, seq),
    )
