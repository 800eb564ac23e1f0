"""Entity paths as Service Bus spells them: ``queue``, ``topic/Subscriptions/sub``, ``…/$DeadLetterQueue``.

Names are case-insensitive; the canonical path is lower case.
"""

from __future__ import annotations

from dataclasses import dataclass

from oncebus.store.base import DLQ_SUFFIX, SUBSCRIPTIONS

__all__ = ["DLQ_SUFFIX", "SUBSCRIPTIONS", "EntityPath", "address_path", "parse_path", "subscription_path"]


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


def address_path(address: str | None) -> str:
    """The path of an address: ``amqps://host:port/orders`` or ``sb://host/orders/`` -> ``orders``.

    The scheme and host are dropped, and the slashes around the path; a bare path is kept; the case is kept.
    """
    if not address:
        return ""
    address = address.strip()
    if "://" in address:
        rest = address.split("://", 1)[1]
        return rest.split("/", 1)[1].strip("/") if "/" in rest else ""
    return address.strip("/")


def parse_path(path: str) -> EntityPath:
    canonical = address_path(path).lower()
    dead_letter = canonical.endswith(DLQ_SUFFIX)
    if dead_letter:
        canonical = canonical[: -len(DLQ_SUFFIX)]
    if SUBSCRIPTIONS in canonical:
        topic, subscription = canonical.rsplit(SUBSCRIPTIONS, 1)
        return EntityPath(topic, subscription, dead_letter)
    return EntityPath(canonical, None, dead_letter)


def subscription_path(topic: str, subscription: str) -> str:
    return f"{topic.lower()}{SUBSCRIPTIONS}{subscription.lower()}"
