"""Message content on demand: a bounded cache of recently sent messages in front of the store.

The broker keeps only an ``Entry`` per message; a delivery (or a peek) reads the
content (body, wire encoding, properties) from here. Messages just sent are
likely the next delivered, so each committed send puts its records in the cache, up to ``max_bytes``. Misses read
the store.

When it is full, what gives way is chosen by entity, as receivers will read:
- a send that joins a backlog (none of its receivers waits for it) takes room from the backlogs no receiver has
  read from while they were cached (a queue nobody receives from, a dead-letter queue left alone), least recently
  sent to first, each losing its newest records first so that it keeps its head; never from its own head, which
  its receivers read first, nor from an entity receivers are reading. Without such room it is left to the store;
- a send a receiver waits for takes that room first, then the oldest records of the entities being read (its own
  included), least recently sent to first.
So an idle backlog cannot hold the cache against the entities that are received from.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from oncebus.core.messages import StoredMessage
from oncebus.store.base import MoveMessage, Store

DEFAULT_CACHE_BYTES = 64 * 1024 * 1024
_OVERHEAD = 800  # bytes of a cached record beyond its body and encoding (its object and fields), roughly


def _cost(record: StoredMessage) -> int:
    return len(record.body) + (len(record.wire) if record.wire is not None else 0) + _OVERHEAD


class ContentCache:
    def __init__(self, store: Store, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.store = store
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        # each entity's cached records, in the order they were put (its head first)
        self._held: dict[str, OrderedDict[int, StoredMessage]] = {}
        # every entity of ``_held`` in one of two orders, least recently sent to first: those no receiver read from
        # (idle backlogs), and those a receiver read from (kept while empty: still being received)
        self._idle: OrderedDict[str, None] = OrderedDict()
        self._reading: OrderedDict[str, None] = OrderedDict()
        # placed in memory before their write is committed (the timers' forwards and releases): never evicted
        self._pinned: dict[tuple[str, int], StoredMessage] = {}
        self._moves: dict[tuple[str, int], MoveMessage] = {}  # dead-lettered, the move not committed yet

    def pin(self, record: StoredMessage) -> None:
        self._pinned[(record.path, record.sequence_number)] = record

    def pinned(self, record: StoredMessage) -> bool:
        return self._pinned.get((record.path, record.sequence_number)) is record

    def unpin(self, record: StoredMessage) -> None:
        """The record's write is committed: it is an ordinary cached record now."""
        key = (record.path, record.sequence_number)
        if self._pinned.get(key) is record:
            del self._pinned[key]
            self.put(record)

    def put(self, record: StoredMessage) -> None:
        """One record its receivers may be waiting for (as ``put_many`` with ``evict``)."""
        self.put_many([record])

    def put_many(self, records: list[StoredMessage], *, evict: bool = True) -> None:
        """A committed send's records. ``evict`` False: none of their receivers was waiting, they join a backlog and
        are delivered after what is queued before them, so they take only the room the cache has or that idle
        backlogs of other entities give (see the module); those left out are read from the store when delivered.
        A record already cached is replaced either way."""
        if self.max_bytes <= 0:
            return
        for record in records:
            path = record.path
            self._take(path, record.sequence_number)  # (a record already cached: replaced)
            held = self._held.get(path)
            if held is None:
                held = self._held[path] = OrderedDict()
                self._idle[path] = None
            cost = _cost(record)
            if self.max_bytes - self.bytes < cost and cost <= self.max_bytes:  # (larger than the cache: evicts none)
                self._free(cost, path, evict)
            if self.max_bytes - self.bytes < cost:  # no room: read from the store when delivered
                if not held:
                    self._forget_idle(path)
                continue
            held[record.sequence_number] = record
            self.bytes += cost
            (self._reading if path in self._reading else self._idle).move_to_end(path)

    def _free(self, need: int, path: str, evict: bool) -> None:
        """Evict until ``need`` bytes fit: first from the idle backlogs of other entities than ``path`` (their newest
        records), then, with ``evict``, from the entities being read and last ``path`` itself (their oldest)."""
        while self.max_bytes - self.bytes < need:
            victim = next((p for p in self._idle if p != path), None)
            newest = True
            if victim is None and evict:
                newest = False
                victim = next((p for p in self._reading if p != path), None)
                if victim is None and self._held[path]:
                    victim = path
            if victim is None:
                return
            held = self._held[victim]
            if not held:  # an entity being read, its records all gone: out of the order
                del self._held[victim]
                del self._reading[victim]
                continue
            _, evicted = held.popitem(last=newest)
            self.bytes -= _cost(evicted)
            if victim != path and not held:
                self._forget_idle(victim)

    def _take(self, path: str, seq: int) -> StoredMessage | None:
        """Take one record out of the cache (None if not cached); an idle entity left without records goes."""
        held = self._held.get(path)
        record = None if held is None else held.pop(seq, None)
        if record is None:
            return None
        self.bytes -= _cost(record)
        if not held:
            self._forget_idle(path)
        return record

    def _forget_idle(self, path: str) -> None:
        """``path`` holds no record: out of the cache unless it is being read (see ``_reading``)."""
        if self._idle.pop(path, 0) is None:
            del self._held[path]

    def discard(self, path: str, seq: int) -> None:
        self._pinned.pop((path, seq), None)
        self._take(path, seq)

    def move(self, move: MoveMessage) -> None:
        """A message went to its dead-letter queue: its cached content goes along, and until the move is
        committed (``moved``), a read at the new place that the store cannot answer reads the old one."""
        self._moves[(move.to_path, move.sequence_number)] = move
        record = self._take(move.path, move.sequence_number)
        if record is None:
            return
        record.path = move.to_path
        record.dead_letter_reason = move.dead_letter_reason
        record.dead_letter_error_description = move.dead_letter_error_description
        record.dead_letter_source = move.dead_letter_source
        self.put(record)

    def moved(self, move: MoveMessage) -> None:
        """The move is committed."""
        key = (move.to_path, move.sequence_number)
        if self._moves.get(key) is move:
            del self._moves[key]

    def clear(self) -> None:
        self._moves.clear()
        self._pinned.clear()
        self._held.clear()
        self._idle.clear()
        self._reading.clear()
        self.bytes = 0

    def read(self, path: str, sequence_numbers: Sequence[int]) -> dict[int, StoredMessage]:
        """The content of these messages of ``path`` (those that exist), from the cache or the store. A read marks
        the entity's cached records as being received: another entity's backlog no longer takes their room."""
        found: dict[int, StoredMessage] = {}
        missing: list[int] = []
        held = self._held.get(path)
        records: dict[int, StoredMessage] = {} if held is None else held
        pinned = self._pinned
        for seq in sequence_numbers:
            record = records.get(seq) or pinned.get((path, seq))
            if record is None:
                missing.append(seq)
            else:
                found[seq] = record
        if held is not None and self._idle.pop(path, 0) is None:  # it was idle: being received now
            self._reading[path] = None
        self.hits += len(found)
        if missing:
            self.misses += len(missing)
            found.update(self.store.read_messages(path, missing))
            for seq in missing:
                move = self._moves.get((path, seq))
                if move is not None and seq not in found:
                    for record in self.store.read_messages(move.path, [seq]).values():
                        record.path = path
                        record.dead_letter_reason = move.dead_letter_reason
                        record.dead_letter_error_description = move.dead_letter_error_description
                        record.dead_letter_source = move.dead_letter_source
                        found[seq] = record
                    if seq not in found:  # the move was committed between the two reads: it is at the new place now
                        found.update(self.store.read_messages(path, [seq]))
        return found
