"""Entity paths as Service Bus spells them: ``queue``, ``topic/Subscriptions/sub``, ``…/$DeadLetterQueue``.

Names are case-insensitive; the canonical path is lower case.
"""

from __future__ import annotations

from dataclasses import dataclass

from oncebus.store.base import DLQ_SUFFIX, SUBSCRIPTIONS

__all__ = ["DLQ_SUFFIX", "SUBSCRIPTIONS", "EntityPath", "parse_path", "subscription_path"]


@dataclass(frozen=True)
class EntityPath:
    entity: str  # canonical path of the queue or topic
    subscription: str | None  # canonical subscription name
    dead_letter: bool

    @property
    def receivable(self) -> str:
        """Canonical path of the queue or subscription (without the dead-letter suffix)."""
        if self.subscription is None:
            return self.entity
        return f"{self.entity}{SUBSCRIPTIONS}{self.subscription}"


def parse_path(path: str) -> EntityPath:
    canonical = path.strip().strip("/").lower()
    for prefix in ("amqps://", "amqp://", "sb://"):
        if canonical.startswith(prefix):
            canonical = canonical[len(prefix) :].split("/", 1)[1] if "/" in canonical[len(prefix) :] else ""
    dead_letter = canonical.endswith(DLQ_SUFFIX)
    if dead_letter:
        canonical = canonical[: -len(DLQ_SUFFIX)]
    if SUBSCRIPTIONS in canonical:
        topic, subscription = canonical.rsplit(SUBSCRIPTIONS, 1)
        return EntityPath(topic, subscription, dead_letter)
    return EntityPath(canonical, None, dead_letter)


def subscription_path(topic: str, subscription: str) -> str:
    return f"{topic.lower()}{SUBSCRIPTIONS}{subscription.lower()}"
