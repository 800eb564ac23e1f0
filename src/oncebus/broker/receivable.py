"""The messages of one queue, subscription or dead-letter sub-queue, and their locks.

Pure bookkeeping on the broker's thread: which messages are available (in
sequence order, per session where sessions are required), scheduled, locked,
deferred; which expire when. Persistence is the namespace's job: methods
return the store operations their changes need.
"""

from __future__ import annotations

import heapq
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

from oncebus.broker.counters import ReceivableCounters
from oncebus.core.messages import MessageState, StoredMessage
from oncebus.core.timeutil import add_us, clamp_us
from oncebus.store.base import DeleteMessage, Op, PutMessage

LOST_TOKENS_KEPT = 10_000


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
        self.messages: dict[int, StoredMessage] = {}
        self.size_bytes = 0
        self._available: list[tuple[int, int]] = []  # heap of (enqueued time, sequence number)
        self._available_set: set[int] = set()
        self._session_available: dict[str, list[tuple[int, int]]] = {}
        self._scheduled: list[tuple[int, int]] = []
        self._expiry: list[tuple[int, int]] = []
        self._lock_expiry: list[tuple[int, uuid.UUID]] = []
        self.locks: dict[uuid.UUID, int] = {}
        self.lost_tokens: OrderedDict[uuid.UUID, str] = OrderedDict()
        self.sessions: dict[str, SessionLock] = {}
        self.session_states: dict[str, bytes] = {}
        self.counters = counters if counters is not None else ReceivableCounters()  # shared with the dead-letter queue
        self._state_counts = [0] * len(MessageState)  # messages by state, kept as they change (counts() is O(1))
        self.dead_letter_queue: Receivable | None = (
            None
            if dead_letter
            else Receivable(path + "/$deadletterqueue", settings, dead_letter=True, counters=self.counters)
        )

    # --- adding -----------------------------------------------------------------------------
    def add(self, message: StoredMessage, now_us: int) -> None:
        replaced = self.messages.get(message.sequence_number)
        if replaced is not None:
            self._state_counts[replaced.state] -= 1
        self.messages[message.sequence_number] = message
        self._state_counts[message.state] += 1
        message.counted_size = message.size  # taken back as counted, whatever changes later
        self.size_bytes += message.counted_size
        if message.state == MessageState.SCHEDULED:
            assert message.scheduled_enqueue_time_us is not None
            heapq.heappush(self._scheduled, (message.scheduled_enqueue_time_us, message.sequence_number))
            if message.scheduled_enqueue_time_us <= now_us:
                self.advance(now_us)
        elif message.state == MessageState.ACTIVE or (
            self.is_dead_letter and message.state == MessageState.DEAD_LETTERED
        ):
            self._make_available(message)

    def _make_available(self, message: StoredMessage) -> None:
        seq = message.sequence_number
        if self.settings.requires_session and not self.is_dead_letter:
            heapq.heappush(
                self._session_available.setdefault(message.session_id or "", []), (message.enqueued_time_us, seq)
            )
        else:
            heapq.heappush(self._available, (message.enqueued_time_us, seq))
        self._available_set.add(seq)
        if message.expires_at_us is not None and not self.is_dead_letter:
            heapq.heappush(self._expiry, (message.expires_at_us, seq))

    def _forget(self, seq: int) -> StoredMessage | None:
        message = self.messages.pop(seq, None)
        self._available_set.discard(seq)
        if message is not None:
            self._state_counts[message.state] -= 1
            self.size_bytes -= message.counted_size
            if message.lock_token is not None:
                self.locks.pop(message.lock_token, None)
        return message

    # --- time ---------------------------------------------------------------------------------
    def advance(self, now_us: int) -> list[Op]:
        """Apply everything due by ``now_us``: scheduled enqueues, lock expiry, message expiry."""
        ops: list[Op] = []
        while self._scheduled and self._scheduled[0][0] <= now_us:
            due, seq = heapq.heappop(self._scheduled)
            message = self.messages.get(seq)
            if message is None or message.state != MessageState.SCHEDULED or message.scheduled_enqueue_time_us != due:
                continue
            self.set_state(message, MessageState.ACTIVE)
            message.enqueued_time_us = due
            if message.time_to_live_us is not None:
                message.expires_at_us = add_us(due, message.time_to_live_us)  # None (never) past year 9999
            self._make_available(message)
        for session_id, lock in list(self.sessions.items()):
            if lock.locked_until_us <= now_us:
                ops += self.release_session(session_id, now_us, reason="session")
        while self._lock_expiry and self._lock_expiry[0][0] <= now_us:
            _, token = heapq.heappop(self._lock_expiry)
            seq = self.locks.get(token)
            if seq is None:
                continue
            message = self.messages[seq]
            if message.locked_until_us is not None and message.locked_until_us <= now_us:
                ops += self.unlock(message, now_us, lost="message")
        while self._expiry and self._expiry[0][0] <= now_us:
            _, seq = heapq.heappop(self._expiry)
            message = self.messages.get(seq)
            if (
                message is None
                or message.state != MessageState.ACTIVE
                or message.lock_token is not None
                or message.expires_at_us is None
                or message.expires_at_us > now_us
            ):
                continue
            ops += self._expire(message)
        return ops

    def _expire(self, message: StoredMessage) -> list[Op]:
        self.counters.expired += 1
        if self.settings.dead_lettering_on_message_expiration:
            return self.move_to_dead_letter(
                message, "TTLExpiredException", "The message expired and was dead lettered."
            )
        self._forget(message.sequence_number)
        return [DeleteMessage(self.path, message.sequence_number)]

    # --- receiving ------------------------------------------------------------------------------
    def _heap(self, session_id: str | None) -> list[tuple[int, int]]:
        if self.settings.requires_session and not self.is_dead_letter:
            return self._session_available.get(session_id or "", [])
        return self._available

    def take(self, session_id: str | None = None) -> StoredMessage | None:
        heap = self._heap(session_id)
        while heap:
            _, seq = heapq.heappop(heap)
            if seq in self._available_set:
                self._available_set.discard(seq)
                return self.messages[seq]
        return None

    def lock(self, message: StoredMessage, now_us: int, session: SessionLock | None) -> None:
        token = uuid.uuid4()
        message.lock_token = token
        message.locked_until_us = (
            session.locked_until_us if session is not None else clamp_us(now_us + self.settings.lock_duration_us)
        )
        self.locks[token] = message.sequence_number
        if session is not None:
            session.locked_messages.add(token)
        else:
            self.push_lock_expiry(message)

    def push_lock_expiry(self, message: StoredMessage) -> None:
        assert message.lock_token is not None and message.locked_until_us is not None
        heapq.heappush(self._lock_expiry, (message.locked_until_us, message.lock_token))

    def unlock(self, message: StoredMessage, now_us: int, *, lost: str | None = None) -> list[Op]:
        """Release a lock (abandon, lock expiry, session closed); dead-letter past max_delivery_count."""
        token = message.lock_token
        if token is not None:
            self.locks.pop(token, None)
            if lost is not None:
                self._remember_lost(token, lost)
        message.lock_token = None
        message.locked_until_us = None
        if message.state == MessageState.DEFERRED:
            return []
        if not self.is_dead_letter and message.delivery_count >= self.settings.max_delivery_count:
            return self.move_to_dead_letter(
                message,
                "MaxDeliveryCountExceeded",
                f"Message could not be consumed after {self.settings.max_delivery_count} delivery attempts.",
            )
        if message.expires_at_us is not None and message.expires_at_us <= now_us and not self.is_dead_letter:
            return self._expire(message)
        self._make_available(message)
        return []

    def _remember_lost(self, token: uuid.UUID, why: str) -> None:
        self.lost_tokens[token] = why
        while len(self.lost_tokens) > LOST_TOKENS_KEPT:
            self.lost_tokens.popitem(last=False)

    def remove(self, message: StoredMessage) -> list[Op]:
        """Complete / receive-and-delete / cancel: the message is gone."""
        self._forget(message.sequence_number)
        return [DeleteMessage(self.path, message.sequence_number)]

    def move_to_dead_letter(self, message: StoredMessage, reason: str | None, description: str | None) -> list[Op]:
        assert self.dead_letter_queue is not None
        self.counters.dead_lettered += 1
        self._forget(message.sequence_number)
        dead = message.copy_for(self.dead_letter_queue.path)
        dead.state = MessageState.DEAD_LETTERED
        dead.lock_token = None
        dead.locked_until_us = None
        dead.dead_letter_reason = reason
        dead.dead_letter_error_description = description
        dead.dead_letter_source = None
        self.dead_letter_queue.add(dead, 0)
        return [DeleteMessage(self.path, message.sequence_number), PutMessage(dead)]

    # --- sessions -------------------------------------------------------------------------------
    def next_available_session(self) -> str | None:
        best: tuple[tuple[int, int], str] | None = None
        for session_id, heap in self._session_available.items():
            if session_id in self.sessions:
                continue
            while heap and heap[0][1] not in self._available_set:
                heapq.heappop(heap)
            if heap and (best is None or heap[0] < best[0]):
                best = (heap[0], session_id)
        return None if best is None else best[1]

    def available_session_ids(self) -> list[str]:
        """Sessions that may have available messages (their heaps are not empty)."""
        return [session_id for session_id, heap in self._session_available.items() if heap]

    def release_session(self, session_id: str, now_us: int, *, reason: str | None) -> list[Op]:
        lock = self.sessions.pop(session_id, None)
        if lock is None:
            return []
        ops: list[Op] = []
        for token in lock.locked_messages:
            seq = self.locks.get(token)
            if seq is not None:
                ops += self.unlock(self.messages[seq], now_us, lost=reason)
            elif reason is not None:
                self._remember_lost(token, reason)
        return ops

    def session_ids(self) -> list[str]:
        ids = {m.session_id for m in self.messages.values() if m.session_id is not None}
        return sorted(ids | set(self.session_states))

    # --- counts ---------------------------------------------------------------------------------
    def set_state(self, message: StoredMessage, state: MessageState) -> None:
        """Change the state of a message held here (keeps ``counts`` right)."""
        if message.sequence_number in self.messages:
            self._state_counts[message.state] -= 1
            self._state_counts[state] += 1
        message.state = state

    def counts(self) -> dict[str, int]:
        """Messages by state, in O(1): active (locked ones included), scheduled, deferred, dead-lettered."""
        counts = self._state_counts
        return {
            "active": counts[MessageState.ACTIVE],
            "scheduled": counts[MessageState.SCHEDULED],
            "deferred": counts[MessageState.DEFERRED],
            "dead_lettered": len(self.dead_letter_queue.messages) if self.dead_letter_queue else 0,
        }
