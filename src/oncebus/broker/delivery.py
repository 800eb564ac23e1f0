"""Receiving, settling and sessions: the part of :class:`~oncebus.broker.namespace.Namespace` that hands
messages out and takes their outcomes back (a mixin: the namespace's state is its own).

A message is taken from its receivable under a lock (peek-lock) or removed
(receive-and-delete); its content is read through the content cache; an
outcome (complete, abandon, defer, dead-letter) is one unit in the journal,
applied in memory once committed. Sessions lock a session id of a receivable
for one receiver at a time and keep its state.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, NoReturn

from oncebus.broker.clock import Clock
from oncebus.broker.contents import ContentCache
from oncebus.broker.journal import Journal
from oncebus.broker.paths import parse_path
from oncebus.broker.receivable import TOKENS, Entry, Receivable, SessionLock
from oncebus.broker.registry import Entity, EntityKind, Registry
from oncebus.broker.routing import Router
from oncebus.broker.sending import check_quota
from oncebus.broker.signals import ChangeSignal
from oncebus.broker.upkeep import pump_forwarding
from oncebus.core.errors import (
    InvalidArgumentError,
    InvalidOperationError,
    MessageLockLostError,
    MessageNotFoundError,
    OperationTimeoutError,
    SessionCannotBeLockedError,
    SessionLockLostError,
)
from oncebus.core.keys import validate_ids
from oncebus.core.messages import (
    MessageState,
    ServiceBusReceiveMode,
    StoredMessage,
)
from oncebus.core.properties import carried_properties, check_application_properties
from oncebus.core.received import ReceivedMessage
from oncebus.core.timeutil import clamp_us, datetime_to_us, us_to_datetime
from oncebus.store.base import (
    Op,
    PutSessionState,
    Store,
    UpdateMessage,
)

_LOG = logging.getLogger("oncebus.broker")


def _token(lock_token: uuid.UUID | str) -> uuid.UUID:
    """A lock token as the broker keys it (the HTTP door and the management operations give its text)."""
    return lock_token if isinstance(lock_token, uuid.UUID) else uuid.UUID(str(lock_token))


UNCARRIED_PROPERTY_REASON = "InvalidApplicationProperty"
"""The DeadLetterReason of a message stored with an application property no door carries (see
``Delivery._dead_letter_uncarried``)."""

MAX_PEEK_MESSAGES = 250
"""The most messages one peek returns, whatever it asks for: Service Bus, too, answers a larger peek with fewer
messages (at most about 250 a call), no error; a peek does bounded work however large the backlog is."""


class Delivery:
    """Receiving, settling and sessions, mixed into ``Namespace``."""

    clock: Clock
    store: Store
    _registry: Registry
    _journal: Journal
    _contents: ContentCache
    _changes: ChangeSignal

    if TYPE_CHECKING:  # the namespace's own, used here
        _router: Router

        def _now(self) -> int: ...
        async def _backlog_restored(self) -> None: ...
        def _check_alive(self) -> None: ...
        def _require_backlog(self) -> None: ...
        def _notify(self) -> None: ...
        async def _wait(self, deadline: float | None, receivable: Receivable) -> bool: ...
        async def _write(self, ops: Sequence[Op]) -> None: ...
        def _write_later(self, ops: Sequence[Op]) -> None: ...
        def _note_moves(self, ops: Sequence[Op]) -> Callable[[], None] | None: ...
        def _entity(self, name: str, kind: EntityKind | None = None) -> Entity: ...
        def _touch(self, path: str) -> None: ...
        def receivable(self, path: str) -> Receivable: ...
        def _check_status(self, path: str, operation: str) -> None: ...

    # ------------------------------------------------------------------------------ receiving
    async def receive(
        self,
        path: str,
        max_message_count: int = 1,
        *,
        receive_mode: ServiceBusReceiveMode = ServiceBusReceiveMode.PEEK_LOCK,
        max_wait_time: float | None = 0.0,
        session: SessionLock | None = None,
    ) -> list[ReceivedMessage]:
        """Receive up to ``max_message_count`` messages, waiting up to ``max_wait_time`` s for the first.

        ``max_wait_time=None`` waits until a message arrives.
        """
        await self._backlog_restored()
        if max_message_count < 1:
            raise InvalidArgumentError(f"max_message_count must be at least 1, not {max_message_count}")
        loop = asyncio.get_running_loop()
        deadline = None if max_wait_time is None else loop.time() + max_wait_time
        while True:
            receivable = self.receivable(path)
            self._check_status(path, "receive")
            session_id = self._check_session(receivable, session, path)
            got: list[Entry] = []
            while len(got) < max_message_count:
                message = receivable.take(session_id)
                if message is None:
                    break
                got.append(message)
            if got:
                delivered = await self._deliver(receivable, got, receive_mode, session)
                if delivered:
                    return delivered
                continue  # each was dead-lettered instead (_dead_letter_uncarried): take the next ones
            if not await self._wait(deadline, receivable):
                return []

    def _check_session(self, receivable: Receivable, session: SessionLock | None, path: str) -> str | None:
        if receivable.settings.requires_session and not receivable.is_dead_letter:
            if session is None:
                raise InvalidOperationError(
                    f"It is not possible for an entity that requires sessions to create a non-sessionful "
                    f"message receiver: {path!r} requires sessions; accept a session first"
                )
            self._session_lock(receivable, session)
            return session.session_id
        if session is not None:
            raise InvalidArgumentError(f"{path!r} does not require sessions; receive without a session")
        return None

    def _session_lock(self, receivable: Receivable, session: SessionLock) -> SessionLock:
        current = receivable.sessions.get(session.session_id)
        if current is None or current.lock_token != session.lock_token:
            raise SessionLockLostError(
                f"the lock on session {session.session_id!r} of {receivable.path!r} was lost "
                "(it expired or was closed); accept the session again"
            )
        return current

    def _contents_of(
        self, receivable: Receivable, entries: list[Entry], *, as_carried: bool = True
    ) -> list[tuple[Entry, StoredMessage]]:
        """Each entry with its content (from the cache or the store; the state is the entry's, not the record's).

        ``as_carried``: a record holding application properties no door carries (stored before its door refused
        them) comes as a copy with them as text (:func:`carried_properties`), so every door can hand it out.
        """
        records = self._contents.read(receivable.path, [e.sequence_number for e in entries])
        out = []
        for entry in entries:
            record = records.get(entry.sequence_number)
            if record is None:  # memory and store disagree: the store is what was acknowledged
                _LOG.error("message %d of %s is not in the store; dropped", entry.sequence_number, receivable.path)
                receivable.remove(entry)
                continue
            if as_carried and record.wire is None and record.application_properties:
                repaired = carried_properties(record.application_properties)
                if repaired is not None:
                    record = dataclasses.replace(record, application_properties=repaired[0])
            out.append((entry, record))
        return out

    def _dead_letter_uncarried(
        self, receivable: Receivable, delivered: list[tuple[Entry, StoredMessage]]
    ) -> list[tuple[Entry, StoredMessage]]:
        """Move to the dead-letter queue each message holding application properties no door carries (sent before
        its door refused them, e.g. an integer past 64 bits over REST): delivered, it would fail its receiver's
        encoding; there a receiver gets it with those values as text, and why in its DeadLetterErrorDescription."""
        kept: list[tuple[Entry, StoredMessage]] = []
        ops: list[Op] = []
        for entry, record in delivered:
            repaired = None
            if record.wire is None and record.application_properties:
                repaired = carried_properties(record.application_properties)
            if repaired is None:
                kept.append((entry, record))
                continue
            _LOG.error(
                "message %d of %s cannot be delivered as it was stored: %s; moved to the dead-letter queue",
                entry.sequence_number,
                receivable.path,
                repaired[1],
            )
            description = f"{repaired[1]}; it was stored before such values were refused, and is delivered as text"
            ops += receivable.move_to_dead_letter(entry, UNCARRIED_PROPERTY_REASON, description)
        if not ops:
            return delivered
        self._write_later(ops)
        self._write_later(pump_forwarding(self._registry, self._router, self._now(), self._contents))
        return kept

    async def _deliver(
        self,
        receivable: Receivable,
        entries: list[Entry],
        mode: ServiceBusReceiveMode,
        session: SessionLock | None,
    ) -> list[ReceivedMessage]:
        if receivable.is_dead_letter:
            delivered = self._contents_of(receivable, entries)
        else:
            found = self._contents_of(receivable, entries, as_carried=False)
            delivered = self._dead_letter_uncarried(receivable, found)
        now = self._now()
        receivable.counters.received += len(delivered)
        if mode == ServiceBusReceiveMode.RECEIVE_AND_DELETE:
            ops: list[Op] = []
            for entry, _ in delivered:
                entry.delivery_count += 1
                ops += receivable.remove(entry)
                self._contents.discard(receivable.path, entry.sequence_number)
            await self._write(ops)
            return [ReceivedMessage.of(record, entry) for entry, record in delivered]
        for entry, _ in delivered:
            entry.delivery_count += 1
            receivable.lock(entry, now, session)
        return [ReceivedMessage.of(record, entry) for entry, record in delivered]

    def _locked(self, path: str, lock_token: uuid.UUID | str) -> tuple[Receivable, Entry]:
        receivable = self.receivable(path)
        token = _token(lock_token)
        seq = receivable.locked(token)
        if seq is None:
            self._not_locked(receivable, token)
        message = receivable.messages[seq]
        if receivable.session_lock_lost(message, token):
            self._not_locked(receivable, token)
        return receivable, message

    def _not_locked(self, receivable: Receivable, token: uuid.UUID) -> NoReturn:
        """Why ``token`` cannot be settled in ``receivable``: its session's lock is lost, or its own lock is."""
        if receivable.locked(token) is not None:  # locked, under a session lock that is lost
            raise SessionLockLostError("the session lock that delivered this message was lost")
        if receivable.lost_tokens.get(token) == "session":
            raise SessionLockLostError(
                "The session lock has expired on the MessageSession. Accept a new MessageSession."
            )
        raise MessageLockLostError(
            f"The lock supplied is invalid. Either the lock expired, or the message has already been "
            f"removed from the queue ({receivable.path}, lock token {token})"
        )

    async def complete(self, path: str, lock_token: uuid.UUID | str) -> None:
        await self._settle(self._completion(path, lock_token))

    def complete_soon(self, path: str, lock_token: uuid.UUID, done: Callable[[BaseException | None], None]) -> None:
        """``complete`` without a coroutine (the receive link's path): raises what it raises at once, else
        ``done(error)`` runs on the loop when the completion is committed (``None``) or failed."""
        self._journal.settle(self._completion(path, lock_token), done)  # (settle checks the store is alive)

    def _completion(self, path: str, lock_token: uuid.UUID | str) -> list[Op]:
        receivable = self.receivable(path)
        token = _token(lock_token)
        completed = receivable.complete(token)  # (compiled: the lock, its session's token, the removal, the count)
        if completed is None:
            self._not_locked(receivable, token)
        entry, ops = completed
        self._contents.discard(receivable.path, entry.sequence_number)
        return ops

    async def abandon(
        self,
        path: str,
        lock_token: uuid.UUID | str,
        properties_to_modify: dict[str, Any] | None = None,
        *,
        failed: bool = True,
    ) -> None:
        if properties_to_modify:
            check_application_properties(properties_to_modify, what="properties_to_modify")
        receivable, message = self._locked(path, lock_token)
        if not failed and message.delivery_count > 0:  # released: this delivery was no attempt (counted at lock)
            message.delivery_count -= 1
        if properties_to_modify:
            self._contents.discard(receivable.path, message.sequence_number)  # read again, modified
        receivable.drop_session_token(message)
        if failed:
            receivable.counters.abandoned += 1
        seq = message.sequence_number
        # its delivery count (and modified properties) first: they go along if it moves to the dead letters
        ops: list[Op] = [
            UpdateMessage(receivable.path, seq, int(message.state), message.delivery_count, properties_to_modify)
        ]
        ops += receivable.unlock(message, self._now())  # wakes its receivers if it is available again
        await self._settle(ops)

    async def defer(
        self, path: str, lock_token: uuid.UUID | str, properties_to_modify: dict[str, Any] | None = None
    ) -> None:
        if properties_to_modify:
            check_application_properties(properties_to_modify, what="properties_to_modify")
        receivable, message = self._locked(path, lock_token)
        if properties_to_modify:
            self._contents.discard(receivable.path, message.sequence_number)  # read again, modified
        receivable.drop_session_token(message)
        receivable.set_state(message, MessageState.DEFERRED)
        seq = message.sequence_number
        # deferred first (with its count and modified properties): they go along if this was its last delivery
        ops: list[Op] = [
            UpdateMessage(receivable.path, seq, int(message.state), message.delivery_count, properties_to_modify)
        ]
        moved = receivable.unlock(message, self._now())  # its last delivery: dead-lettered (counted as such)
        if not moved:
            receivable.counters.deferred += 1
        await self._settle(ops + moved)

    async def dead_letter(
        self,
        path: str,
        lock_token: uuid.UUID | str,
        reason: str | None = None,
        error_description: str | None = None,
        properties_to_modify: dict[str, Any] | None = None,
    ) -> None:
        if properties_to_modify:
            check_application_properties(properties_to_modify, what="properties_to_modify")
        receivable, message = self._locked(path, lock_token)
        if receivable.is_dead_letter:
            raise InvalidArgumentError("a message in a dead-letter queue cannot be dead-lettered again")
        receivable.drop_session_token(message)
        ops: list[Op] = []
        if properties_to_modify:  # modified first: the properties go along to the dead letters
            self._contents.discard(receivable.path, message.sequence_number)
            seq = message.sequence_number
            ops.append(
                UpdateMessage(receivable.path, seq, int(message.state), message.delivery_count, properties_to_modify)
            )
        ops += receivable.move_to_dead_letter(message, reason, error_description)
        await self._settle(ops)
        forwarded = pump_forwarding(self._registry, self._router, self._now(), self._contents)
        self._write_later(forwarded)  # forwards dead letters now

    def lose_lock(self, path: str, lock_token: uuid.UUID) -> None:
        """Lose the message's lock now, as when it expires (the ``lock-lost`` fault): settling it fails with
        ``MessageLockLostError`` and the message is available again."""
        receivable, message = self._locked(path, lock_token)
        receivable.drop_session_token(message)
        self._write_later(receivable.unlock(message, self._now(), lost="message"))

    def lose_session_lock(self, session: SessionLock) -> None:
        """Lose a session's lock now, as when it expires (the ``session-lock-lost`` fault): settling its messages
        or using the session fails with ``SessionLockLostError``."""
        receivable = self._registry.receivable_by_path(session.path)
        current = None if receivable is None else receivable.sessions.get(session.session_id)
        if receivable is not None and current is not None and current.lock_token == session.lock_token:
            self._write_later(receivable.release_session(session.session_id, self._now(), reason="session"))

    async def _settle(self, ops: list[Op]) -> None:
        """Settlements are confirmed once committed, before their fsync (docs/store.md): a completed message
        never comes back after a crash of the process, and may after a power failure (at least once). Those of
        one loop iteration (completions, abandons, deferrals, dead-letter moves) are one unit: one record of the
        settlement log, or one transaction (``Journal.settle``)."""
        await self._journal.settle_and_wait(ops, self._note_moves(ops))

    async def renew_lock(self, path: str, lock_token: uuid.UUID | str) -> datetime:
        receivable, message = self._locked(path, lock_token)
        if receivable.settings.requires_session and not receivable.is_dead_letter:
            session = receivable.sessions[message.session_id or ""]
            return us_to_datetime(session.locked_until_us)
        message.locked_until_us = clamp_us(self._now() + receivable.settings.lock_duration_us)
        receivable.push_lock_expiry(message)
        assert message.locked_until_us is not None
        return us_to_datetime(message.locked_until_us)

    async def receive_deferred_messages(
        self,
        path: str,
        sequence_numbers: Iterable[int],
        *,
        receive_mode: ServiceBusReceiveMode = ServiceBusReceiveMode.PEEK_LOCK,
        session: SessionLock | None = None,
    ) -> list[ReceivedMessage]:
        await self._backlog_restored()
        receivable = self.receivable(path)
        self._check_status(path, "receive")
        session_id = self._check_session(receivable, session, path)
        found = []
        for seq in sequence_numbers:
            message = receivable.messages.get(seq)
            if (
                message is None
                or message.state != MessageState.DEFERRED
                or message.lock_token is not None
                or (session_id is not None and message.session_id != session_id)
            ):
                raise MessageNotFoundError(
                    f"Failed to lock one or more specified messages. Either the message is not deferred or "
                    f"already locked: no deferred message with sequence number {seq} in {receivable.path!r}"
                )
            found.append(message)
        return await self._deliver(receivable, found, receive_mode, session)

    def peek_messages(
        self,
        path: str,
        max_message_count: int = 1,
        *,
        sequence_number: int = 0,
        session_id: str | None = None,
    ) -> list[ReceivedMessage]:
        """Messages from ``sequence_number`` on, in order, whatever their state; nothing is locked.

        At most ``MAX_PEEK_MESSAGES`` are returned, whatever is asked (as Service Bus answers an over-large peek:
        with fewer messages, no error); the caller peeks again from the last sequence number + 1 for more."""
        self._require_backlog()
        receivable = self.receivable(path)
        count = max(0, min(max_message_count, MAX_PEEK_MESSAGES))
        entries = receivable.messages.first_from(sequence_number, count, session_id)
        return [ReceivedMessage.peeked(record, entry) for entry, record in self._contents_of(receivable, entries)]

    # ------------------------------------------------------------------------------ sessions
    async def accept_session(
        self, path: str, session_id: str | None = None, *, max_wait_time: float | None = 0.0
    ) -> SessionLock:
        """Lock a named session, or the next session with available messages."""
        await self._backlog_restored()
        loop = asyncio.get_running_loop()
        deadline = None if max_wait_time is None else loop.time() + max_wait_time
        while True:
            receivable = self.receivable(path)
            self._check_status(path, "receive")
            if not receivable.settings.requires_session or receivable.is_dead_letter:
                raise InvalidArgumentError(f"{path!r} does not require sessions; receive without a session")
            now = self._now()
            if session_id is not None:
                validate_ids(None, None, session_id)
                if session_id in receivable.sessions:
                    raise SessionCannotBeLockedError(
                        f"The requested session '{session_id}' cannot be accepted. It may be locked by another "
                        "receiver."
                    )
                return self._lock_session(receivable, session_id, now)
            candidate = receivable.next_available_session()
            if candidate is not None:
                return self._lock_session(receivable, candidate, now)
            if not await self._wait(deadline, receivable):
                raise OperationTimeoutError(f"no unlocked session with messages in {path!r} became available")

    def _lock_session(self, receivable: Receivable, session_id: str, now: int) -> SessionLock:
        lock = SessionLock(
            receivable.path, session_id, TOKENS.next(), clamp_us(now + receivable.settings.lock_duration_us)
        )
        receivable.sessions[session_id] = lock
        return lock

    async def renew_session_lock(self, session: SessionLock) -> datetime:
        receivable = self.receivable(session.path)
        current = self._session_lock(receivable, session)
        current.locked_until_us = clamp_us(self._now() + receivable.settings.lock_duration_us)
        for token in current.locked_messages:
            seq = receivable.locked(token)
            if seq is not None:
                receivable.messages[seq].locked_until_us = current.locked_until_us
        session.locked_until_us = current.locked_until_us
        return us_to_datetime(current.locked_until_us)

    async def close_session(self, session: SessionLock) -> None:
        """Release a session lock; messages still locked under it become available again."""
        receivable = self._registry.receivable_by_path(session.path)
        if receivable is None:
            return
        current = receivable.sessions.get(session.session_id)
        if current is not None and current.lock_token == session.lock_token:
            self._write_later(receivable.release_session(session.session_id, self._now(), reason="session"))

    async def get_session_state(self, session: SessionLock) -> bytes | None:
        receivable = self.receivable(session.path)
        self._session_lock(receivable, session)
        return receivable.session_states.get(session.session_id)

    async def set_session_state(self, session: SessionLock, state: bytes | None) -> None:
        """Set (None: clear) the session's state; one that would take its queue or subscription past its size is
        refused (``QuotaExceededError``), the state left as it was: session states count toward the size."""
        receivable = self.receivable(session.path)
        self._session_lock(receivable, session)
        state = None if state is None else bytes(state)
        growth = receivable.session_state_growth(session.session_id, state)
        if growth > 0:
            check_quota(self._entity(parse_path(session.path).entity), 0, 0, {receivable.path: growth})
        now_us = self._now()
        receivable.set_session_state(session.session_id, state, now_us)
        await self._write([PutSessionState(receivable.path, session.session_id, state, now_us)])

    def list_sessions(self, path: str, *, state_updated_after: datetime | None = None) -> list[str]:
        """The sessions with messages or a stored state, in order of their ids; with ``state_updated_after``, only
        those whose state was set after that time (Service Bus's ``get-message-sessions`` with a last-updated time)."""
        self._require_backlog()
        receivable = self.receivable(path)
        if state_updated_after is None:
            return receivable.session_ids()
        after_us = datetime_to_us(state_updated_after)
        times = receivable.session_state_times
        return sorted(sid for sid in receivable.session_states if times.get(sid, 0) > after_us)
