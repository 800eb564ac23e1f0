"""The entity registry: the namespace's queues, topics and subscriptions, looked up by name or path.

Pure bookkeeping on the broker's loop: ``create``/``update``/``delete`` change
memory and return the store operations that make the change durable; the
namespace writes them (one unit each) and owns the failure handling.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from oncebus.broker.counters import EntityCounters
from oncebus.broker.paths import EntityPath, parse_path, subscription_path
from oncebus.broker.receivable import Receivable, ReceivableSettings
from oncebus.core.dedup import DuplicateDetector
from oncebus.core.durations import to_micros
from oncebus.core.entities import (
    QueueProperties,
    SubscriptionProperties,
    TopicProperties,
    validate_entity_name,
    validate_subscription_name,
)
from oncebus.core.errors import EntityAlreadyExistsError, EntityNotFoundError, InvalidArgumentError, ServerBusyError
from oncebus.core.rules import CorrelationRuleFilter, RuleProperties, RuleSet, default_rule
from oncebus.core.tiers import STANDARD, TierQuotas
from oncebus.core.timeutil import us_to_datetime
from oncebus.store.base import AddCounters, DeleteEntity, Op, PruneDedupKeys, PutEntity, PutRules

EntityKind = Literal["queue", "topic"]
COUNTERS = ("accepted", "duplicates", "late_resends")
LATE_DELAYS_KEPT = 1_000


@dataclass
class Subscription:
    properties: SubscriptionProperties
    receivable: Receivable
    rules: RuleSet = field(default_factory=lambda: RuleSet([default_rule()]))  # evaluated at fan-out (routing)


@dataclass
class Entity:
    kind: EntityKind
    properties: QueueProperties | TopicProperties
    detector: DuplicateDetector
    receivable: Receivable | None = None  # queues
    subscriptions: dict[str, Subscription] = field(default_factory=dict)  # topics
    scheduled: Receivable | None = None  # topics: scheduled messages wait here, then go through the rules
    next_sequence_number: int = 1
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    unsaved: dict[str, int] = field(default_factory=dict)  # counted (committed sends' duplicates), not yet stored
    late_delays_us: collections.deque[int] = field(default_factory=lambda: collections.deque(maxlen=LATE_DELAYS_KEPT))
    last_prune_us: int = 0
    observed: EntityCounters = field(default_factory=EntityCounters)  # metrics beyond the persisted counters
    receivers: int = 0  # receive requests open on it (a topic: on all its subscriptions), see Registry.open_receiver

    @property
    def path(self) -> str:
        return self.properties.name.lower()

    def receivables(self) -> Iterator[Receivable]:
        """The queue itself, or the topic's subscriptions (not their dead-letter sub-queues)."""
        if self.receivable is not None:
            yield self.receivable
        for subscription in self.subscriptions.values():
            yield subscription.receivable

    def counters_op(self, deltas: dict[str, int]) -> AddCounters | None:
        """This unit's counts plus those counted but not stored yet (None when there is nothing to store)."""
        merged = dict(self.unsaved)
        self.unsaved.clear()
        for name, delta in deltas.items():
            merged[name] = merged.get(name, 0) + delta
        merged = {name: delta for name, delta in merged.items() if delta}
        if not merged and not deltas:
            return None
        return AddCounters(self.path, self.next_sequence_number, merged)


def receivable_settings(props: QueueProperties | SubscriptionProperties, max_size_mb: int) -> ReceivableSettings:
    return ReceivableSettings(
        lock_duration_us=to_micros(props.lock_duration),
        max_delivery_count=props.max_delivery_count,
        dead_lettering_on_message_expiration=props.dead_lettering_on_message_expiration,
        requires_session=props.requires_session,
        max_size_bytes=max_size_mb * 1024 * 1024,
    )


def _detector(props: QueueProperties | TopicProperties) -> DuplicateDetector:
    return DuplicateDetector(
        requires_duplicate_detection=props.requires_duplicate_detection,
        window=props.duplicate_detection_history_time_window,
        partitioned=props.enable_partitioning,
    )


_PROPERTIES: dict[str, type[QueueProperties] | type[TopicProperties]] = {
    "queue": QueueProperties,
    "topic": TopicProperties,
}


class Registry:
    """``quotas``: the namespace's tier and what Azure allows it (checked when entities and rules change)."""

    def __init__(self, quotas: TierQuotas = STANDARD) -> None:
        self.entities: dict[str, Entity] = {}
        self.quotas = quotas

    # ------------------------------------------------------------------------------ install
    def install(self, kind: EntityKind, props: QueueProperties | TopicProperties) -> Entity:
        entity = Entity(kind, props, _detector(props))
        if isinstance(props, QueueProperties):
            entity.receivable = Receivable(entity.path, receivable_settings(props, props.max_size_in_megabytes))
        else:
            waiting = SubscriptionProperties.create("scheduled")  # plain settings: nobody receives from it
            entity.scheduled = Receivable(entity.path, receivable_settings(waiting, props.max_size_in_megabytes))
        self.entities[entity.path] = entity
        return entity

    def install_subscription(
        self, topic: str, props: SubscriptionProperties, rules: list[RuleProperties] | None = None
    ) -> Subscription:
        entity = self.entity(topic, "topic")
        path = subscription_path(entity.path, props.name)
        receivable = Receivable(path, receivable_settings(props, entity.properties.max_size_in_megabytes))
        subscription = Subscription(props, receivable)
        if rules is not None:
            subscription.rules = RuleSet(rules)
        entity.subscriptions[props.name.lower()] = subscription
        return subscription

    # ------------------------------------------------------------------------------ lookup
    def entity(self, name: str, kind: EntityKind | None = None) -> Entity:
        entity = self.entities.get(name.lower())
        if entity is None:
            raise EntityNotFoundError(
                f"The messaging entity '{name}' could not be found: no queue or topic named {name!r} exists"
            )
        if kind is not None and entity.kind != kind:
            raise EntityNotFoundError(
                f"The messaging entity '{name}' could not be found: {name!r} is a {entity.kind}, not a {kind}"
            )
        return entity

    def subscription(self, topic_name: str, name: str) -> Subscription:
        topic = self.entity(topic_name, "topic")
        subscription = topic.subscriptions.get(name.lower())
        if subscription is None:
            raise EntityNotFoundError(
                f"The messaging entity '{topic_name}/Subscriptions/{name}' could not be found: "
                f"topic {topic_name!r} has no subscription named {name!r}"
            )
        return subscription

    def of_kind(self, kind: EntityKind) -> list[Entity]:
        return [e for e in self.entities.values() if e.kind == kind]

    def resolve(self, where: EntityPath) -> Receivable:
        entity = self.entities.get(where.entity)
        if entity is None:
            raise EntityNotFoundError(f"The messaging entity '{where.entity}' could not be found")
        if where.subscription is None:
            if entity.receivable is None:
                raise InvalidArgumentError(
                    f"'{entity.properties.name}' is a topic: receive from one of its subscriptions "
                    f"('{entity.properties.name}/Subscriptions/<name>')"
                )
            receivable = entity.receivable
        else:
            subscription = entity.subscriptions.get(where.subscription)
            if subscription is None:
                raise EntityNotFoundError(
                    f"The messaging entity '{where.entity}/Subscriptions/{where.subscription}' could not be found"
                )
            receivable = subscription.receivable
        if where.dead_letter:
            assert receivable.dead_letter_queue is not None
            return receivable.dead_letter_queue
        return receivable

    def receivable_by_path(self, path: str) -> Receivable | None:
        """Where a stored message or session state at ``path`` belongs (a topic's own path: its scheduled ones)."""
        where = parse_path(path)
        entity = self.entities.get(where.entity)
        if entity is not None and entity.scheduled is not None and where.subscription is None and not where.dead_letter:
            return entity.scheduled
        try:
            return self.resolve(where)
        except EntityNotFoundError:
            return None

    # ------------------------------------------------------------------------------ changes
    def create(self, kind: EntityKind, name: str, properties: dict[str, Any], now_us: int) -> tuple[Any, list[Op]]:
        validate_entity_name(name, kind=kind)
        if name.lower() in self.entities:
            raise EntityAlreadyExistsError(f"a {self.entities[name.lower()].kind} named {name!r} already exists")
        quotas = self.quotas
        props = _PROPERTIES[kind].create(name, **quotas.defaults(kind, properties)).stamped(now_us, created=True)
        quotas.check_entity(props)
        partitioned = sum(1 for e in self.entities.values() if e.properties.enable_partitioning)
        quotas.check_entity_count(len(self.entities), partitioned, props.enable_partitioning)
        check_forwarding(self.entities, name.lower(), props)
        self.install(kind, props)
        return props, [PutEntity(name.lower(), kind, props.to_dict())]

    def create_subscription(
        self,
        topic_name: str,
        name: str,
        properties: dict[str, Any],
        rules: Sequence[RuleProperties] | None = None,
        now_us: int = 0,
    ) -> tuple[SubscriptionProperties, list[Op]]:
        """A new subscription with ``rules`` (None: the ``$Default`` rule, as in Service Bus), created now."""
        validate_subscription_name(name)
        topic = self.entity(topic_name, "topic")
        if name.lower() in topic.subscriptions:
            raise EntityAlreadyExistsError(f"topic {topic_name!r} already has a subscription named {name!r}")
        self.quotas.check_subscription_count(topic.properties.name, len(topic.subscriptions))
        props = SubscriptionProperties.create(name, **properties).stamped(now_us, created=True)
        check_forwarding(self.entities, topic.path, props)
        stamp = us_to_datetime(now_us)
        rules = [default_rule()] if rules is None else list(rules)
        rules = [r if r.created_at_utc is not None else dataclasses.replace(r, created_at_utc=stamp) for r in rules]
        RuleSet(rules)  # names unique: checked before anything changes
        self._check_filters(topic, name, rules)
        subscription = self.install_subscription(topic.path, props, rules)
        path = subscription.receivable.path
        return props, [PutEntity(path, "subscription", props.to_dict()), PutRules(path, rules_json(rules))]

    def update(self, kind: EntityKind, name: str, changes: dict[str, Any], now_us: int) -> tuple[Any, list[Op]]:
        """New properties, applied; the ops store them and prune the keys that left the old window (one unit)."""
        entity = self.entity(name, kind)
        props = entity.properties.updated(**changes).stamped(now_us)
        if any(changes.get(key) is not None for key in ("max_message_size_in_kilobytes", "max_size_in_megabytes")):
            self.quotas.check_entity(props)  # what a release before the tiers stored is left as it is otherwise
        check_forwarding(self.entities, entity.path, props)
        prune = PruneDedupKeys(entity.path, now_us - to_micros(entity.detector.window) + 1)
        entity.properties = props
        entity.detector.set_window(props.duplicate_detection_history_time_window, now_us)
        if entity.receivable is not None and isinstance(props, QueueProperties):
            new = receivable_settings(props, props.max_size_in_megabytes)
            entity.receivable.settings.update(new)
        for subscription in entity.subscriptions.values():
            subscription.receivable.settings.max_size_bytes = props.max_size_in_megabytes * 1024 * 1024
        return props, [PutEntity(entity.path, kind, props.to_dict()), prune]

    def update_subscription(
        self, topic_name: str, name: str, changes: dict[str, Any], now_us: int
    ) -> tuple[SubscriptionProperties, list[Op]]:
        subscription = self.subscription(topic_name, name)
        topic = self.entity(topic_name, "topic")
        props = subscription.properties.updated(**changes).stamped(now_us)
        check_forwarding(self.entities, topic.path, props)
        subscription.properties = props
        new = receivable_settings(props, topic.properties.max_size_in_megabytes)
        subscription.receivable.settings.update(new)
        return props, [PutEntity(subscription.receivable.path, "subscription", props.to_dict())]

    def set_rules(self, topic_name: str, name: str, rules: list[RuleProperties]) -> list[Op]:
        """Replace a subscription's rules (names unique, ignoring case); the op stores them."""
        subscription = self.subscription(topic_name, name)
        checked = RuleSet(rules)
        self._check_filters(self.entity(topic_name, "topic"), name, list(checked))
        subscription.rules = checked
        return [PutRules(subscription.receivable.path, rules_json(list(subscription.rules)))]

    def open_receiver(self, path: str) -> Callable[[], None]:
        """Count a receiver (an open receive request) on ``path``'s queue or topic, as Azure counts concurrent
        receive requests: a topic's subscriptions (and dead-letter queues) together. Refused with server busy
        past the tier's ``max_concurrent_receives``; the returned function ends it (calling it again does
        nothing)."""
        entity = self.entity(parse_path(path).entity)
        limit = self.quotas.max_concurrent_receives
        if entity.receivers >= limit:
            raise ServerBusyError(
                f"The number of concurrent receive requests on {entity.kind} '{entity.properties.name}' has "
                f"reached its limit ({limit}{', across its subscriptions' if entity.kind == 'topic' else ''}); "
                "close a receiver, or retry later."
            )
        entity.receivers += 1
        open_ = [True]

        def release() -> None:
            if open_[0]:
                open_[0] = False
                entity.receivers -= 1

        return release

    def _check_filters(self, topic: Entity, subscription: str, rules: list[RuleProperties]) -> None:
        """The topic's SQL and correlation filters, with ``subscription``'s rules replaced by ``rules``: refused
        past the tier's counts when the change adds filters (removing some is always allowed)."""
        before = [0, 0]  # SQL (true and false filters too), correlation
        after = [0, 0]
        for rule in rules:
            after[isinstance(rule.filter, CorrelationRuleFilter)] += 1
        for key, other in topic.subscriptions.items():
            for rule in other.rules:
                kind = isinstance(rule.filter, CorrelationRuleFilter)
                before[kind] += 1
                if key != subscription.lower():
                    after[kind] += 1
        self.quotas.check_filter_counts(
            topic.properties.name, after[0], after[1], sql_before=before[0], correlation_before=before[1]
        )

    def delete(self, kind: EntityKind, name: str) -> list[Op]:
        entity = self.entity(name, kind)
        del self.entities[entity.path]
        return [DeleteEntity(entity.path)]

    def delete_subscription(self, topic_name: str, name: str) -> list[Op]:
        subscription = self.subscription(topic_name, name)
        del self.entity(topic_name, "topic").subscriptions[name.lower()]
        return [DeleteEntity(subscription.receivable.path)]


def rules_json(rules: list[RuleProperties]) -> list[dict[str, Any]]:
    return [rule.to_dict() for rule in rules]


def _forward_targets(entity: Entity) -> list[str]:
    """Where messages arriving at ``entity`` go on to: a queue's ``forward_to``, a topic's subscriptions'."""
    if entity.kind == "queue":
        target = getattr(entity.properties, "forward_to", None)
        return [] if target is None else [target.lower()]
    return [s.properties.forward_to.lower() for s in entity.subscriptions.values() if s.properties.forward_to]


def check_forwarding(entities: dict[str, Entity], owner: str, props: Any) -> None:
    """Refuse forwarding to a queue or topic that does not exist, or a chain that comes back to ``owner``.

    ``owner`` is the queue, or the topic of the subscription, that ``props`` (new properties) belong to.
    Forwarding of dead-lettered messages may go anywhere that exists (it only carries messages that
    were dead-lettered, so it cannot loop by itself). A subscription may forward into a chain that comes back
    to its own topic, and a queue to itself, as Service Bus allows (its answers recorded in the SDK repository:
    200 for each): a message transferred more than four times is dead-lettered (``routing.MAX_HOPS``), and one
    dead-lettered so stays in the dead-letter queue, so nothing circles for ever. A chain through other queues
    that comes back to a queue is refused.
    """
    loops_allowed = isinstance(props, SubscriptionProperties)
    for key in ("forward_to", "forward_dead_lettered_messages_to"):
        target = getattr(props, key, None)
        if target is None:
            continue
        if target.lower() not in entities and target.lower() != owner:
            raise EntityNotFoundError(
                f"{key} {target!r}: no queue or topic named {target!r} exists; the destination of forwarding must "
                "exist when the source is created or updated"
            )
    target = getattr(props, "forward_to", None)
    if target is None or loops_allowed or target.lower() == owner:
        return
    seen: set[str] = set()
    path = [owner, target.lower()]
    stack = [(target.lower(), path)]
    while stack:
        current, trail = stack.pop()
        if current == owner:
            shown = " -> ".join(trail)
            raise InvalidArgumentError(
                f"forward_to {target!r} would make a forwarding loop ({shown}); loops are refused"
            )
        if current in seen or current not in entities:
            continue
        seen.add(current)
        for nxt in _forward_targets(entities[current]):
            stack.append((nxt, [*trail, nxt]))
