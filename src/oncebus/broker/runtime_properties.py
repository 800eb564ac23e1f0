"""Runtime properties with the names ``ServiceBusAdministrationClient`` uses, from the Namespace's public API.

Counts are read after advancing each queue or subscription to now (so due
scheduled messages count as active and expired ones are gone). A size counts
the messages and the session states, as Service Bus does. A topic holds
only its scheduled messages itself (they go through the rules when due; each
subscription has its own copy of the others), so its size is the sum of its
subscriptions' and of those scheduled messages, and its scheduled
count the number of those plus the distinct scheduled sequence numbers among
the subscriptions (copies scheduled before rules were evaluated at due time).

Created and updated times are the entity's (``UNKNOWN_TIME`` for an entity
stored by a release that did not record them); the accessed time is not
recorded yet and reads as ``UNKNOWN_TIME``, Azure's value for "never".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from oncebus.broker.receivable import Receivable
from oncebus.broker.stats import EntityStats
from oncebus.core.entities import QueueProperties, SubscriptionProperties, TopicProperties
from oncebus.core.messages import MessageState
from oncebus.core.rules import CorrelationRuleFilter, RuleProperties, SqlRuleFilter
from oncebus.core.timeutil import us_to_datetime

# Azure's own value for a time that never happened (an entity never accessed): 0001-01-01T00:00:00Z.
UNKNOWN_TIME = datetime(1, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class RuntimeProperties:
    active_message_count: int = 0
    dead_letter_message_count: int = 0
    scheduled_message_count: int = 0
    deferred_message_count: int = 0
    transfer_message_count: int = 0  # forwarding moves a message in the unit that stores it: never in transfer
    transfer_dead_letter_message_count: int = 0
    size_in_bytes: int = 0
    subscription_count: int = 0  # topics
    sql_filter_count: int = 0  # topics: their subscriptions' SQL filters (True and False filters are SQL filters)
    correlation_filter_count: int = 0  # topics: their subscriptions' correlation filters
    created_at_utc: datetime = UNKNOWN_TIME
    updated_at_utc: datetime = UNKNOWN_TIME
    accessed_at_utc: datetime = UNKNOWN_TIME

    @property
    def total_message_count(self) -> int:
        """``MessageCount``: every message of the entity, dead-lettered ones included."""
        return (
            self.active_message_count
            + self.dead_letter_message_count
            + self.scheduled_message_count
            + self.deferred_message_count
        )


class Entities(Protocol):
    """What the runtime properties read of a namespace (``Namespace`` passes itself)."""

    def get_queue(self, name: str) -> QueueProperties: ...

    def get_topic(self, name: str) -> TopicProperties: ...

    def get_subscription(self, topic_name: str, name: str) -> SubscriptionProperties: ...

    def list_subscriptions(self, topic_name: str) -> list[SubscriptionProperties]: ...

    def list_rules(self, topic_name: str, name: str) -> list[RuleProperties]: ...

    def stats(self, entity_name: str) -> EntityStats: ...

    def receivable(self, path: str) -> Receivable: ...


def _of(receivable: Receivable) -> RuntimeProperties:
    counts = receivable.counts()
    size = receivable.held_bytes
    if receivable.dead_letter_queue is not None:
        size += receivable.dead_letter_queue.size_bytes
    return RuntimeProperties(
        active_message_count=counts["active"],
        dead_letter_message_count=counts["dead_lettered"],
        scheduled_message_count=counts["scheduled"],
        deferred_message_count=counts["deferred"],
        size_in_bytes=size,
    )


def _stamped(runtime: RuntimeProperties, props: Any) -> RuntimeProperties:
    """With the entity's created and updated times, where it has them."""
    created, updated = props.created_at_us, props.updated_at_us
    return dataclasses.replace(
        runtime,
        created_at_utc=runtime.created_at_utc if created is None else us_to_datetime(created),
        updated_at_utc=runtime.updated_at_utc if updated is None else us_to_datetime(updated),
    )


def queue_runtime_properties(namespace: Entities, name: str) -> RuntimeProperties:
    props = namespace.get_queue(name)  # EntityNotFoundError when there is no such queue
    return _stamped(_of(namespace.receivable(name)), props)


def subscription_runtime_properties(namespace: Entities, topic: str, name: str) -> RuntimeProperties:
    props = namespace.get_subscription(topic, name)
    return _stamped(_of(namespace.receivable(f"{topic}/Subscriptions/{name}")), props)


def topic_runtime_properties(namespace: Entities, name: str) -> RuntimeProperties:
    subscriptions = namespace.list_subscriptions(name)
    size = 0
    scheduled: set[int] = set()
    for subscription in subscriptions:
        receivable = namespace.receivable(f"{name}/Subscriptions/{subscription.name}")
        size += receivable.held_bytes
        scheduled.update(seq for seq, m in receivable.messages.objects() if m.state == MessageState.SCHEDULED)
    stats = namespace.stats(name)  # its totals include the scheduled messages waiting at the topic itself
    at_topic = stats.scheduled_message_count - sum(s.scheduled_message_count for s in stats.subscriptions.values())
    waiting_bytes = stats.size_in_bytes - sum(s.size_in_bytes for s in stats.subscriptions.values())
    filters = [rule.filter for s in subscriptions for rule in namespace.list_rules(name, s.name)]
    runtime = RuntimeProperties(
        scheduled_message_count=len(scheduled) + at_topic,
        size_in_bytes=size + waiting_bytes,
        subscription_count=len(subscriptions),
        sql_filter_count=sum(isinstance(f, SqlRuleFilter) for f in filters),
        correlation_filter_count=sum(isinstance(f, CorrelationRuleFilter) for f in filters),
    )
    return _stamped(runtime, namespace.get_topic(name))
