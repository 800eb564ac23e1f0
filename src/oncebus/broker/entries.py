"""What the broker holds of each message of one receivable: an :class:`Entry`, or four numbers in a column.

Most held messages of a backlog are *plain*: waiting in arrival order, not locked, scheduled, deferred or
expiring, with no session id. Those are held as columns of a :class:`_Run` (sequence number, enqueued time,
size, delivery count: 24 bytes a message, no Python object each), in the order they are delivered. Every other
message, and a plain one as soon as something asks for it by sequence number or takes it, is an :class:`Entry`
object (about 200 bytes with its dict slot and ints). :class:`HeldMessages` is the one map of both, keyed by
sequence number: what reads it cannot tell the two apart, except that an entry it iterates over without asking
for it by number (:meth:`HeldMessages.items`, :meth:`HeldMessages.first_from`) may be a read-only copy.

Pure bookkeeping on the broker's thread; :class:`~oncebus.broker.receivable.Receivable` keeps which entries are
available, locked, scheduled or expiring.
"""

from __future__ import annotations

import heapq
import uuid
from array import array
from bisect import bisect_left
from collections.abc import Iterator

from oncebus.core.messages import MessageState, StoredMessage
from oncebus.store.base import MessageRow

_SIZES: dict[int, int] = {}
_SIZES_KEPT = 65_536
_DEAD = -1  # a column slot's size once its message left the run (taken, asked for, removed)
_COMPACT_AFTER = 4096  # slots consumed at the head of a run before the columns are shifted


def _shared_size(size: int) -> int:
    """One int object per distinct size (up to :data:`_SIZES_KEPT` of them): messages of a backlog mostly share
    a few sizes, and each int held apart costs 32 bytes a message."""
    shared = _SIZES.get(size)
    if shared is not None:
        return shared
    if len(_SIZES) < _SIZES_KEPT:
        _SIZES[size] = size
    return size


class Entry:
    """What the broker holds of one message: its place, state, lock and size (its content is in the store)."""

    __slots__ = (
        "available",
        "delivery_count",
        "enqueued_time_us",  # for a scheduled message: when it is due
        "expires_at_us",
        "lock_token",
        "locked_until_us",
        "sequence_number",
        "session_id",
        "size",
        "state",
    )

    def __init__(
        self,
        sequence_number: int,
        state: MessageState,
        enqueued_time_us: int,
        expires_at_us: int | None,
        size: int,
        session_id: str | None,
        delivery_count: int = 0,
    ) -> None:
        self.sequence_number = sequence_number
        self.state = state
        self.enqueued_time_us = enqueued_time_us
        self.expires_at_us = expires_at_us
        self.size = _shared_size(size)
        self.session_id = session_id
        self.delivery_count = delivery_count
        self.lock_token: uuid.UUID | None = None
        self.locked_until_us: int | None = None
        self.available = False

    @classmethod
    def of(cls, record: StoredMessage) -> Entry:
        return cls(
            record.sequence_number,
            record.state,
            record.enqueued_time_us,
            record.expires_at_us,
            record.size,
            record.session_id,
            record.delivery_count,
        )

    @classmethod
    def of_row(cls, row: MessageRow) -> Entry:
        _, seq, state, count, enqueued, expires, size, session_id = row
        return cls(seq, MessageState(state), enqueued, expires, size, session_id, count)


class _Run:
    """Plain waiting messages as columns, in delivery order: enqueued times never decrease and sequence numbers
    increase along the run (so a sequence number is found by bisection). Slots leave at the head (taken) or
    anywhere (asked for by number, removed): a slot that left in the middle keeps its sequence number, with
    ``_DEAD`` as its size, until the head passes it."""

    __slots__ = ("counts", "enqueued", "head", "live", "seqs", "sizes")

    def __init__(self) -> None:
        self.seqs = array("q")
        self.enqueued = array("q")
        self.sizes = array("i")  # at most 100 MB a message (Premium), and _DEAD
        self.counts = array("i")
        self.head = 0  # slots before it are gone
        self.live = 0

    def accepts(self, seq: int, enqueued_us: int) -> bool:
        """Whether a message can go at the end (delivery order and sequence order both kept)."""
        if self.head == len(self.seqs):
            return True
        return enqueued_us >= self.enqueued[-1] and seq > self.seqs[-1]

    def append(self, seq: int, enqueued_us: int, size: int, delivery_count: int) -> None:
        self.seqs.append(seq)
        self.enqueued.append(enqueued_us)
        self.sizes.append(size)
        self.counts.append(delivery_count)
        self.live += 1

    def first(self) -> int:
        """The index of the first live slot, or -1."""
        sizes, head, end = self.sizes, self.head, len(self.seqs)
        while head < end and sizes[head] == _DEAD:
            head += 1
        self.head = head
        if head == end:
            if end:
                self._clear()
            return -1
        return head

    def find(self, seq: int) -> int:
        """The index of the live slot of ``seq``, or -1."""
        seqs = self.seqs
        end = len(seqs)
        if self.head == end or seq > seqs[-1] or seq < seqs[self.head]:
            return -1
        i = bisect_left(seqs, seq, self.head, end)
        return i if i < end and seqs[i] == seq and self.sizes[i] != _DEAD else -1

    def drop(self, i: int) -> None:
        """The message of slot ``i`` left the run."""
        self.sizes[i] = _DEAD
        self.live -= 1
        if i == self.head:
            self.head += 1
            if self.live == 0:
                self._clear()
            elif self.head >= _COMPACT_AFTER and self.head * 2 >= len(self.seqs):
                self._compact()

    def _compact(self) -> None:
        head = self.head
        for column in (self.seqs, self.enqueued, self.sizes, self.counts):
            del column[:head]
        self.head = 0

    def _clear(self) -> None:
        for column in (self.seqs, self.enqueued, self.sizes, self.counts):
            del column[:]
        self.head = 0
        self.live = 0

    def slots(self, start: int = 0) -> Iterator[int]:
        """The live slots from index ``start`` (at least the head) on."""
        sizes = self.sizes
        for i in range(max(start, self.head), len(sizes)):
            if sizes[i] != _DEAD:
                yield i

    def from_seq(self, seq: int) -> int:
        """The first index whose sequence number is at least ``seq``."""
        return bisect_left(self.seqs, seq, self.head, len(self.seqs))


class HeldMessages:
    """Every message a receivable holds, by sequence number: :class:`Entry` objects, and plain waiting messages
    in columns (see the module's docstring) until they are taken or asked for by number.

    ``state`` is the state of this receivable's plain messages (active; dead-lettered in a dead-letter queue).
    While a stored backlog is restored in steps (``begin_restore``), its plain messages gather in a run of their
    own, ``older``, delivered before ``run``; ``end_restore`` joins them."""

    __slots__ = ("entries", "in_run", "older", "run", "state")

    def __init__(self, state: MessageState) -> None:
        self.state = state
        self.entries: dict[int, Entry] = {}
        self.in_run: set[int] = set()  # sequence numbers of entries whose slot is still live in a run
        self.run = _Run()
        self.older: _Run | None = None

    # --- the map ----------------------------------------------------------------------------------
    def __len__(self) -> int:
        older = self.older.live if self.older is not None else 0
        return len(self.entries) + self.run.live + older - len(self.in_run)

    def __bool__(self) -> bool:
        return len(self) > 0

    def _runs(self) -> tuple[_Run, ...]:
        return (self.run,) if self.older is None else (self.older, self.run)

    def _slot(self, seq: int) -> tuple[_Run, int] | None:
        for run in self._runs():
            i = run.find(seq)
            if i >= 0:
                return run, i
        return None

    def __contains__(self, seq: int) -> bool:
        return seq in self.entries or self._slot(seq) is not None

    def get(self, seq: int) -> Entry | None:
        """The entry of ``seq``, made an object if it was a slot (it stays where it waits, available)."""
        entry = self.entries.get(seq)
        if entry is not None:
            return entry
        found = self._slot(seq)
        if found is None:
            return None
        entry = self._entry(*found)
        entry.available = True
        self.entries[seq] = entry
        self.in_run.add(seq)
        return entry

    def __getitem__(self, seq: int) -> Entry:
        entry = self.get(seq)
        if entry is None:
            raise KeyError(seq)
        return entry

    def __setitem__(self, seq: int, entry: Entry) -> None:
        """Hold ``entry`` as an object (a sequence number not held already: pop it first)."""
        self.entries[seq] = entry

    def holds(self, entry: Entry) -> bool:
        """Whether ``entry`` is the object held for its sequence number (not a copy, not a message gone)."""
        return self.entries.get(entry.sequence_number) is entry

    def pop(self, seq: int) -> Entry | None:
        """Remove the message ``seq``; its entry (a copy if it was a slot), or None."""
        entry = self.entries.pop(seq, None)
        if entry is not None and seq not in self.in_run:
            return entry
        self.in_run.discard(seq)
        found = self._slot(seq)
        if found is None:
            return entry
        run, i = found
        if entry is None:
            entry = self._entry(run, i)
        run.drop(i)
        return entry

    def _entry(self, run: _Run, i: int) -> Entry:
        return Entry(run.seqs[i], self.state, run.enqueued[i], None, run.sizes[i], None, run.counts[i])

    # --- the runs ---------------------------------------------------------------------------------
    def append(self, seq: int, enqueued_us: int, size: int, delivery_count: int, *, stored: bool = False) -> bool:
        """Hold a plain waiting message as a slot at the end of its run; False when its order does not allow it
        (the caller holds an :class:`Entry` instead). ``seq`` must not be held already."""
        run = self.older if stored and self.older is not None else self.run  # a stored row while restoring
        if not run.accepts(seq, enqueued_us):
            return False
        run.append(seq, enqueued_us, size, delivery_count)
        return True

    def head(self) -> tuple[int, int] | None:
        """(enqueued time, sequence number) of the first plain waiting message, or None."""
        for run in self._runs():
            i = run.first()
            if i >= 0:
                return run.enqueued[i], run.seqs[i]
        return None

    def take_head(self) -> Entry | None:
        """The first plain waiting message, out of its run: its entry, held as an object, not available."""
        for run in self._runs():
            i = run.first()
            if i < 0:
                continue
            seq = run.seqs[i]
            entry = self.entries.get(seq)
            if entry is None:
                entry = self._entry(run, i)
                self.entries[seq] = entry
            else:
                self.in_run.discard(seq)
            run.drop(i)
            entry.available = False
            return entry
        return None

    def begin_restore(self) -> None:
        self.older = _Run()

    def end_restore(self) -> list[Entry]:
        """Join the restored run before the newer one; the newer run's entries that cannot follow it in order
        (a clock that went back) are returned as objects, available, for the caller to queue."""
        older, self.older = self.older, None
        if older is None or older.live == 0:
            return []
        newer, self.run = self.run, older
        moved: list[Entry] = []
        for i in newer.slots():
            seq = newer.seqs[i]
            if seq not in self.entries and self.run.accepts(seq, newer.enqueued[i]):
                self.run.append(seq, newer.enqueued[i], newer.sizes[i], newer.counts[i])
            elif seq in self.entries:  # asked for while waiting: stays an object, queued by the caller
                self.in_run.discard(seq)
                moved.append(self.entries[seq])
            else:
                entry = self._entry(newer, i)
                entry.available = True
                self.entries[seq] = entry
                moved.append(entry)
        return moved

    # --- reading many -----------------------------------------------------------------------------
    def _run_items(self, run: _Run, start: int = 0) -> Iterator[tuple[int, Entry]]:
        entries = self.entries
        for i in run.slots(start):
            seq = run.seqs[i]
            entry = entries.get(seq)
            if entry is None:
                entry = self._entry(run, i)
                entry.available = True
            yield seq, entry

    def objects(self) -> Iterator[tuple[int, Entry]]:
        """The messages held as objects (every one that is not plain and waiting, and some that are)."""
        return iter(list(self.entries.items()))

    def items(self) -> Iterator[tuple[int, Entry]]:
        """Every message, in sequence order as far as the objects were added in it (the order they arrived).

        An entry of a plain waiting message not asked for by number is a read-only copy: ask for
        ``messages[seq]`` to change it."""
        in_run = self.in_run
        objects = [(seq, e) for seq, e in self.entries.items() if seq not in in_run]
        return heapq.merge(*(self._run_items(run) for run in self._runs()), objects, key=lambda item: item[0])

    def values(self) -> Iterator[Entry]:
        """The entries of :meth:`items` (the same read-only copies)."""
        return (entry for _, entry in self.items())

    def keys(self) -> Iterator[int]:
        return (seq for seq, _ in self.items())

    def __iter__(self) -> Iterator[int]:
        return self.keys()

    def first_from(self, seq: int, count: int, session_id: str | None) -> list[Entry]:
        """The ``count`` messages with the smallest sequence numbers from ``seq`` on (of ``session_id`` if one is
        given), in sequence order; plain waiting ones as read-only copies."""
        if count <= 0:
            return []
        in_run = self.in_run
        chosen = heapq.nsmallest(
            count,
            (
                (s, e)
                for s, e in self.entries.items()
                if s >= seq and s not in in_run and (session_id is None or e.session_id == session_id)
            ),
            key=lambda item: item[0],
        )
        if session_id is None:
            for run in self._runs():
                taken = 0
                for item in self._run_items(run, run.from_seq(seq)):
                    chosen.append(item)
                    taken += 1
                    if taken == count:
                        break
        chosen.sort(key=lambda item: item[0])
        return [entry for _, entry in chosen[:count]]
