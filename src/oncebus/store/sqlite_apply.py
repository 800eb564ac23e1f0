"""The store's operations as SQL on the writer's connection, inside the caller's transaction."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable

from oncebus.core.messages import StoredMessage
from oncebus.store import sqlite_layout as layout
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

# what must be applied one by one, in order (keys and counters are written after the group's messages otherwise)
_IN_ORDER = frozenset((PutEntity, DeleteEntity, PruneDedupKeys, PutSessionState, PutRules))


class OpWriter:
    """Applies units' operations; numbers the content rows it writes (``next_data_id``)."""

    def __init__(self, next_data_id: int) -> None:
        self.next_data_id = next_data_id
        self._deleted: list[str] = []  # entities deleted by the operations applied since ``take_deleted``

    def take_deleted(self) -> list[str]:
        """The entities deleted since the last call (whether their transaction committed or not)."""
        deleted, self._deleted = self._deleted, []
        return deleted

    def apply_all(self, db: sqlite3.Connection, ops: list[Op]) -> None:
        """Apply a group's operations with the same effect as one by one, in fewer statements.

        Dedup keys and counters commute with message writes, so when the group
        touches no entity definitions or history pruning they are written last,
        and runs of message writes (and of message deletions) go through ``executemany``.
        """
        if not _IN_ORDER.isdisjoint(map(type, ops)):  # (the op classes are final dataclasses: their type is exact)
            for op in ops:
                self.apply(db, op)
            return
        rows = layout.ContentRows(self.next_data_id)
        deletes: list[tuple[str, int]] = []
        keys: list[tuple[str, int, str]] = []
        counters: dict[str, AddCounters] = {}
        add = rows.add
        try:
            self._group(db, ops, rows, add, deletes, keys, counters)
        finally:
            self.next_data_id = rows.next_id

    def _group(
        self,
        db: sqlite3.Connection,
        ops: list[Op],
        rows: layout.ContentRows,
        add: Callable[[StoredMessage], None],
        deletes: list[tuple[str, int]],
        keys: list[tuple[str, int, str]],
        counters: dict[str, AddCounters],
    ) -> None:
        for op in ops:
            if type(op) is PutMessage:
                if deletes:
                    _flush(db, deletes, rows)
                add(op.message)
                if op.dedup_key is not None:
                    entity, key, t0 = op.dedup_key
                    keys.append((entity, t0, key))
            elif isinstance(op, DeleteMessage):
                if rows.messages:
                    _flush(db, deletes, rows)
                deletes.append((op.path, op.sequence_number))
            elif isinstance(op, PutDedupKey):
                keys.append((op.entity, op.first_accepted_us, op.key))
            elif isinstance(op, AddCounters):
                merged = counters.get(op.entity)
                if merged is None:
                    counters[op.entity] = AddCounters(op.entity, op.next_sequence_number, dict(op.counters))
                else:
                    merged.next_sequence_number = max(merged.next_sequence_number, op.next_sequence_number)
                    for name, delta in op.counters.items():
                        merged.counters[name] = merged.counters.get(name, 0) + delta
            else:
                _flush(db, deletes, rows)
                self.next_data_id = rows.next_id
                self.apply(db, op)
                rows.next_id = self.next_data_id
        _flush(db, deletes, rows)
        if keys:
            db.executemany(layout.INSERT_KEY, keys)
        for op in counters.values():
            self.apply(db, op)

    def apply(self, db: sqlite3.Connection, op: Op) -> None:
        match op:
            case PutEntity(path=path, kind=kind, properties=props):
                db.execute(
                    "INSERT OR REPLACE INTO entity (path, kind, properties) VALUES (?, ?, ?)",
                    (path, kind, json.dumps(props)),
                )
            case DeleteEntity(path=path):
                # exactly what belongs to the entity (base.owned_by): never another entity named path + "/..."
                (own, dead_letter), (low, high) = owned_ranges(path)
                for table in ("entity", "message", "session_state", "subscription_rules"):
                    db.execute(
                        f"DELETE FROM {table} WHERE path IN (?, ?) OR (path >= ? AND path < ?)",
                        (own, dead_letter, low, high),
                    )
                db.execute("DELETE FROM counters WHERE entity = ?", (path,))
                db.execute("DELETE FROM dedup_key WHERE entity = ?", (path,))
                db.execute("DELETE FROM dedup_checkpoint WHERE entity = ?", (path,))  # its image is void now
                self._deleted.append(path)
            case PutMessage(message=m, dedup_key=dedup_key):
                rows = layout.ContentRows(self.next_data_id)
                rows.add(m)
                rows.flush(db)
                self.next_data_id = rows.next_id
                if dedup_key is not None:
                    db.execute(layout.INSERT_KEY, (dedup_key[0], dedup_key[2], dedup_key[1]))
            case UpdateMessage(path=path, sequence_number=seq, state=state, delivery_count=count):
                db.execute(
                    "UPDATE message SET state = ?, delivery_count = ? WHERE path = ? AND sequence_number = ?",
                    (state, count, path, seq),
                )
                if op.application_properties:
                    layout.patch_properties(db, path, seq, op.application_properties)
            case MoveMessage(path=path, sequence_number=seq, to_path=to_path, state=state):
                db.execute(
                    "UPDATE message SET path = ?, state = ?, dead_letter_reason = ?, dead_letter_error_description = ?,"
                    " dead_letter_source = ? WHERE path = ? AND sequence_number = ?",
                    (
                        to_path,
                        state,
                        op.dead_letter_reason,
                        op.dead_letter_error_description,
                        op.dead_letter_source,
                        path,
                        seq,
                    ),
                )
            case DeleteMessage(path=path, sequence_number=seq):
                db.execute(layout.DELETE_MESSAGE, (path, seq))
            case PutDedupKey(entity=entity, key=key, first_accepted_us=t0):
                db.execute(layout.INSERT_KEY, (entity, t0, key))
            case PruneDedupKeys(entity=entity, accepted_before_us=before):
                db.execute("DELETE FROM dedup_key WHERE entity = ? AND first_accepted_us < ?", (entity, before))
            case PutSessionState(path=path, session_id=sid, state=state):
                if state is None:
                    db.execute("DELETE FROM session_state WHERE path = ? AND session_id = ?", (path, sid))
                else:
                    db.execute(
                        "INSERT OR REPLACE INTO session_state (path, session_id, state, updated_us)"
                        " VALUES (?, ?, ?, ?)",
                        (path, sid, state, op.updated_us),
                    )
            case PutRules(path=path, rules=rules):
                db.execute(
                    "INSERT OR REPLACE INTO subscription_rules (path, rules) VALUES (?, ?)", (path, json.dumps(rules))
                )
            case AddCounters(entity=entity, next_sequence_number=next_seq, counters=deltas):
                row = db.execute(
                    "SELECT next_sequence_number, counters FROM counters WHERE entity = ?", (entity,)
                ).fetchone()
                totals: dict[str, int] = {} if row is None else json.loads(row[1])
                for name, delta in deltas.items():
                    totals[name] = totals.get(name, 0) + delta
                db.execute(
                    "INSERT OR REPLACE INTO counters (entity, next_sequence_number, counters) VALUES (?, ?, ?)",
                    (entity, next_seq if row is None else max(row[0], next_seq), json.dumps(totals)),
                )


def _flush(db: sqlite3.Connection, deletes: list[tuple[str, int]], rows: layout.ContentRows) -> None:
    rows.flush(db)
    if deletes:
        db.executemany(layout.DELETE_MESSAGE, deletes)
        deletes.clear()
