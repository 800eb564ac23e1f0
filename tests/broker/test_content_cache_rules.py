"""The content cache's rules, against a model, on any sequence of sends, reads and completions (hypothesis).

Whatever happens, a read gives the content last sent for each message (from the cache or the store), the cache
holds at most ``max_bytes`` and counts its bytes exactly. When it is full: a send that joins a backlog never takes
the room of its own entity's records nor of an entity being received from, and an idle backlog that gives room
keeps its head (it loses its newest records); a send a receiver waits for is cached whenever it fits at all."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from oncebus.broker.contents import ContentCache, _cost
from oncebus.core.messages import StoredMessage

PATHS = ("a", "b", "c")


class _Store:
    """What the cache reads its misses from: every message sent and not completed."""

    def __init__(self) -> None:
        self.messages: dict[tuple[str, int], StoredMessage] = {}

    def read_messages(self, path: str, sequence_numbers: Sequence[int]) -> dict[int, StoredMessage]:
        return {seq: self.messages[(path, seq)] for seq in sequence_numbers if (path, seq) in self.messages}


def _record(path: str, seq: int, size: int) -> StoredMessage:
    return StoredMessage(path, seq, f"{path}{seq}", bytes([seq % 251]) * size, 0, None)


def _held(cache: ContentCache) -> dict[str, list[int]]:
    return {path: list(held) for path, held in cache._held.items()}


_op = st.one_of(
    st.tuples(
        st.just("send"), st.sampled_from(PATHS), st.lists(st.integers(0, 300), min_size=1, max_size=6), st.booleans()
    ),
    st.tuples(st.just("read"), st.sampled_from(PATHS), st.integers(0, 8)),
    st.tuples(st.just("complete"), st.sampled_from(PATHS), st.integers(0, 8)),
)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 4000), st.lists(_op, max_size=60))
def test_the_cache_against_a_model(max_bytes: int, ops: list[tuple[object, ...]]) -> None:
    store = _Store()
    cache = ContentCache(store, max_bytes)  # type: ignore[arg-type]  # the store's one method the cache reads
    next_seq = dict.fromkeys(PATHS, 1)
    waiting: dict[str, list[int]] = {path: [] for path in PATHS}  # sent, not completed, in order
    for op in ops:
        before = _held(cache)
        reading = set(cache._reading)
        if op[0] == "send":
            _, path, sizes, evict = op
            assert isinstance(path, str) and isinstance(sizes, list) and isinstance(evict, bool)
            records = []
            for size in sizes:
                record = _record(path, next_seq[path], size)
                next_seq[path] += 1
                store.messages[(path, record.sequence_number)] = record
                waiting[path].append(record.sequence_number)
                records.append(record)
            cache.put_many(records, evict=evict)
            after = _held(cache)
            for other, seqs in before.items():
                kept = after.get(other, [])
                if not evict and (other == path or other in reading):
                    assert kept[: len(seqs)] == seqs, "a backlog took the room of its own head or of a reader"
                elif other != path and other not in reading:
                    assert kept == seqs[: len(kept)], "an idle backlog lost its head before its newest records"
            if evict:
                fits = [r.sequence_number for r in records if _cost(r) <= max_bytes]
                if fits:  # (the batch's own later records may take the room of its earlier ones)
                    assert fits[-1] in after.get(path, []), "a send a receiver waits for was not cached"
        elif op[0] == "read":
            _, path, count = op
            assert isinstance(path, str) and isinstance(count, int)
            seqs = waiting[path][:count]
            got = cache.read(path, seqs)
            assert sorted(got) == seqs
            for seq in seqs:
                assert got[seq].body == store.messages[(path, seq)].body
        else:
            _, path, count = op
            assert isinstance(path, str) and isinstance(count, int)
            for seq in waiting[path][:count]:
                del store.messages[(path, seq)]
                cache.discard(path, seq)
            del waiting[path][:count]
        held = cache._held
        assert cache.bytes == sum(_cost(r) for h in held.values() for r in h.values())
        assert cache.bytes <= max(max_bytes, 0)
        for path, h in held.items():
            for seq, record in h.items():
                assert store.messages[(path, seq)] is record, "a cached record is not the message sent"
            assert h or path in cache._reading, "an idle entity without records was kept"
        assert not set(cache._idle) & set(cache._reading) and set(cache._idle) | set(cache._reading) == set(held)
