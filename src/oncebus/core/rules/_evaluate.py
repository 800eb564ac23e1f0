"""A subscription's rules against one message: which copies the subscription gets.

As Service Bus documents it (Topic filters and actions): the rules *without*
an action are OR-ed together and give at most **one** copy, unchanged; each
matching rule *with* an action gives **its own** copy, changed by the action
and carrying an application property ``RuleName`` with the rule's name. So
five matching rules of which two have actions give three copies. A message
no rule matches is not delivered to the subscription.

A filter or action that throws (integer division by zero, an action setting
``sys.To`` to a number) is reported as a :class:`RuleFailure` and gives no
copy; what to do with it (Service Bus can dead-letter such a message,
``dead_lettering_on_filter_evaluation_exceptions``) is the broker's choice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

from oncebus.core.durations import to_micros
from oncebus.core.errors import InvalidArgumentError
from oncebus.core.messages import StoredMessage
from oncebus.core.rules._model import FalseRuleFilter, RuleProperties, TrueRuleFilter
from oncebus.core.rules._values import EvaluationError
from oncebus.core.rules._view import SYSTEM_PROPERTIES, MessageView
from oncebus.core.timeutil import datetime_to_us

RULE_NAME_PROPERTY = "RuleName"


class RuleDelivery(NamedTuple):
    """One copy a subscription gets.

    ``rule_name`` is None for the copy of the rules without an action.
    ``application_properties`` are the copy's, after the action;
    ``system_properties`` holds only what the action changed, by
    :class:`~oncebus.core.messages.Message` field name (``to``, ``subject``,
    ``time_to_live``...), with ``None`` for a removed property.
    """

    rule_name: str | None
    application_properties: dict[str, Any]
    system_properties: dict[str, Any]

    @property
    def changed(self) -> bool:
        return self.rule_name is not None

    def apply_to(self, stored: StoredMessage) -> StoredMessage:
        """The stored copy with this delivery's properties; ``wire``, the sender's encoding, is left as it was
        and ``rewritten`` names what a door must encode again when it delivers the copy."""
        if self.rule_name is None:
            return stored
        changes: dict[str, Any] = {}
        for name, value in self.system_properties.items():
            if name == "time_to_live":
                ttl_us = None if value is None else to_micros(value)
                changes["time_to_live_us"] = ttl_us
                changes["expires_at_us"] = None if ttl_us is None else stored.enqueued_time_us + ttl_us
            elif name == "scheduled_enqueue_time_utc":
                # Service Bus ignores a scheduled time set by a rule action on the subscription: recorded only
                changes["scheduled_enqueue_time_us"] = None if value is None else datetime_to_us(value)
            else:
                changes[name] = value
        rewritten = stored.rewritten | set(self.system_properties) | {"application_properties"}
        return dataclasses.replace(
            stored, application_properties=dict(self.application_properties), rewritten=rewritten, **changes
        )


class RuleFailure(NamedTuple):
    rule_name: str
    reason: str


class RulesOutcome(NamedTuple):
    deliveries: tuple[RuleDelivery, ...]
    failures: tuple[RuleFailure, ...] = ()

    @property
    def matched(self) -> bool:
        return bool(self.deliveries)


_SETTABLE = [(key, prop.field) for key, prop in SYSTEM_PROPERTIES.items() if prop.field and key != "label"]


class RuleSet:
    """A subscription's rules in creation order, ready to evaluate (each filter and action is compiled already).

    Rule names are unique, ignoring case. ``delivers_everything_unchanged``
    is True when a rule without an action matches everything (``$Default``)
    and no rule has an action: the broker can then skip evaluation.
    """

    __slots__ = ("_always_plain", "_plain", "_with_action", "rules")

    def __init__(self, rules: Iterable[RuleProperties]) -> None:
        self.rules: tuple[RuleProperties, ...] = tuple(rules)
        seen: set[str] = set()
        for rule in self.rules:
            if not isinstance(rule, RuleProperties):
                raise InvalidArgumentError(f"a subscription's rules are RuleProperties, got {type(rule).__name__}")
            if rule.name.lower() in seen:
                raise InvalidArgumentError(f"the rule name {rule.name!r} is used twice in one subscription")
            seen.add(rule.name.lower())
        plain = [r for r in self.rules if r.action is None and not isinstance(r.filter, FalseRuleFilter)]
        self._always_plain = any(isinstance(r.filter, TrueRuleFilter) for r in plain)
        self._plain = tuple(plain)
        self._with_action = tuple(
            r for r in self.rules if r.action is not None and not isinstance(r.filter, FalseRuleFilter)
        )

    @property
    def delivers_everything_unchanged(self) -> bool:
        return self._always_plain and not self._with_action

    def __iter__(self) -> Iterator[RuleProperties]:
        return iter(self.rules)

    def __len__(self) -> int:
        return len(self.rules)

    def evaluate(self, view: MessageView) -> RulesOutcome:
        failures: list[RuleFailure] = []
        plain = self._always_plain
        if not plain:
            for rule in self._plain:
                try:
                    if rule.filter.matches(view):
                        plain = True
                        break
                except EvaluationError as exc:
                    failures.append(RuleFailure(rule.name, f"filter: {exc}"))
        if not self._with_action:  # the common case: no copy changed by an action
            if plain:
                return RulesOutcome((RuleDelivery(None, view.application_properties, {}),), tuple(failures))
            return RulesOutcome((), tuple(failures))
        deliveries = [RuleDelivery(None, view.application_properties, {})] if plain else []
        for rule in self._with_action:
            try:
                if not rule.filter.matches(view):
                    continue
            except EvaluationError as exc:
                failures.append(RuleFailure(rule.name, f"filter: {exc}"))
                continue
            assert rule.action is not None
            try:
                work = rule.action.apply(view)
            except EvaluationError as exc:
                failures.append(RuleFailure(rule.name, f"action: {exc}"))
                continue
            properties = dict(work.application_properties)
            properties[RULE_NAME_PROPERTY] = rule.name
            changed = {field: work.system[key] for key, field in _SETTABLE if work.system[key] != view.system[key]}
            deliveries.append(RuleDelivery(rule.name, properties, changed))
        return RulesOutcome(tuple(deliveries), tuple(failures))


def evaluate_rules(rules: Sequence[RuleProperties] | RuleSet, view: MessageView) -> RulesOutcome:
    """The copies a subscription with ``rules`` gets of the message ``view`` shows (none: no match)."""
    rule_set = rules if isinstance(rules, RuleSet) else RuleSet(rules)
    return rule_set.evaluate(view)
