"""Per-entity statistics, typed, with the SDK's runtime-property names for message counts.

Counts (``accepted``, ``duplicates_dropped``, ``late_resends``) are of committed
work only. For a topic, the message counts are the sums over its subscriptions
(each holds its own copy), and ``subscriptions`` gives them one by one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from oncebus.broker.receivable import Receivable
from oncebus.broker.registry import Entity


@dataclass(frozen=True)
class LateResendDelays:
    """Delays (seconds) of the latest late resends: sends of a key that had left the window shortly before."""

    p50: float | None = None
    p99: float | None = None
    max: float | None = None
    recent: list[float] = field(default_factory=list)  # the last ten, oldest first


@dataclass(frozen=True)
class MessageCounts:
    """What one queue or subscription holds (names as ``QueueRuntimeProperties``)."""

    active_message_count: int = 0
    scheduled_message_count: int = 0
    deferred_message_count: int = 0
    dead_letter_message_count: int = 0
    size_in_bytes: int = 0

    @classmethod
    def of(cls, receivable: Receivable) -> MessageCounts:
        counts = receivable.counts()
        size = receivable.held_bytes
        if receivable.dead_letter_queue is not None:
            size += receivable.dead_letter_queue.size_bytes
        return cls(counts["active"], counts["scheduled"], counts["deferred"], counts["dead_lettered"], size)


@dataclass(frozen=True)
class EntityStats:
    name: str
    kind: str  # "queue" | "topic"
    requires_duplicate_detection: bool
    duplicate_detection_history_time_window: str  # ISO-8601, as configured
    enable_partitioning: bool
    accepted: int
    duplicates_dropped: int
    keys_held: int
    index_bytes: int
    oldest_key_age_seconds: float | None
    late_resends: int
    late_resend_delay_seconds: LateResendDelays
    next_sequence_number: int
    active_message_count: int
    scheduled_message_count: int
    deferred_message_count: int
    dead_letter_message_count: int
    size_in_bytes: int
    subscriptions: dict[str, MessageCounts] = field(default_factory=dict)  # topics: per subscription name

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values (the control socket's ``stats``)."""
        return dataclasses.asdict(self)


def _late_delays(delays_us: list[int]) -> LateResendDelays:
    delays = sorted(delays_us)
    if not delays:
        return LateResendDelays()
    return LateResendDelays(
        p50=delays[len(delays) // 2] / 1e6,
        p99=delays[min(len(delays) - 1, int(len(delays) * 0.99))] / 1e6,
        max=delays[-1] / 1e6,
        recent=[d / 1e6 for d in delays_us[-10:]],
    )


def entity_stats(entity: Entity, now_us: int) -> EntityStats:
    dedup = entity.detector.stats(now_us)
    subscriptions = {s.properties.name: MessageCounts.of(s.receivable) for s in entity.subscriptions.values()}
    parts = [MessageCounts.of(entity.receivable)] if entity.receivable is not None else list(subscriptions.values())
    if entity.scheduled is not None:  # a topic's scheduled messages wait at the topic until due
        parts.append(MessageCounts.of(entity.scheduled))
    props = entity.properties
    return EntityStats(
        name=props.name,
        kind=entity.kind,
        requires_duplicate_detection=entity.detector.enabled,
        duplicate_detection_history_time_window=props.to_dict()["duplicate_detection_history_time_window"],
        enable_partitioning=props.enable_partitioning,
        accepted=entity.counters["accepted"],
        duplicates_dropped=entity.counters["duplicates"],
        keys_held=dedup.keys_held,
        index_bytes=dedup.index_bytes,
        oldest_key_age_seconds=dedup.oldest_key_age_seconds,
        late_resends=entity.counters["late_resends"],
        late_resend_delay_seconds=_late_delays(list(entity.late_delays_us)),
        next_sequence_number=entity.next_sequence_number,
        active_message_count=sum(p.active_message_count for p in parts),
        scheduled_message_count=sum(p.scheduled_message_count for p in parts),
        deferred_message_count=sum(p.deferred_message_count for p in parts),
        dead_letter_message_count=sum(p.dead_letter_message_count for p in parts),
        size_in_bytes=sum(p.size_in_bytes for p in parts),
        subscriptions=subscriptions,
    )
