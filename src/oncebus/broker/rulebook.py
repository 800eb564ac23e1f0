"""A subscription's rules changed one at a time: create, update, delete, look up (names ignore case).

The functions are pure: each takes the current rules and returns the new list,
or raises the error Service Bus gives: a second rule of the same name exists
(409), or none of that name (404). :class:`Rules` (the namespace's rule
methods) applies them and stores the whole list as one unit (``PutRules``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from datetime import datetime

from oncebus.broker.journal import Journal
from oncebus.broker.registry import Registry
from oncebus.core.errors import EntityAlreadyExistsError, EntityNotFoundError
from oncebus.core.rules import RuleProperties, validate_rule_name
from oncebus.core.timeutil import us_to_datetime


def _missing(topic: str, subscription: str, name: str) -> EntityNotFoundError:
    return EntityNotFoundError(
        f"The messaging entity '{topic}/Subscriptions/{subscription}/Rules/{name}' could not be found: "
        f"subscription {subscription!r} has no rule named {name!r}"
    )


def find(rules: Sequence[RuleProperties], topic: str, subscription: str, name: str) -> RuleProperties:
    for rule in rules:
        if rule.name.lower() == name.lower():
            return rule
    raise _missing(topic, subscription, name)


def created(
    rules: Sequence[RuleProperties], rule: RuleProperties, topic: str, subscription: str, now: datetime
) -> list[RuleProperties]:
    """``rules`` and a new ``rule`` (stamped with its creation time) at the end."""
    for existing in rules:
        if existing.name.lower() == rule.name.lower():
            raise EntityAlreadyExistsError(
                f"subscription '{topic}/Subscriptions/{subscription}' already has a rule named {existing.name!r}; "
                f"cannot create rule {rule.name!r} (rule names ignore case)"
            )
    return [*rules, dataclasses.replace(rule, created_at_utc=now)]


def updated(
    rules: Sequence[RuleProperties], rule: RuleProperties, topic: str, subscription: str
) -> tuple[list[RuleProperties], RuleProperties]:
    """``rules`` with the one named as ``rule`` replaced in place (its name and creation time kept)."""
    current = find(rules, topic, subscription, rule.name)
    new = dataclasses.replace(rule, name=current.name, created_at_utc=current.created_at_utc)
    return [new if r is current else r for r in rules], new


def deleted(rules: Sequence[RuleProperties], name: str, topic: str, subscription: str) -> list[RuleProperties]:
    validate_rule_name(name)
    current = find(rules, topic, subscription, name)
    return [r for r in rules if r is not current]


class Rules:
    """The rules of the registry's subscriptions, read and changed; each change is one durable unit."""

    def __init__(
        self, registry: Registry, journal: Journal, now: Callable[[], int], touch: Callable[[str, str], None]
    ) -> None:
        self.registry = registry
        self.journal = journal
        self.now = now
        self.touch = touch  # a management call: the subscription is not idle

    def list(self, topic: str, subscription: str) -> list[RuleProperties]:
        found = self.registry.subscription(topic, subscription)
        self.touch(topic, subscription)
        return list(found.rules)

    def get(self, topic: str, subscription: str, name: str) -> RuleProperties:
        return find(self.list(topic, subscription), topic, subscription, name)

    async def create(self, topic: str, subscription: str, rule: RuleProperties) -> RuleProperties:
        rules = created(self.list(topic, subscription), rule, topic, subscription, us_to_datetime(self.now()))
        await self.replace(topic, subscription, rules)
        return rules[-1]

    async def update(self, topic: str, subscription: str, rule: RuleProperties) -> RuleProperties:
        rules, new = updated(self.list(topic, subscription), rule, topic, subscription)
        await self.replace(topic, subscription, rules)
        return new

    async def delete(self, topic: str, subscription: str, name: str) -> None:
        await self.replace(topic, subscription, deleted(self.list(topic, subscription), name, topic, subscription))

    async def replace(self, topic: str, subscription: str, rules: Sequence[RuleProperties]) -> None:
        """The subscription's rules become ``rules`` (those without a creation time are created now)."""
        self.journal.check_alive()
        stamp = us_to_datetime(self.now())
        stamped = [r if r.created_at_utc is not None else dataclasses.replace(r, created_at_utc=stamp) for r in rules]
        ops = self.registry.set_rules(topic, subscription, stamped)
        self.touch(topic, subscription)
        await self.journal.write(ops)
