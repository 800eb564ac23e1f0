"""What the broker does on its own as time passes (called from ``Namespace.tick``), besides expiry.

- Scheduled messages waiting at a topic that are due go through the
  subscriptions' rules (``routing``), as a send at that moment would.
- Messages sitting in a queue or subscription that forwards (a scheduled one
  that became due, or one that was there before ``forward_to`` was set), and
  dead-lettered messages of one with ``forward_dead_lettered_messages_to``,
  move on to the destination, judged there as a send.
- ``auto_delete_on_idle``: a queue, topic or subscription with no activity
  (a send, a receive or settlement, a management call) for that long is
  deleted, exactly as an explicit delete does (its messages, sessions and dedup
  history go with it). The time of each entity's last use is kept in
  memory and stored at a clean stop: after a clean restart idle time goes on
  from it; after a crash it counts from the start (``Activity``).

All of it is applied in memory at once and written in the background (the
store's failure handling reloads memory if such a write fails), like expiry.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any, cast

from oncebus.broker.contents import ContentCache
from oncebus.broker.receivable import Entry, Receivable
from oncebus.broker.registry import Entity, EntityKind, Registry
from oncebus.broker.routing import Plan, Router
from oncebus.core.durations import TIMESPAN_MAX, to_micros
from oncebus.core.messages import StoredMessage
from oncebus.store.base import AddCounters, Op, PutEntity

_LOG = logging.getLogger("oncebus.broker")


def commit_in_memory(plan: Plan, origin: Entity | None, now: int, contents: ContentCache) -> list[Op]:
    """Apply a plan at once (placements, counts); returns the ops that store it (written in the background).

    The copies' content stays in memory (pinned in ``contents``) until that write is committed."""
    for receivable, copy in plan.placements:
        receivable.add(Entry.of(copy), now)
        contents.pin(copy)
    plan.count_committed()
    ops = list(plan.ops)
    for path, deltas in plan.deltas.items():
        entity = plan.touched[path]
        ops.append(AddCounters(entity.path, entity.next_sequence_number, dict(deltas)))
    if origin is not None:  # rules with actions may have taken sequence numbers of the topic
        ops.append(AddCounters(origin.path, origin.next_sequence_number, {}))
    return ops


def release_scheduled(registry: Registry, router: Router, now: int, contents: ContentCache) -> list[Op]:
    """Scheduled messages waiting at topics that are due now: through the rules to the subscriptions."""
    ops: list[Op] = []
    for entity in list(registry.entities.values()):
        holder = entity.scheduled
        if holder is None or not holder.messages:
            continue
        ops += holder.advance(now)
        while (entry := holder.take()) is not None:
            ops += holder.remove(entry)
            message = _content(holder, entry, contents)
            if message is None:
                continue
            plan = Plan()
            router.route(entity, message, now, plan, message.hops)
            ops += commit_in_memory(plan, entity, now, contents)
    return ops


def _content(holder: Receivable, entry: Entry, contents: ContentCache) -> StoredMessage | None:
    """The content of a message taken from ``holder``, as held now (its state, delivery count)."""
    record = contents.read(holder.path, [entry.sequence_number]).get(entry.sequence_number)
    contents.discard(holder.path, entry.sequence_number)
    if record is None:
        _LOG.error("message %d of %s is not in the store; dropped", entry.sequence_number, holder.path)
        return None
    record.state = entry.state
    record.delivery_count = entry.delivery_count
    record.enqueued_time_us = entry.enqueued_time_us
    record.expires_at_us = entry.expires_at_us
    return record


def _forwarding_sources(registry: Registry) -> Iterator[tuple[Receivable, str]]:
    for entity in registry.entities.values():
        owners: list[tuple[Receivable, Any]] = []
        if entity.receivable is not None:
            owners.append((entity.receivable, entity.properties))
        owners += [(s.receivable, s.properties) for s in entity.subscriptions.values()]
        for receivable, props in owners:
            if getattr(props, "forward_to", None):
                yield receivable, props.forward_to
            if getattr(props, "forward_dead_lettered_messages_to", None) and receivable.dead_letter_queue is not None:
                yield receivable.dead_letter_queue, props.forward_dead_lettered_messages_to


def pump_forwarding(registry: Registry, router: Router, now: int, contents: ContentCache) -> list[Op]:
    """Available messages of forwarding queues, subscriptions and dead-letter queues: on to their destination."""
    ops: list[Op] = []
    for source, target in list(_forwarding_sources(registry)):
        while (entry := take_any(source)) is not None:
            if not router.has_room(target, entry.size):  # it waits where it is until the destination has room
                source.give_back(entry)
                break
            ops += source.remove(entry)
            message = _content(source, entry, contents)
            if message is None:
                continue
            plan = Plan()
            router.forward(message, source, target, now, plan, message.hops)
            ops += commit_in_memory(plan, None, now, contents)
            if any(place is source for place, _ in plan.placements):
                break  # it stayed here (a dead-letter queue keeps what cannot go on): the next tick tries again
    return ops


def take_any(receivable: Receivable) -> Entry | None:
    """The next available message of any unlocked session (or the next one, without sessions)."""
    if receivable.settings.requires_session and not receivable.is_dead_letter:
        for session_id in receivable.available_session_ids():
            if session_id not in receivable.sessions and (message := receivable.take(session_id)) is not None:
                return message
        return None
    return receivable.take()


class Activity:
    """When each queue, topic and subscription (by path) last saw a send, a receive or a management call.

    A clean stop stores these times with the entities (``accessed_at_us``); a start takes them and at once stores
    the entities without them, so that after a crash (no clean stop since) idle time counts from the start, never
    from a time older than the entity's real last use."""

    def __init__(self, since_us: int) -> None:
        self.since_us = since_us  # what counts as the last activity of an entity not touched since the start
        self.last: dict[str, int] = {}

    def touch(self, path: str, now: int) -> None:
        self.last[path] = now

    def idle_us(self, path: str, now: int) -> int:
        return now - self.last.get(path, self.since_us)

    def restore(self, registry: Registry, now: int) -> list[Op]:
        """Take the times a clean stop stored (at most now); returns the ops that store the entities without them."""
        ops: list[Op] = []
        for path, kind, props, keep in _used(registry):
            stored = props.accessed_at_us
            if stored is not None:
                self.last[path] = max(self.last.get(path, 0), min(now, stored))
                cleared = dataclasses.replace(props, accessed_at_us=None)
                keep(cleared)
                ops.append(PutEntity(path, kind, cleared.to_dict()))
        return ops

    def save(self, registry: Registry, now: int) -> list[Op]:
        """At a clean stop: every entity with the time of its last use (the start, if unused since)."""
        ops: list[Op] = []
        for path, kind, props, _keep in _used(registry):
            ops.append(PutEntity(path, kind, {**props.to_dict(), "accessed_at_us": self.last.get(path, self.since_us)}))
        return ops


def _used(registry: Registry) -> Iterator[tuple[str, str, Any, Callable[[Any], None]]]:
    """(path, kind, properties, a setter of new properties) of every queue, topic and subscription."""
    for entity in list(registry.entities.values()):
        yield entity.path, entity.kind, entity.properties, functools.partial(setattr, entity, "properties")
        for subscription in entity.subscriptions.values():
            keep = functools.partial(setattr, subscription, "properties")
            yield subscription.receivable.path, "subscription", subscription.properties, keep


def _idle_for(props: Any) -> int | None:
    idle = getattr(props, "auto_delete_on_idle", TIMESPAN_MAX)
    return None if idle >= TIMESPAN_MAX else to_micros(idle)


def delete_idle(registry: Registry, activity: Activity, now: int) -> list[Op]:
    """Delete what has been idle for its ``auto_delete_on_idle``, as an explicit delete does; returns its ops."""
    ops: list[Op] = []
    for kind, name, subscription in idle_entities(registry, activity, now):
        shown = name if subscription is None else f"{name}/Subscriptions/{subscription}"
        _LOG.info("deleting the %s %s: idle for its auto_delete_on_idle", kind, shown)
        if subscription is None:
            ops += registry.delete(cast(EntityKind, kind), name)
        else:
            ops += registry.delete_subscription(name, subscription)
    return ops


def idle_entities(registry: Registry, activity: Activity, now: int) -> list[tuple[str, str, str | None]]:
    """(kind, name, subscription name) of what has been idle for its ``auto_delete_on_idle``, to delete."""
    out: list[tuple[str, str, str | None]] = []
    for entity in registry.entities.values():
        limit = _idle_for(entity.properties)
        if limit is not None and activity.idle_us(entity.path, now) >= limit:
            out.append((entity.kind, entity.properties.name, None))
            continue
        for subscription in entity.subscriptions.values():
            limit = _idle_for(subscription.properties)
            if limit is not None and activity.idle_us(subscription.receivable.path, now) >= limit:
                out.append(("subscription", entity.properties.name, subscription.properties.name))
    return out
