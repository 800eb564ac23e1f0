"""Message content on demand: a bounded cache of recently sent messages in front of the store.

The broker keeps only an ``Entry`` per message; a delivery (or a peek) reads the
content (body, wire encoding, properties) from here. Messages just sent are
likely the next delivered, so each committed send puts its records in the cache,
evicting the least recently used past ``max_bytes``, when a receiver of theirs is waiting for them; a send
that joins a backlog takes only the room left (a full cache keeps the backlog's head, which is read first,
rather than freeing it for the tail). Misses read the store.
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
        self._records: OrderedDict[tuple[str, int], StoredMessage] = OrderedDict()
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
        if self.max_bytes <= 0:
            return
        key = (record.path, record.sequence_number)
        old = self._records.pop(key, None)
        if old is not None:
            self.bytes -= _cost(old)
        self._records[key] = record
        self.bytes += _cost(record)
        while self.bytes > self.max_bytes and self._records:
            _, evicted = self._records.popitem(last=False)
            self.bytes -= _cost(evicted)

    def put_many(self, records: list[StoredMessage], *, evict: bool = True) -> None:
        """A committed send's records. ``evict`` False (none of their receivers was waiting: they join a backlog, and
        are delivered after what is queued before them): they take only the room the cache has, and a full cache
        keeps what it holds (the backlog's head, which its receivers read first) instead of evicting it for them;
        those left out are read from the store when delivered. A record already cached is replaced either way."""
        if self.max_bytes <= 0:
            return
        cached = self._records
        added = 0
        room = self.max_bytes - self.bytes
        for record in records:
            key = (record.path, record.sequence_number)
            if key in cached:
                self.put(record)
                room = self.max_bytes - self.bytes - added
                continue
            cost = _cost(record)
            if not evict and cost > room:
                continue
            cached[key] = record
            added += cost
            room -= cost
        self.bytes += added
        while self.bytes > self.max_bytes and cached:
            _, evicted = cached.popitem(last=False)
            self.bytes -= _cost(evicted)

    def discard(self, path: str, seq: int) -> None:
        self._pinned.pop((path, seq), None)
        record = self._records.pop((path, seq), None)
        if record is not None:
            self.bytes -= _cost(record)

    def move(self, move: MoveMessage) -> None:
        """A message went to its dead-letter queue: its cached content goes along, and until the move is
        committed (``moved``), a read at the new place that the store cannot answer reads the old one."""
        self._moves[(move.to_path, move.sequence_number)] = move
        record = self._records.pop((move.path, move.sequence_number), None)
        if record is None:
            return
        self.bytes -= _cost(record)
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
        self._records.clear()
        self.bytes = 0

    def read(self, path: str, sequence_numbers: Sequence[int]) -> dict[int, StoredMessage]:
        """The content of these messages of ``path`` (those that exist), from the cache or the store."""
        found: dict[int, StoredMessage] = {}
        missing: list[int] = []
        records = self._records
        pinned = self._pinned
        for seq in sequence_numbers:
            record = records.get((path, seq)) or pinned.get((path, seq))
            if record is None:
                missing.append(seq)
            else:
                found[seq] = record
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
