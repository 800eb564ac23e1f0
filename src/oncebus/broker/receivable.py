"""The messages of one queue, subscription or dead-letter sub-queue, and their locks.

Pure bookkeeping on the broker's thread: which messages are available (in
(enqueued time, sequence number) order, per session where sessions are
required), scheduled, locked, deferred; which expire when. Per message only an
:class:`Entry` is held, or for a plain waiting message four numbers in columns
(``broker/entries.py``): its content (body, wire encoding, properties) stays in
the store and is read when it is delivered.
Persistence is the namespace's job: methods return the store operations their
changes need.
"""

from __future__ import annotations

import heapq
import itertools
import os
import uuid
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar

from oncebus.broker.counters import ReceivableCounters
from oncebus.broker.entries import Entry, HeldMessages
from oncebus.broker.signals import ChangeSignal
from oncebus.core.messages import MessageState, StoredMessage
from oncebus.core.timeutil import MAX_US, clamp_us
from oncebus.store.base import DeleteMessage, MessageRow, MoveMessage, Op

__all__ = ["TOKENS", "Entry", "LockTokens", "Receivable", "ReceivableSettings", "SessionLock"]

LOST_TOKENS_KEPT = 10_000
_ACTIVE = MessageState.ACTIVE
_SCHEDULED = MessageState.SCHEDULED
_DEAD_LETTERED = MessageState.DEAD_LETTERED
_TIE = itertools.count()  # heap entries with equal keys (a sequence number added again) never compare entries


class LockTokens:
    """Lock tokens: random (version 4) UUIDs exactly as ``uuid.uuid4`` makes them, 122 bits from ``os.urandom``,
    drawn from the OS 4 KiB at a time rather than with a system call each (a token a message delivered).

    As unguessable as ``uuid4``'s (the same source, the same bits); unique as they are (by chance: 2**-61 for
    two among a billion). The pool is dropped in a forked child, which must not hand out its parent's tokens."""

    POOL_BYTES: ClassVar[int] = 4096

    __slots__ = ("_at", "_pool")

    def __init__(self) -> None:
        self._pool = b""
        self._at = 0

    def drop(self) -> None:
        self._pool = b""
        self._at = 0

    def next(self) -> uuid.UUID:
        at = self._at
        if at + 16 > len(self._pool):
            self._pool = os.urandom(self.POOL_BYTES)
            at = 0
        self._at = at + 16
        value = (int.from_bytes(self._pool[at : at + 16]) & _V4_CLEAR) | _V4_SET  # as UUID(..., version=4)
        token = object.__new__(uuid.UUID)  # what UUID(int=value) makes, without its checks of arguments
        _set(token, "int", value)
        _set(token, "is_safe", _UNKNOWN)
        return token


_V4_CLEAR = ~((0xC000 << 48) | (0xF000 << 64))  # the variant's and the version's bits
_V4_SET = (0x8000 << 48) | (4 << 76)  # RFC 4122 variant, version 4
_UNKNOWN = uuid.SafeUUID.unknown  # (read once: an enum member read from its class is a Python call)
_set = object.__setattr__  # a UUID refuses attribute assignment; its slots are set as its __init__ sets them
TOKENS = LockTokens()
"""The broker's lock tokens (messages' and sessions'), on its loop."""
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=TOKENS.drop)


class _Ready:
    """Available messages in (enqueued time, sequence number) order.

    Messages mostly become available in that order (sends commit in sequence order): those go
    to the end of a deque, 8 bytes each. The others (abandoned, due after being scheduled, late
    commits) go to a heap. Entries no longer available are skipped when they reach the front.
    """

    __slots__ = ("heap", "run")

    def __init__(self) -> None:
        self.run: deque[Entry] = deque()
        self.heap: list[tuple[int, int, int, Entry]] = []  # (enqueued, sequence number, tie-break, entry)

    def push(self, entry: Entry) -> None:
        run = self.run
        if run:
            last = run[-1]
            if (last.enqueued_time_us, last.sequence_number) > (entry.enqueued_time_us, entry.sequence_number):
                heapq.heappush(self.heap, (entry.enqueued_time_us, entry.sequence_number, next(_TIE), entry))
                return
        run.append(entry)

    def peek(self) -> Entry | None:
        run, heap = self.run, self.heap
        while run and not run[0].available:
            run.popleft()
        while heap and not heap[0][3].available:
            heapq.heappop(heap)
        if not heap:
            return run[0] if run else None
        if not run:
            return heap[0][3]
        first = run[0]
        return first if (first.enqueued_time_us, first.sequence_number) < heap[0][:2] else heap[0][3]

    def pop(self) -> Entry | None:
        entry = self.peek()
        if entry is None:
            return None
        if self.run and self.run[0] is entry:
            self.run.popleft()
        else:
            heapq.heappop(self.heap)
        return entry

    def __bool__(self) -> bool:
        return self.peek() is not None


@dataclass
class SessionLock:
    """An exclusive lock on one session of a session-enabled queue or subscription."""

    path: str
    session_id: str
    lock_token: uuid.UUID
    locked_until_us: int
    locked_messages: set[uuid.UUID] = field(default_factory=set)


@dataclass
class ReceivableSettings:
    lock_duration_us: int
    max_delivery_count: int
    dead_lettering_on_message_expiration: bool
    requires_session: bool
    max_size_bytes: int

    def update(self, new: ReceivableSettings) -> None:
        """Take ``new``'s values in place (the receivable and its readers keep this object)."""
        self.lock_duration_us = new.lock_duration_us
        self.max_delivery_count = new.max_delivery_count
        self.dead_lettering_on_message_expiration = new.dead_lettering_on_message_expiration
        self.requires_session = new.requires_session
        self.max_size_bytes = new.max_size_bytes


QUOTA_BYTES_PER_MESSAGE = 256
"""What each held message counts toward its entity's max_size_in_megabytes on top of its encoded size: a message,
even an empty one, costs the server memory and a store row, so the quota must bound how many it holds."""

QUOTA_BYTES_PER_SESSION_STATE = 256
"""The same for each session state, on top of its size: Service Bus counts session states toward the entity's
size, and a state, even an empty one, is a store row too."""


def session_state_quota(state: bytes | None) -> int:
    """What a session's state counts toward its entity's max_size_in_megabytes (None: no state, nothing)."""
    return 0 if state is None else len(state) + QUOTA_BYTES_PER_SESSION_STATE


class Receivable:
    def __init__(
        self,
        path: str,
        settings: ReceivableSettings,
        *,
        dead_letter: bool = False,
        counters: ReceivableCounters | None = None,
    ) -> None:
        self.path = path
        self.settings = settings
        self.is_dead_letter = dead_letter
        self.messages = HeldMessages(_DEAD_LETTERED if dead_letter else _ACTIVE)
        self.size_bytes = 0
        self._available = _Ready()
        self._session_available: dict[str, _Ready] = {}
        self._scheduled: list[tuple[int, int]] = []
        self._expiry: list[tuple[int, int]] = []
        # (locked until, the lock token's int): ints, so that locks taken together (the same time) compare in C
        self._lock_expiry: list[tuple[int, int]] = []
        # lock token (its 128-bit int: hashed in C, a uuid.UUID's __hash__ is a Python call) -> sequence number
        self.locks: dict[int, int] = {}
        self.lost_tokens: OrderedDict[uuid.UUID, str] = OrderedDict()
        self.sessions: dict[str, SessionLock] = {}
        self.changes = ChangeSignal()  # its waiting receivers: notified when a message becomes available
        self.session_states: dict[str, bytes] = {}
        self.session_state_bytes = 0  # the states' sizes together (set them with ``set_session_state``)
        # when each session's state was last set (broker time, us; a state restored at start: the start's time)
        self.session_state_times: dict[str, int] = {}
        self.counters = counters if counters is not None else ReceivableCounters()  # shared with the dead-letter queue
        self._state_counts = [0] * len(MessageState)  # messages by state, kept as they change (counts() is O(1))
        self.dead_letter_queue: Receivable | None = (
            None
            if dead_letter
            else Receivable(path + "/$deadletterqueue", settings, dead_letter=True, counters=self.counters)
        )

    @property
    def quota_bytes(self) -> int:
        """What the held messages and session states count toward the entity's size quota: their sizes plus an
        overhead for each."""
        return (
            self.size_bytes
            + len(self.messages) * QUOTA_BYTES_PER_MESSAGE
            + self.session_state_bytes
            + len(self.session_states) * QUOTA_BYTES_PER_SESSION_STATE
        )

    @property
    def held_bytes(self) -> int:
        """Its messages' sizes and its session states' (the runtime properties' ``size_in_bytes``, with the
        dead-letter queue's ``size_bytes``)."""
        return self.size_bytes + self.session_state_bytes

    # --- session states ---------------------------------------------------------------------
    def set_session_state(self, session_id: str, state: bytes | None, now_us: int) -> None:
        """Set (None: clear) a session's state, set at ``now_us``."""
        old = self.session_states.pop(session_id, None)
        if old is not None:
            self.session_state_bytes -= len(old)
        if state is None:
            self.session_state_times.pop(session_id, None)
        else:
            self.session_states[session_id] = state
            self.session_state_bytes += len(state)
            self.session_state_times[session_id] = now_us

    def session_state_growth(self, session_id: str, state: bytes | None) -> int:
        """How much ``quota_bytes`` would grow if the session's state were set to ``state`` (negative: shrink)."""
        return session_state_quota(state) - session_state_quota(self.session_states.get(session_id))

    # --- adding -----------------------------------------------------------------------------
    def add(self, entry: Entry, now_us: int) -> None:
        if entry.sequence_number in self.messages:
            self._forget(entry.sequence_number)
        self.messages[entry.sequence_number] = entry
        self._state_counts[entry.state] += 1
        self.size_bytes += entry.size
        if entry.state == _SCHEDULED:
            heapq.heappush(self._scheduled, (entry.enqueued_time_us, entry.sequence_number))
            if entry.enqueued_time_us <= now_us:
                self.advance(now_us)
        elif entry.state == _ACTIVE or (self.is_dead_letter and entry.state == _DEAD_LETTERED):
            self._make_available(entry)

    def add_records(self, records: Iterable[StoredMessage], now_us: int) -> None:
        """``add`` for the messages of a committed send; the usual one (available, no expiry or session id, in
        order) is held as a slot of the columns (``HeldMessages.append``)."""
        messages = self.messages
        in_order = not self.settings.requires_session and not self.is_dead_letter  # slots are active messages
        added = 0
        total = 0
        for r in records:
            seq = r.sequence_number
            if (
                r.state is _ACTIVE
                and r.expires_at_us is None
                and r.session_id is None
                and in_order
                and seq not in messages
            ):
                size = r.size  # (a property of the Python record: read once)
                if messages.append(seq, r.enqueued_time_us, size, r.delivery_count):
                    added += 1
                    total += size
                    continue
            self.add(Entry.of(r), now_us)
        self._state_counts[_ACTIVE] += added
        self.size_bytes += total
        if added:
            self.changes.notify()

    def begin_restore(self) -> None:
        """Restore the stored backlog in several ``restore`` calls while new messages arrive (start-up in the
        background): the backlog's usual messages gather in columns of their own, joined before the messages
        added meanwhile (all newer) by ``end_restore``."""
        self.messages.begin_restore()

    def end_restore(self) -> None:
        for entry in self.messages.end_restore():
            self._available.push(entry)

    def restore(self, rows: Iterable[MessageRow], now_us: int) -> None:
        """An entry for each stored message of this receivable (start-up), rows in sequence order; the usual
        row (available, no expiry or session id, in order) is held as a slot of the columns."""
        messages = self.messages
        counts = self._state_counts
        in_order = not (self.settings.requires_session and not self.is_dead_letter)
        usual = int(_DEAD_LETTERED if self.is_dead_letter else _ACTIVE)
        appended = 0
        total = 0
        for _, seq, state, count, enqueued, expires, size, session_id in rows:
            if expires is not None and expires > MAX_US:
                expires = None  # stored by a release that did not cap expiries: never
            if (
                state == usual
                and expires is None
                and session_id is None
                and in_order
                and messages.append(seq, enqueued, size, count, stored=True)
            ):  # (path, sequence number) is the store's key: never one held already
                appended += 1
                total += size
            else:
                self.add(Entry(seq, MessageState(state), enqueued, expires, size, session_id, count), now_us)
        counts[usual] += appended
        self.size_bytes += total

    def _make_available(self, entry: Entry) -> None:
        if entry.available:
            return
        entry.available = True
        if self.settings.requires_session and not self.is_dead_letter:
            ready = self._session_available.get(entry.session_id or "")
            if ready is None:
                ready = self._session_available[entry.session_id or ""] = _Ready()
            ready.push(entry)
        else:
            self._available.push(entry)
        if entry.expires_at_us is not None and not self.is_dead_letter:
            heapq.heappush(self._expiry, (entry.expires_at_us, entry.sequence_number))
        self.changes.notify()

    def _forget(self, seq: int) -> Entry | None:
        entry = self.messages.pop(seq)
        if entry is not None:
            entry.available = False
            self._state_counts[entry.state] -= 1
            self.size_bytes -= entry.size
            if entry.lock_token is not None:
                self.locks.pop(entry.lock_token.int, None)
        return entry

    # --- time ---------------------------------------------------------------------------------
    def advance(self, now_us: int) -> list[Op]:
        """Apply everything due by ``now_us``: scheduled enqueues, lock expiry, message expiry."""
        ops: list[Op] = []
        while self._scheduled and self._scheduled[0][0] <= now_us:
            due, seq = heapq.heappop(self._scheduled)
            entry = self.messages.get(seq)
            if entry is None or entry.state != _SCHEDULED or entry.enqueued_time_us != due:
                continue
            self.set_state(entry, _ACTIVE)  # enqueued at its due time; its expiry was counted from it
            self._make_available(entry)
        if self.sessions:
            for session_id, lock in list(self.sessions.items()):
                if lock.locked_until_us <= now_us:
                    ops += self.release_session(session_id, now_us, reason="session")
        while self._lock_expiry and self._lock_expiry[0][0] <= now_us:
            _, token_int = heapq.heappop(self._lock_expiry)
            locked_seq = self.locks.get(token_int)
            if locked_seq is None:
                continue
            entry = self.messages[locked_seq]
            if entry.locked_until_us is not None and entry.locked_until_us <= now_us:
                ops += self.unlock(entry, now_us, lost="message")
        while self._expiry and self._expiry[0][0] <= now_us:
            _, seq = heapq.heappop(self._expiry)
            entry = self.messages.get(seq)
            if (
                entry is None
                or entry.state != _ACTIVE
                or entry.lock_token is not None
                or entry.expires_at_us is None
                or entry.expires_at_us > now_us
            ):
                continue
            ops += self._expire(entry)
        return ops

    def _expire(self, entry: Entry) -> list[Op]:
        self.counters.expired += 1
        if self.settings.dead_lettering_on_message_expiration:
            return self.move_to_dead_letter(entry, "TTLExpiredException", "The message expired and was dead lettered.")
        self._forget(entry.sequence_number)
        return [DeleteMessage(self.path, entry.sequence_number)]

    # --- receiving ------------------------------------------------------------------------------
    def take(self, session_id: str | None = None) -> Entry | None:
        if self.settings.requires_session and not self.is_dead_letter:
            ready = self._session_available.get(session_id or "")
            if ready is None:
                return None
        else:
            ready = self._available
            head = self.messages.head()
            if head is not None:
                first = ready.peek()
                if first is None or head < (first.enqueued_time_us, first.sequence_number):
                    return self.messages.take_head()
        entry = ready.pop()
        if entry is not None:
            entry.available = False
        return entry

    def give_back(self, entry: Entry) -> None:
        """Make a message :meth:`take` returned available again, untouched (nothing to write)."""
        self._make_available(entry)

    def locked(self, token: uuid.UUID) -> int | None:
        """The sequence number of the message ``token`` locks, or None (not locked here, or no longer)."""
        return self.locks.get(token.int)

    def lock(self, entry: Entry, now_us: int, session: SessionLock | None) -> None:
        token = TOKENS.next()
        entry.lock_token = token
        entry.locked_until_us = (
            session.locked_until_us if session is not None else clamp_us(now_us + self.settings.lock_duration_us)
        )
        self.locks[token.int] = entry.sequence_number
        if session is not None:
            session.locked_messages.add(token)
        else:
            self.push_lock_expiry(entry)

    def push_lock_expiry(self, entry: Entry) -> None:
        assert entry.lock_token is not None and entry.locked_until_us is not None
        heapq.heappush(self._lock_expiry, (entry.locked_until_us, entry.lock_token.int))

    def unlock(self, entry: Entry, now_us: int, *, lost: str | None = None) -> list[Op]:
        """Release a lock (abandon, deferral, lock expiry, session closed); dead-letter past max_delivery_count.

        A deferred message stays deferred, unless this delivery was its last: Service Bus counts a deferral as a
        delivery attempt (with MaxDeliveryCount 1, a deferral dead-letters: Azure/azure-service-bus#375)."""
        token = entry.lock_token
        if token is not None:
            self.locks.pop(token.int, None)
            if lost is not None:
                self._remember_lost(token, lost)
        entry.lock_token = None
        entry.locked_until_us = None
        if not self.is_dead_letter and entry.delivery_count >= self.settings.max_delivery_count:
            return self.move_to_dead_letter(
                entry,
                "MaxDeliveryCountExceeded",
                f"Message could not be consumed after {self.settings.max_delivery_count} delivery attempts.",
            )
        if entry.state == MessageState.DEFERRED:
            return []  # (an expired deferred message is dead-lettered or deleted when it is next received)
        if entry.expires_at_us is not None and entry.expires_at_us <= now_us and not self.is_dead_letter:
            return self._expire(entry)
        self._make_available(entry)
        return []

    def _remember_lost(self, token: uuid.UUID, why: str) -> None:
        self.lost_tokens[token] = why
        while len(self.lost_tokens) > LOST_TOKENS_KEPT:
            self.lost_tokens.popitem(last=False)

    def session_lock_lost(self, entry: Entry, token: uuid.UUID) -> bool:
        """Whether ``entry``, locked by ``token``, was delivered under a session lock this session no longer holds
        (released, expired, or accepted again since): settling it must fail with the session's lock lost."""
        if not self.settings.requires_session or entry.session_id is None:
            return False
        session = self.sessions.get(entry.session_id)
        return session is not None and token not in session.locked_messages

    def drop_session_token(self, entry: Entry) -> None:
        """``entry`` is settled: its lock token leaves its session's locked messages (if it has a session)."""
        if entry.session_id is not None and entry.lock_token is not None:
            session = self.sessions.get(entry.session_id)
            if session is not None:
                session.locked_messages.discard(entry.lock_token)

    def complete(self, token: uuid.UUID) -> tuple[Entry, list[Op]] | None:
        """Complete the message ``token`` locks: gone from here (and from its session's locked messages), counted;
        its entry and what to store. None, with nothing changed, when ``token`` locks nothing here or its session
        lock is lost (the caller says which: ``Namespace._not_locked``). The broker's completion path, in one
        compiled call (docs/performance-log.md)."""
        seq = self.locks.get(token.int)
        if seq is None:
            return None
        entry = self.messages[seq]
        if self.session_lock_lost(entry, token):
            return None
        self.drop_session_token(entry)
        self.counters.completed += 1
        return entry, self.remove(entry)

    def remove(self, entry: Entry) -> list[Op]:
        """Complete / receive-and-delete / cancel: the message is gone."""
        self._forget(entry.sequence_number)
        return [DeleteMessage(self.path, entry.sequence_number)]

    def move_to_dead_letter(self, entry: Entry, reason: str | None, description: str | None) -> list[Op]:
        assert self.dead_letter_queue is not None
        self.counters.dead_lettered += 1
        self._forget(entry.sequence_number)
        dead = Entry(
            entry.sequence_number,
            _DEAD_LETTERED,
            entry.enqueued_time_us,
            entry.expires_at_us,
            entry.size,
            entry.session_id,
            entry.delivery_count,
        )
        self.dead_letter_queue.add(dead, 0)
        move = MoveMessage(
            self.path, entry.sequence_number, self.dead_letter_queue.path, int(_DEAD_LETTERED), reason, description
        )
        return [move]

    # --- sessions -------------------------------------------------------------------------------
    def next_available_session(self) -> str | None:
        best: tuple[tuple[int, int], str] | None = None
        for session_id, ready in self._session_available.items():
            if session_id in self.sessions:
                continue
            head = ready.peek()
            if head is None:
                continue
            key = (head.enqueued_time_us, head.sequence_number)
            if best is None or key < best[0]:
                best = (key, session_id)
        return None if best is None else best[1]

    def available_session_ids(self) -> list[str]:
        """Sessions that may have available messages (their heaps are not empty)."""
        return [session_id for session_id, heap in self._session_available.items() if heap]

    def release_session(self, session_id: str, now_us: int, *, reason: str | None) -> list[Op]:
        lock = self.sessions.pop(session_id, None)
        if lock is None:
            return []
        self.changes.notify()  # the session can be accepted again
        ops: list[Op] = []
        for token in lock.locked_messages:
            seq = self.locks.get(token.int)
            if seq is not None:
                ops += self.unlock(self.messages[seq], now_us, lost=reason)
            elif reason is not None:
                self._remember_lost(token, reason)
        return ops

    def session_ids(self) -> list[str]:
        ids = {m.session_id for _, m in self.messages.objects() if m.session_id is not None}  # slots have none
        return sorted(ids | set(self.session_states))

    # --- counts ---------------------------------------------------------------------------------
    def set_state(self, entry: Entry, state: MessageState) -> None:
        """Change the state of a message held here (keeps ``counts`` right)."""
        if self.messages.holds(entry):
            self._state_counts[entry.state] -= 1
            self._state_counts[state] += 1
        entry.state = state

    def counts(self) -> dict[str, int]:
        """Messages by state, in O(1): active (locked ones included), scheduled, deferred, dead-lettered."""
        counts = self._state_counts
        return {
            "active": counts[MessageState.ACTIVE],
            "scheduled": counts[MessageState.SCHEDULED],
            "deferred": counts[MessageState.DEFERRED],
            "dead_lettered": len(self.dead_letter_queue.messages) if self.dead_letter_queue else 0,
        }
