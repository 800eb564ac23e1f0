"""Message content on demand: a bounded cache of recently sent messages in front of the store.

The broker keeps only an ``Entry`` per message; a delivery (or a peek) reads the
content (body, wire encoding, properties) from here. Messages just sent are
likely the next delivered, so each committed send puts its records in the cache,
evicting the least recently used past ``max_bytes``; misses read the store.
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

    def discard(self, path: str, seq: int) -> None:
        record = self._records.pop((path, seq), None)
        if record is not None:
            self.bytes -= _cost(record)

    def move(self, move: MoveMessage) -> None:
        """A message went to its dead-letter queue: its cached content goes along."""
        record = self._records.pop((move.path, move.sequence_number), None)
        if record is None:
            return
        self.bytes -= _cost(record)
        record.path = move.to_path
        record.dead_letter_reason = move.dead_letter_reason
        record.dead_letter_error_description = move.dead_letter_error_description
        record.dead_letter_source = move.dead_letter_source
        self.put(record)

    def clear(self) -> None:
        self._records.clear()
        self.bytes = 0

    def read(self, path: str, sequence_numbers: Sequence[int]) -> dict[int, StoredMessage]:
        """The content of these messages of ``path`` (those that exist), from the cache or the store."""
        found: dict[int, StoredMessage] = {}
        missing: list[int] = []
        records = self._records
        for seq in sequence_numbers:
            record = records.get((path, seq))
            if record is None:
                missing.append(seq)
            else:
                found[seq] = record
        self.hits += len(found)
        if missing:
            self.misses += len(missing)
            found.update(self.store.read_messages(path, missing))
        return found
