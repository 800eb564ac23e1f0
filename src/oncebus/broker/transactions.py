"""Transactions: sends and settlements held until the transaction is discharged, then stored as one unit.

A client declares a transaction (AMQP's coordinator), does its work under the transaction's id
and discharges it. Until the discharge nothing of the work is visible, stored or judged: a send is
checked when it arrives (the entity exists, the message is valid, the transaction has room) and
held in memory; a settlement checks that its lock is held and is held in memory too (the message
stays locked by its receiver). A commit checks every lock again and then applies every operation
in order, without yielding the loop, into one journal unit (``Journal.start_batch``): one store
transaction, durable before the discharge is answered. A duplicate is judged then, by the
destination's window at the commit (the second of two sends with one id in one transaction is a
duplicate). A discharge with ``fail``, the timeout, the owner's connection closing or a crash
before the commit leave nothing of the transaction.

Four ``$management`` operations run in a transaction too: ``update-disposition`` is held as the link
settlements are (``settle_many``); ``schedule-message`` takes its sequence numbers from the entity's counter
at the request (its response gives them; a rollback leaves a gap) and stores the messages with them at the
commit (``schedule``); ``cancel-scheduled-message`` and ``set-session-state`` are checked at the request and
at the commit (``cancel``, ``set_session_state``).

Azure's limits: at most ``MAX_OPERATIONS`` messages per transaction, ``TIMEOUT_US`` from the
declare (then the transaction is rolled back and using its id says it timed out), and every
operation of one transaction on one entity, except the sends that go through it (send-via).
"""

from __future__ import annotations

import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from oncebus.broker.clock import Clock
from oncebus.broker.journal import Journal
from oncebus.broker.paths import parse_path
from oncebus.broker.receivable import Entry, Receivable, SessionLock, session_state_quota
from oncebus.broker.registry import Entity, EntityKind
from oncebus.broker.sending import Sender, SendOutcome, check_quota
from oncebus.core.errors import (
    InvalidArgumentError,
    MessageNotFoundError,
    OncebusError,
    QuotaExceededError,
    ServerBusyError,
)
from oncebus.core.messages import Message, MessageState
from oncebus.core.properties import check_application_properties
from oncebus.core.sending import CheckedSend, validate_send
from oncebus.core.tiers import TierQuotas

MAX_OPERATIONS = 100
"""The most messages one transaction sends and settles together (Azure Service Bus's quota)."""
TIMEOUT_US = 120_000_000
"""A transaction not discharged within this time of its declare is rolled back (Azure: 2 minutes)."""
MAX_TIMED_OUT_KEPT = 10_000  # ids of timed-out transactions remembered, so a late use says "timeout"
MAX_OPEN_PER_CONNECTION = 1000
"""oncebus's bound (Azure documents none): open transactions of one connection at a time."""
MAX_HELD_BYTES = 256 * 1024 * 1024
"""oncebus's bound (Azure documents none): bytes of messages all open transactions hold in memory together."""

Outcome = Literal["complete", "abandon", "defer", "dead_letter"]


class UnknownTransactionError(OncebusError, LookupError):
    condition = "amqp:transaction:unknown-id"
    status = 404


class TransactionRollbackError(OncebusError):
    condition = "amqp:transaction:rollback"
    status = 409


class TransactionTimeoutError(OncebusError):
    condition = "amqp:transaction:timeout"
    status = 408


class TransactionSpanError(OncebusError):
    condition = "amqp:not-allowed"
    status = 400


@dataclass
class PendingSend:
    destination: str
    messages: list[Message]


@dataclass
class PendingSettlement:
    path: str
    lock_token: uuid.UUID
    outcome: Outcome
    properties_to_modify: dict[str, Any] | None = None
    reason: str | None = None
    error_description: str | None = None
    failed: bool = True  # abandon: a delivery attempt (False: released, not counted)


@dataclass
class PendingSchedule:
    """Messages scheduled inside a transaction (``$management`` schedule-message), with the sequence numbers their
    response gave: reserved from the entity's counter at the request (a rollback leaves a gap), stored at the commit."""

    destination: str
    messages: list[Message]
    scheduled_us: int
    sequence_numbers: list[int]
    reserved_from: Entity | None = field(default=None, repr=False)  # the entity whose counter gave the numbers


@dataclass
class PendingCancel:
    """Scheduled messages cancelled inside a transaction (``$management`` cancel-scheduled-message)."""

    entity: str
    sequence_numbers: list[int]


@dataclass
class PendingSessionState:
    """A session state set inside a transaction (``$management`` set-session-state): the session lock must be held
    at the request and at the commit."""

    session: SessionLock
    state: bytes | None


Operation = PendingSend | PendingSettlement | PendingSchedule | PendingCancel | PendingSessionState


@dataclass
class Transaction:
    txn_id: bytes
    owner: object  # the connection that declared it: nobody else may use it
    declared_us: int
    entity: str | None = None  # the entity its operations are on (the via entity of a send-via)
    operations: list[Operation] = field(default_factory=list)
    messages: int = 0
    held_bytes: int = 0
    tokens: set[uuid.UUID] = field(default_factory=set)

    def describe(self) -> str:
        return f"transaction {self.txn_id.hex()}"


class Host(Protocol):
    """What a transaction uses of its namespace (``Namespace`` is one; this module cannot import it)."""

    clock: Clock
    quotas: TierQuotas
    _journal: Journal
    _sender: Sender

    def _check_alive(self) -> None: ...
    def _touch(self, path: str) -> None: ...
    def _require_backlog(self) -> None: ...
    def receivable(self, path: str) -> Receivable: ...
    def _session_lock(self, receivable: Receivable, session: SessionLock) -> SessionLock: ...
    async def set_session_state(self, session: SessionLock, state: bytes | None) -> None: ...
    def _entity(self, name: str, kind: EntityKind | None = None) -> Entity: ...
    def _check_status(self, path: str, operation: str) -> None: ...
    def _locked(self, path: str, lock_token: uuid.UUID | str) -> tuple[Receivable, Entry]: ...
    async def send(self, entity_name: str, messages: Message | list[Message]) -> list[SendOutcome]: ...
    async def complete(self, path: str, lock_token: uuid.UUID | str) -> None: ...
    async def abandon(
        self,
        path: str,
        lock_token: uuid.UUID | str,
        properties_to_modify: dict[str, Any] | None = None,
        *,
        failed: bool = True,
    ) -> None: ...
    async def defer(
        self, path: str, lock_token: uuid.UUID | str, properties_to_modify: dict[str, Any] | None = None
    ) -> None: ...
    async def dead_letter(
        self,
        path: str,
        lock_token: uuid.UUID | str,
        reason: str | None = None,
        error_description: str | None = None,
        properties_to_modify: dict[str, Any] | None = None,
    ) -> None: ...


def _check_settlement(namespace: Host, settlement: PendingSettlement) -> None:
    """What would refuse the settlement if it were applied now (its lock lost, a dead letter dead-lettered)."""
    receivable, _ = namespace._locked(settlement.path, settlement.lock_token)
    if settlement.outcome == "dead_letter" and receivable.is_dead_letter:
        raise InvalidArgumentError("a message in a dead-letter queue cannot be dead-lettered again")
    if settlement.properties_to_modify:
        check_application_properties(settlement.properties_to_modify, what="properties_to_modify")


def _check_cancel(namespace: Host, cancel: PendingCancel) -> None:
    """What would refuse the cancel if it were applied now: a number that is not a scheduled message's."""
    entity = namespace._entity(parse_path(cancel.entity).entity)
    holders = [*entity.receivables(), *([entity.scheduled] if entity.scheduled is not None else [])]
    for seq in cancel.sequence_numbers:
        if any(seq in r.messages and r.messages[seq].state == MessageState.SCHEDULED for r in holders):
            continue
        if entity.kind == "topic" and 0 < seq < entity.next_sequence_number:
            continue  # a topic's scheduled message no subscription took: cancelled as outside a transaction
        raise MessageNotFoundError(f"no scheduled message with sequence number {seq} in {entity.properties.name!r}")


def _check_session_state(namespace: Host, op: PendingSessionState) -> None:
    """What would refuse the session state if it were set now: the session lock lost."""
    namespace._session_lock(namespace.receivable(op.session.path), op.session)


class _SessionStateGrowth:
    """What a transaction's session states add to their queues' or subscriptions' sizes, by path, counted before
    its commit applies any of it: a refusal halfway through would leave memory ahead of the store. Only growth
    counts (a state that shrinks frees its room only once applied, maybe after a send that needs it), and a
    session set twice counts from the state before."""

    def __init__(self) -> None:
        self.growth: dict[str, int] = {}
        self._states: dict[tuple[str, str], bytes | None] = {}  # each session's state as the transaction leaves it

    def add(self, receivable: Receivable, op: PendingSessionState) -> None:
        key = (receivable.path, op.session.session_id)
        before = self._states[key] if key in self._states else receivable.session_states.get(key[1])
        self._states[key] = op.state
        more = session_state_quota(op.state) - session_state_quota(before)
        if more > 0:
            self.growth[receivable.path] = self.growth.get(receivable.path, 0) + more


def _run_now(work: Coroutine[Any, Any, Any]) -> None:
    """Run ``work`` to its end without yielding the loop (nothing else may change the namespace meanwhile)."""
    try:
        work.send(None)
    except StopIteration:
        return
    work.close()
    raise RuntimeError("an operation of a transaction waited during its commit")


class Transactions:
    """The namespace's open transactions (memory only: a restart forgets them, as a rollback would)."""

    def __init__(self, namespace: Host) -> None:
        self.namespace = namespace
        self.open: dict[bytes, Transaction] = {}
        self.timed_out: dict[bytes, None] = {}
        self.committed = 0
        self.rolled_back = 0
        self.held_bytes = 0  # what the open transactions' sends hold, together
        self.max_held_bytes = MAX_HELD_BYTES  # the bounds (a test proves them with small figures)
        self.max_open_per_connection = MAX_OPEN_PER_CONNECTION

    # ------------------------------------------------------------------------------ lifecycle
    def declare(self, owner: object) -> bytes:
        now = self.namespace.clock.now_us()
        for txn in list(self.open.values()):  # oldest first: those past their timeout are rolled back
            if now - txn.declared_us <= TIMEOUT_US:
                break
            self._time_out(txn)
        if sum(1 for t in self.open.values() if t.owner is owner) >= self.max_open_per_connection:
            raise QuotaExceededError(
                f"this connection has {self.max_open_per_connection} open transactions, oncebus's limit; discharge one "
                "before declaring another"
            )
        txn_id = uuid.uuid4().bytes
        self.open[txn_id] = Transaction(txn_id, owner, self.namespace.clock.now_us())
        return txn_id

    def get(self, txn_id: bytes, owner: object) -> Transaction:
        """The open transaction ``txn_id`` of ``owner``; one past its timeout is rolled back now."""
        txn = self.open.get(bytes(txn_id))
        if txn is None or txn.owner is not owner:
            if bytes(txn_id) in self.timed_out:
                raise TransactionTimeoutError(
                    f"transaction {bytes(txn_id).hex()} timed out ({TIMEOUT_US // 1_000_000} s after its declare) "
                    "and was rolled back: nothing of it was stored; declare a new one"
                )
            raise UnknownTransactionError(
                f"no open transaction {bytes(txn_id).hex()} on this connection (it was never declared here, or "
                "it was discharged already)"
            )
        if self.namespace.clock.now_us() - txn.declared_us > TIMEOUT_US:
            self._time_out(txn)
            return self.get(txn_id, owner)
        return txn

    def _time_out(self, txn: Transaction) -> None:
        self._drop(txn)
        self.timed_out[txn.txn_id] = None
        while len(self.timed_out) > MAX_TIMED_OUT_KEPT:
            del self.timed_out[next(iter(self.timed_out))]

    def _drop(self, txn: Transaction) -> None:
        self._close(txn)
        self.rolled_back += 1

    def _close(self, txn: Transaction) -> None:
        if self.open.pop(txn.txn_id, None) is not None:
            self.held_bytes -= txn.held_bytes

    def release(self, owner: object) -> None:
        """``owner``'s connection (or coordinator link) is gone: its open transactions are rolled back."""
        for txn in [t for t in self.open.values() if t.owner is owner]:
            self._drop(txn)

    # ------------------------------------------------------------------------------ work under a transaction
    def _admit(self, txn: Transaction, entity: str, count: int) -> None:
        top = parse_path(entity).entity
        if txn.entity is not None and txn.entity != top:
            raise TransactionSpanError(
                f"{txn.describe()} is on entity {txn.entity!r}; an operation on {top!r} cannot join it: the "
                "operations of one transaction must be on one entity (send to another through it with send-via, "
                "the com.microsoft:transfer-destination-address of the sender link)"
            )
        if txn.messages + count > MAX_OPERATIONS:
            raise QuotaExceededError(
                f"{txn.describe()} holds {txn.messages} messages; {count} more would pass the limit of "
                f"{MAX_OPERATIONS} messages per transaction (this operation was refused; the transaction is open)"
            )
        txn.entity = top

    def _destination(
        self, destination: str, messages: list[Message], verb: str, *, scheduled: bool
    ) -> tuple[Entity, CheckedSend]:
        """The queue or topic ``messages`` go to, checked as a send to it is (exists, status, sizes, ids)."""
        namespace = self.namespace
        namespace._check_alive()
        where = parse_path(destination)
        if where.subscription is not None or where.dead_letter:
            raise InvalidArgumentError(
                f"cannot {verb} to {destination!r}: {verb} to a queue or a topic, not to a subscription or a "
                "dead-letter queue"
            )
        entity = namespace._entity(where.entity)
        namespace._check_status(destination, "send")
        checked = validate_send(
            entity.properties, entity.detector, messages, scheduled=scheduled, quotas=namespace.quotas
        )
        return entity, checked

    def send(self, txn_id: bytes, owner: object, via: str, destination: str, messages: list[Message]) -> None:
        """Hold a send of ``messages`` to ``destination`` (through ``via``) until the commit; checked now."""
        txn = self.get(txn_id, owner)
        _, checked = self._destination(destination, messages, "send", scheduled=False)
        self._admit(txn, via, len(messages))
        self._hold_bytes(txn, checked.total_bytes)
        txn.operations.append(PendingSend(destination, list(messages)))
        txn.messages += len(messages)

    def settle(self, txn_id: bytes, owner: object, settlement: PendingSettlement) -> None:
        """Hold a settlement until the commit: its lock must be held now (and at the commit)."""
        self.settle_many(txn_id, owner, [settlement])

    def settle_many(self, txn_id: bytes, owner: object, settlements: list[PendingSettlement]) -> None:
        """Hold settlements of one entity (``$management`` update-disposition's lock tokens) until the commit: all
        of them, or none if one is refused (its lock must be held now, and at the commit)."""
        namespace = self.namespace
        txn = self.get(txn_id, owner)
        seen: set[uuid.UUID] = set()
        for settlement in settlements:
            _check_settlement(namespace, settlement)
            if settlement.lock_token in txn.tokens or settlement.lock_token in seen:
                raise InvalidArgumentError(
                    f"the message with lock token {settlement.lock_token} was settled in {txn.describe()} already"
                )
            seen.add(settlement.lock_token)
        if not settlements:
            return
        self._admit(txn, settlements[0].path, len(settlements))
        txn.operations += settlements
        txn.tokens |= seen
        txn.messages += len(settlements)

    def schedule(
        self, txn_id: bytes, owner: object, destination: str, messages: list[tuple[Message, int]]
    ) -> list[int]:
        """Hold messages, each with the time it is scheduled for, until the commit; checked now (all of them or none).
        Their sequence numbers are taken from the entity's counter now, in order (the response gives them; a
        rollback leaves a gap, as Service Bus's numbers may have) and the commit stores the messages with them."""
        txn = self.get(txn_id, owner)
        batch = [message for message, _ in messages]
        entity, checked = self._destination(destination, batch, "schedule", scheduled=True)
        self._admit(txn, destination, len(batch))
        self._hold_bytes(txn, checked.total_bytes)
        numbers = list(range(entity.next_sequence_number, entity.next_sequence_number + len(batch)))
        entity.next_sequence_number += len(batch)
        by_time: dict[int, PendingSchedule] = {}
        for (message, scheduled_us), number in zip(messages, numbers, strict=True):
            held = by_time.setdefault(scheduled_us, PendingSchedule(destination, [], scheduled_us, [], entity))
            held.messages.append(message)
            held.sequence_numbers.append(number)
        txn.operations += by_time.values()
        txn.messages += len(batch)
        return numbers

    def cancel(self, txn_id: bytes, owner: object, entity: str, sequence_numbers: list[int]) -> None:
        """Hold a cancel of scheduled messages until the commit: each must be scheduled now (and at the commit)."""
        txn = self.get(txn_id, owner)
        self.namespace._check_alive()
        self.namespace._require_backlog()  # the scheduled messages are known
        cancel = PendingCancel(entity, list(sequence_numbers))
        _check_cancel(self.namespace, cancel)
        self._admit(txn, entity, len(cancel.sequence_numbers))
        txn.operations.append(cancel)
        txn.messages += len(cancel.sequence_numbers)

    def set_session_state(self, txn_id: bytes, owner: object, session: SessionLock, state: bytes | None) -> None:
        """Hold a session state until the commit: the session lock must be held now (and at the commit)."""
        txn = self.get(txn_id, owner)
        self.namespace._check_alive()
        op = PendingSessionState(session, None if state is None else bytes(state))
        _check_session_state(self.namespace, op)
        self._admit(txn, session.path, 1)
        self._hold_bytes(txn, 0 if op.state is None else len(op.state))
        txn.operations.append(op)
        txn.messages += 1

    def _hold_bytes(self, txn: Transaction, total: int) -> None:
        if self.held_bytes + total > self.max_held_bytes:
            raise ServerBusyError(
                f"the open transactions hold {self.held_bytes} bytes of messages in memory; this send's "
                f"{total} more would pass oncebus's bound of {self.max_held_bytes} bytes (discharge "
                "transactions, then send again)"
            )
        txn.held_bytes += total
        self.held_bytes += total

    # ------------------------------------------------------------------------------ discharge
    async def discharge(self, txn_id: bytes, owner: object, fail: bool) -> str | None:
        """Roll back (``fail``) or commit: all of the transaction is stored, durably, in one unit, or none of it.
        Returns the entity a committed transaction was on (None: rolled back, or it did nothing)."""
        txn = self.get(txn_id, owner)
        self._close(txn)
        if fail:
            self.rolled_back += 1
            return None
        namespace = self.namespace
        try:
            namespace._check_alive()
            needed: dict[str, tuple[Entity, int, int]] = {}  # each destination's bytes and messages
            states = _SessionStateGrowth()
            for op in txn.operations:  # every lock still held, every destination still there and with room
                if isinstance(op, PendingSettlement):
                    _check_settlement(namespace, op)
                elif isinstance(op, PendingCancel):
                    _check_cancel(namespace, op)
                elif isinstance(op, PendingSessionState):
                    _check_session_state(namespace, op)
                    states.add(namespace.receivable(op.session.path), op)
                    entity = namespace._entity(parse_path(op.session.path).entity)
                    needed.setdefault(entity.path, (entity, 0, 0))
                else:
                    entity = namespace._entity(parse_path(op.destination).entity)
                    if isinstance(op, PendingSchedule) and entity is not op.reserved_from:
                        raise InvalidArgumentError(
                            f"{entity.properties.name!r} was deleted and created again since its messages were "
                            f"scheduled in the transaction: their sequence numbers {op.sequence_numbers} are not its"
                        )
                    namespace._check_status(op.destination, "send")
                    checked = validate_send(
                        entity.properties,
                        entity.detector,
                        op.messages,
                        scheduled=isinstance(op, PendingSchedule),
                        quotas=namespace.quotas,
                    )
                    _, total, count = needed.get(entity.path, (entity, 0, 0))
                    needed[entity.path] = (entity, total + checked.total_bytes, count + len(op.messages))
            for entity, total, count in needed.values():  # the states' growth and the sends, together
                check_quota(entity, total, count, states.growth)
        except OncebusError as exc:
            self.rolled_back += 1
            raise TransactionRollbackError(f"{txn.describe()} was rolled back, nothing of it stored: {exc}") from exc
        journal = namespace._journal
        journal.start_batch()
        try:
            for op in txn.operations:
                _run_now(self._apply(op))
        except BaseException as exc:
            journal.abort_batch(f"an operation of {txn.describe()} failed at its commit: {exc}")
            self.rolled_back += 1
            raise TransactionRollbackError(f"{txn.describe()} was rolled back, nothing of it stored: {exc}") from exc
        await journal.end_batch()
        self.committed += 1
        return txn.entity

    async def _apply(self, op: Operation) -> None:
        namespace = self.namespace
        if isinstance(op, PendingSend):
            await namespace.send(op.destination, op.messages)
        elif isinstance(op, PendingSchedule):
            namespace._touch(parse_path(op.destination).entity)
            await namespace._sender.send(op.destination, op.messages, op.scheduled_us, op.sequence_numbers)
        elif isinstance(op, PendingCancel):
            await namespace._sender.cancel_scheduled(op.entity, op.sequence_numbers)
        elif isinstance(op, PendingSessionState):
            await namespace.set_session_state(op.session, op.state)
        elif op.outcome == "complete":
            await namespace.complete(op.path, op.lock_token)
        elif op.outcome == "abandon":
            await namespace.abandon(op.path, op.lock_token, op.properties_to_modify, failed=op.failed)
        elif op.outcome == "defer":
            await namespace.defer(op.path, op.lock_token, op.properties_to_modify)
        else:
            await namespace.dead_letter(
                op.path,
                op.lock_token,
                reason=op.reason,
                error_description=op.error_description,
                properties_to_modify=op.properties_to_modify,
            )
