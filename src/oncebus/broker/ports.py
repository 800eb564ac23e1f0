"""The engine's ports: what the front ends (AMQP, HTTP, the control socket, the CLI, ``oncebus.testing``)
may ask of the broker, declared as three protocols and exported by ``oncebus.broker``.

- ``Messaging``: send, schedule, receive, settle, lock renewal, peek, sessions, waiting for messages;
- ``Administration``: queues, topics, subscriptions and rules;
- ``Observation``: statistics, the entity views for ``/metrics`` and the dashboard, the observer's
  history and store counters, the clock.

``Namespace`` implements all three (``tests/broker/test_ports.py`` holds it to them). A front end types
what it holds by the port it uses, and imports engine names only from ``oncebus.broker``, never a
module of it by path (``tests/test_layering.py``), so the engine's modules can move without the
front ends knowing.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, Protocol

from oncebus.broker.clock import Clock
from oncebus.broker.counters import EntityView
from oncebus.broker.faults import FaultBook
from oncebus.broker.observation import NamespaceObserver, TransportGauges
from oncebus.broker.receivable import SessionLock
from oncebus.broker.registry import EntityKind
from oncebus.broker.runtime_properties import RuntimeProperties
from oncebus.broker.sending import SendOutcome
from oncebus.broker.stats import EntityStats
from oncebus.broker.transactions import Transactions
from oncebus.core.entities import QueueProperties, SubscriptionProperties, TopicProperties
from oncebus.core.errors import EntityNotFoundError
from oncebus.core.messages import Message, ServiceBusReceiveMode
from oncebus.core.received import ReceivedMessage
from oncebus.core.rules import RuleProperties
from oncebus.core.tiers import TierQuotas

__all__ = ["Administration", "Broker", "Messaging", "Observation", "TransportGauges"]


class Messaging(Protocol):
    """Sending, receiving, settling and sessions: what the AMQP door (and ``oncebus.testing``) does with messages."""

    transactions: Transactions
    """Open transactions: sends and settlements held until a discharge stores them as one unit, or drops them."""
    quotas: TierQuotas
    """The tier's quotas (message and batch sizes a link advertises)."""
    faults: FaultBook
    """Failures armed by a test; the door fires them (``faults.armed`` is all the hot path reads)."""

    def open_receiver(self, path: str) -> Callable[[], None]:
        """A receiver opens on ``path``: counted against the tier's concurrent receive requests (server busy past
        it); call the returned function when it closes."""
        ...

    def lose_lock(self, path: str, lock_token: uuid.UUID) -> None:
        """Lose the message's lock now, as when it expires (the ``lock-lost`` fault)."""
        ...

    def lose_session_lock(self, session: SessionLock) -> None:
        """Lose a session's lock now, as when it expires (the ``session-lock-lost`` fault)."""
        ...

    async def send(self, entity_name: str, messages: Message | Sequence[Message]) -> list[SendOutcome]:
        """Send one message or an atomic batch to a queue or topic."""
        ...

    async def schedule_messages(
        self, entity_name: str, messages: Message | Sequence[Message], schedule_time_utc: datetime
    ) -> list[int]:
        """Schedule messages; returns their sequence numbers (for cancelling)."""
        ...

    async def cancel_scheduled_messages(self, entity_name: str, sequence_numbers: Iterable[int]) -> None:
        """Cancel scheduled messages; their dedup keys stay in the history."""
        ...

    def check_receivable(self, path: str, *, sessionful: bool | None = None) -> None:
        """Raise the error a receiver of ``path`` would meet (no such entity, a topic, ...; ``sessionful=False``:
        an entity that requires sessions); nothing else."""
        ...

    def entity_gone(self, path: str) -> EntityNotFoundError | None:
        """None while the queue, topic or subscription ``path`` names (a dead-letter sub-queue: its owner's) exists;
        otherwise the error saying it is not found (a link attached to it is detached with it). Touches nothing: a
        look that is no activity of the entity."""
        ...

    async def receive(
        self,
        path: str,
        max_message_count: int = 1,
        *,
        receive_mode: ServiceBusReceiveMode = ServiceBusReceiveMode.PEEK_LOCK,
        max_wait_time: float | None = 0.0,
        session: SessionLock | None = None,
    ) -> list[ReceivedMessage]:
        """Receive up to ``max_message_count`` messages, waiting up to ``max_wait_time`` s for the first."""
        ...

    async def complete(self, path: str, lock_token: uuid.UUID | str) -> None: ...

    def complete_soon(self, path: str, lock_token: uuid.UUID, done: Callable[[BaseException | None], None]) -> None:
        """``complete`` without a coroutine (the receive link's path): raises what it raises at once, else
        ``done(error)`` runs on the loop when the completion is committed (``None``) or failed."""
        ...

    async def abandon(
        self,
        path: str,
        lock_token: uuid.UUID | str,
        properties_to_modify: dict[str, Any] | None = None,
        *,
        failed: bool = True,
    ) -> None:
        """Let the message go (available again); ``failed=False``: not a delivery attempt (AMQP's ``released``: its
        delivery count is as before this delivery)."""
        ...

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

    async def renew_lock(self, path: str, lock_token: uuid.UUID | str) -> datetime: ...

    async def receive_deferred_messages(
        self,
        path: str,
        sequence_numbers: Iterable[int],
        *,
        receive_mode: ServiceBusReceiveMode = ServiceBusReceiveMode.PEEK_LOCK,
        session: SessionLock | None = None,
    ) -> list[ReceivedMessage]: ...

    def peek_messages(
        self,
        path: str,
        max_message_count: int = 1,
        *,
        sequence_number: int = 0,
        session_id: str | None = None,
    ) -> list[ReceivedMessage]:
        """Messages from ``sequence_number`` on, in order, whatever their state; nothing is locked."""
        ...

    async def accept_session(
        self, path: str, session_id: str | None = None, *, max_wait_time: float | None = 0.0
    ) -> SessionLock:
        """Lock a named session, or the next session with available messages."""
        ...

    async def renew_session_lock(self, session: SessionLock) -> datetime: ...

    async def close_session(self, session: SessionLock) -> None:
        """Release a session lock; messages still locked under it become available again."""
        ...

    async def get_session_state(self, session: SessionLock) -> bytes | None: ...

    async def set_session_state(self, session: SessionLock, state: bytes | None) -> None: ...

    def list_sessions(self, path: str, *, state_updated_after: datetime | None = None) -> list[str]:
        """Sessions with messages or a stored state; with ``state_updated_after``, those whose state was set since."""
        ...

    async def delete_messages(
        self,
        path: str,
        max_message_count: int,
        *,
        before_enqueued_time: datetime | None = None,
        session_id: str | None = None,
    ) -> int:
        """Batch delete: up to ``max_message_count`` of the oldest unlocked messages enqueued before the time (None:
        now), of one session if given; returns how many were deleted, their dedup keys kept."""
        ...

    async def wait_for_change(
        self, timeout: float, wake: asyncio.Future[None] | None = None, *, path: str | None = None
    ) -> None:
        """Return when messages may have become available at ``path`` (a send committed, an abandon, a lock released, a
        scheduled message due) or something changed for every receiver (an entity deleted, a reset), when ``wake``
        completes, or after ``timeout`` seconds. Without ``path``: any change at all is not reported, only the
        namespace-wide ones. A path that no longer resolves returns at once (the caller's next receive reports why)."""
        ...


class Administration(Protocol):
    """Entities and rules: what the HTTP administration API, the topology loader, the CLI and ``$management`` rule
    operations do."""

    quotas: TierQuotas
    """The tier's quotas (what the administration API reports and checks)."""

    async def create_entity(
        self, kind: EntityKind, name: str, **properties: Any
    ) -> QueueProperties | TopicProperties: ...

    async def update_entity(self, kind: EntityKind, name: str, **changes: Any) -> QueueProperties | TopicProperties: ...

    async def delete_entity(self, kind: EntityKind, name: str) -> None: ...

    def get_entity(self, kind: EntityKind, name: str) -> QueueProperties | TopicProperties: ...

    async def create_queue(self, name: str, **properties: Any) -> QueueProperties: ...

    async def create_topic(self, name: str, **properties: Any) -> TopicProperties: ...

    async def update_queue(self, name: str, **changes: Any) -> QueueProperties: ...

    async def update_topic(self, name: str, **changes: Any) -> TopicProperties: ...

    async def delete_queue(self, name: str) -> None: ...

    async def delete_topic(self, name: str) -> None: ...

    def authorization_rules(self, path: str) -> list[tuple[str, tuple[str, str], tuple[str, ...]]]:
        """The shared access rules of the queue or topic ``path`` belongs to (``a/b`` belongs to ``a/b``, not ``a``)."""
        ...

    def get_queue(self, name: str) -> QueueProperties: ...

    def queue_runtime_properties(self, name: str) -> RuntimeProperties:
        """Counts and sizes, as ``ServiceBusAdministrationClient`` names them (also for topics and subscriptions)."""
        ...

    def topic_runtime_properties(self, name: str) -> RuntimeProperties: ...

    def subscription_runtime_properties(self, topic_name: str, name: str) -> RuntimeProperties: ...

    def get_topic(self, name: str) -> TopicProperties: ...

    def list_queues(self) -> list[QueueProperties]: ...

    def list_topics(self) -> list[TopicProperties]: ...

    async def create_subscription(
        self,
        topic_name: str,
        name: str,
        *,
        default_rule: RuleProperties | None = None,
        rules: Sequence[RuleProperties] | None = None,
        **properties: Any,
    ) -> SubscriptionProperties:
        """A new subscription with the ``$Default`` rule, or ``default_rule`` instead, or exactly ``rules``."""
        ...

    async def update_subscription(self, topic_name: str, name: str, **changes: Any) -> SubscriptionProperties: ...

    async def delete_subscription(self, topic_name: str, name: str) -> None: ...

    def get_subscription(self, topic_name: str, name: str) -> SubscriptionProperties: ...

    def list_subscriptions(self, topic_name: str) -> list[SubscriptionProperties]: ...

    def list_rules(self, topic_name: str, name: str) -> list[RuleProperties]:
        """A subscription's rules, in the order they were created."""
        ...

    def get_rule(self, topic_name: str, name: str, rule_name: str) -> RuleProperties: ...

    async def create_rule(self, topic_name: str, name: str, rule: RuleProperties) -> RuleProperties: ...

    async def update_rule(self, topic_name: str, name: str, rule: RuleProperties) -> RuleProperties: ...

    async def delete_rule(self, topic_name: str, name: str, rule_name: str) -> None: ...

    async def set_rules(self, topic_name: str, name: str, rules: Sequence[RuleProperties]) -> None:
        """Replace a subscription's rules (an empty list: it receives nothing)."""
        ...

    def entity_names(self) -> list[str]: ...

    async def reset(self) -> None:
        """Delete every entity with its messages, sessions, counters and dedup history, in one commit, and let the time
        start again from the clock's reading (``oncebus.testing``'s fresh namespace per test)."""
        ...


class Observation(Protocol):
    """Counters and views: what ``/metrics``, the dashboard, ``oncebus stats`` and the control socket read."""

    def stats(self, entity_name: str) -> EntityStats:
        """Per-entity statistics, including what Azure drops silently (only what was committed)."""
        ...

    def entity_views(self) -> list[EntityView]:
        """Every entity's settings, counters and gauges (metrics, dashboard), in O(entities)."""
        ...

    observer: NamespaceObserver
    """History, store counters, and the gauges a front end reports (``observer.transport``)."""
    clock: Clock
    faults: FaultBook
    """Faults armed and fired (``/metrics``; the HTTP fault endpoints arm them)."""


class Broker(Messaging, Administration, Observation, Protocol):
    """The three ports together: what a door serving a whole namespace holds (the HTTP app, the AMQP server, the
    control socket). A module that needs one port types by that port; only ``oncebus.server`` (the composition
    root) names the concrete ``Namespace``."""
