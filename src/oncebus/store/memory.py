"""An in-memory store for fast unit tests. It survives a broker "restart" within one process."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from oncebus.core.messages import MessageState, StoredMessage
from oncebus.store.base import (
    AddCounters,
    DedupIndexes,
    DeleteEntity,
    DeleteMessage,
    MessageRow,
    MoveMessage,
    Op,
    PruneDedupKeys,
    PutDedupKey,
    PutEntity,
    PutMessage,
    PutRules,
    PutSessionState,
    Snapshot,
    UpdateMessage,
    owned_by,
)


def _row(m: StoredMessage) -> MessageRow:
    return (
        m.path,
        m.sequence_number,
        int(m.state),
        m.delivery_count,
        m.enqueued_time_us,
        m.expires_at_us,
        m.size,
        m.session_id,
    )


class MemoryStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.entities: dict[str, PutEntity] = {}
        self.messages: dict[tuple[str, int], StoredMessage] = {}
        self.dedup: dict[tuple[str, str], int] = {}
        self.sessions: dict[tuple[str, str], tuple[bytes, int | None]] = {}  # (state, set at us)
        self.counters: dict[str, AddCounters] = {}
        self.rules: dict[str, list[dict[str, Any]]] = {}
        self.commits = 0
        self.commit_observer: Callable[[float, int], None] | None = None  # commits here are not timed

    def load(self) -> Snapshot:
        with self._lock:
            keys = sorted(self.dedup.items(), key=lambda kv: kv[1])
            return Snapshot(
                entities=list(self.entities.values()),
                messages=[_row(m) for _, m in sorted(self.messages.items())],
                dedup_keys=[PutDedupKey(e, k, t) for (e, k), t in keys],
                newest_key_us=max(self.dedup.values(), default=0),
                session_states=[PutSessionState(p, s, st, at) for (p, s), (st, at) in self.sessions.items()],
                counters={
                    e: AddCounters(e, c.next_sequence_number, dict(c.counters)) for e, c in self.counters.items()
                },
                rules={path: copy.deepcopy(rules) for path, rules in self.rules.items()},
            )

    def read_messages(self, path: str, sequence_numbers: Sequence[int]) -> dict[int, StoredMessage]:
        with self._lock:
            found = (self.messages.get((path, seq)) for seq in sequence_numbers)
            return {m.sequence_number: m.copy_for(path) for m in found if m is not None}

    def submit(self, unit: Sequence[Op], *, durable: bool = True) -> Future[None]:
        future: Future[None] = Future()
        with self._lock:
            for op in unit:
                self._apply(op)
            if unit:
                self.commits += 1
        future.set_result(None)
        return future

    def _apply(self, op: Op) -> None:
        match op:
            case PutEntity():
                self.entities[op.path] = op
            case DeleteEntity(path=path):
                for key in [k for k in self.entities if owned_by(k, path)]:
                    del self.entities[key]
                self.counters.pop(path, None)
                for mkey in [k for k in self.messages if owned_by(k[0], path)]:
                    del self.messages[mkey]
                for dkey in [k for k in self.dedup if k[0] == path]:
                    del self.dedup[dkey]
                for skey in [k for k in self.sessions if owned_by(k[0], path)]:
                    del self.sessions[skey]
                for rkey in [k for k in self.rules if owned_by(k, path)]:
                    del self.rules[rkey]
            case PutMessage(message=message, dedup_key=dedup_key):
                if dedup_key is not None:
                    self.dedup[(dedup_key[0], dedup_key[1])] = dedup_key[2]
                self.messages[(message.path, message.sequence_number)] = message.copy_for(message.path)
            case DeleteMessage(path=path, sequence_number=seq):
                self.messages.pop((path, seq), None)
            case UpdateMessage(path=path, sequence_number=seq):
                held = self.messages.get((path, seq))
                if held is not None:
                    held.state = MessageState(op.state)
                    held.delivery_count = op.delivery_count
                    if op.application_properties:
                        held.application_properties.update(op.application_properties)
                        held.rewritten = held.rewritten | {"application_properties"}  # a receiver gets it re-encoded
            case MoveMessage(path=path, sequence_number=seq):
                moved = self.messages.pop((path, seq), None)
                if moved is not None:
                    moved.path = op.to_path
                    moved.state = MessageState(op.state)
                    moved.dead_letter_reason = op.dead_letter_reason
                    moved.dead_letter_error_description = op.dead_letter_error_description
                    moved.dead_letter_source = op.dead_letter_source
                    self.messages[(op.to_path, seq)] = moved
            case PutDedupKey(entity=entity, key=key, first_accepted_us=t0):
                self.dedup[(entity, key)] = t0
            case PruneDedupKeys(entity=entity, accepted_before_us=before):
                for dkey in [k for k, t in self.dedup.items() if k[0] == entity and t < before]:
                    del self.dedup[dkey]
            case PutSessionState(path=path, session_id=sid, state=state):
                if state is None:
                    self.sessions.pop((path, sid), None)
                else:
                    self.sessions[(path, sid)] = (state, op.updated_us)
            case PutRules(path=path, rules=rules):
                self.rules[path] = copy.deepcopy(rules)
            case AddCounters(entity=entity, next_sequence_number=next_seq, counters=deltas):
                current = self.counters.get(entity)
                if current is None:
                    current = self.counters[entity] = AddCounters(entity, next_seq, {})
                current.next_sequence_number = max(current.next_sequence_number, next_seq)
                for name, delta in deltas.items():
                    current.counters[name] = current.counters.get(name, 0) + delta

    def commit_now(self, unit: Sequence[Op]) -> bool:
        return False  # ``submit`` commits at once here

    def checkpoint_dedup(self, indexes: DedupIndexes, since_us: int) -> bool:
        return False  # nothing outlives the process: no images

    def keep_dedup_images(self, indexes: Callable[[], DedupIndexes], since_us: int) -> None:
        pass

    def close(self) -> None:
        pass
