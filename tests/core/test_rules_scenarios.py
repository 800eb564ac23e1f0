"""The shared rule scenarios (tests/data/scenarios.json, 'rule_scenarios') against the core alone.

The topic's duplicate detector judges each send; an accepted message goes
through each subscription's rules (core.rules), and the copies they give are
what a receiver of that subscription gets, in the order they become visible.
"""

from __future__ import annotations

from typing import Any

import pytest

from oncebus.core import DuplicateDetector, parse_duration
from oncebus.core.messages import Message
from oncebus.core.rules import MessageView, RuleProperties, RuleSet, default_rule
from tests.scenarios import load_rule_scenarios, projected_deliveries, rule_scenario_ids

MESSAGE_FIELDS = (
    "message_id",
    "correlation_id",
    "subject",
    "content_type",
    "reply_to",
    "reply_to_session_id",
    "to",
    "session_id",
)


def rule_set(rules: list[dict[str, Any]] | None) -> RuleSet:
    if rules is None:
        return RuleSet([default_rule()])
    return RuleSet(RuleProperties.from_dict(r) for r in rules)


def run_rules_on_core(scenario: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    topic = scenario["topic"]
    detector = DuplicateDetector(
        requires_duplicate_detection=topic.get("requires_duplicate_detection", False),
        window=parse_duration(topic.get("duplicate_detection_history_time_window", "PT10M")),
        partitioned=topic.get("enable_partitioning", False),
    )
    subscriptions = {name: rule_set(rules) for name, rules in scenario["subscriptions"].items()}
    visible: dict[str, list[tuple[float, int, dict[str, Any]]]] = {name: [] for name in subscriptions}
    order = 0
    for step in scenario["steps"]:
        sent = step.get("send") or step.get("schedule")
        if sent is None:
            continue
        now_us = round(step["at"] * 1_000_000)
        key = detector.key_of(sent["message_id"], sent.get("partition_key"), sent.get("session_id"))
        if detector.judge(key, now_us).duplicate:
            continue
        due = step["at"] + step.get("enqueue_after", 0)
        message = Message(
            body=b"x",
            application_properties=dict(sent.get("application_properties", {})),
            **{f: sent.get(f) for f in MESSAGE_FIELDS},
        )
        view = MessageView.of(message)
        for name, rules in subscriptions.items():
            outcome = rules.evaluate(view)
            assert outcome.failures == (), outcome.failures
            for delivery in outcome.deliveries:
                fields = {f: getattr(message, f) for f in MESSAGE_FIELDS}
                fields.update(delivery.system_properties)
                fields["application_properties"] = dict(delivery.application_properties)
                visible[name].append((due, order, fields))
                order += 1
    return {name: [m for _, _, m in sorted(copies, key=lambda c: c[:2])] for name, copies in visible.items()}


@pytest.mark.parametrize("scenario", load_rule_scenarios(), ids=rule_scenario_ids())
def test_rule_scenario_on_core(scenario: dict[str, Any]) -> None:
    got, expected = projected_deliveries(run_rules_on_core(scenario), scenario)
    assert got == expected


def test_every_rule_in_the_scenarios_round_trips() -> None:
    for scenario in load_rule_scenarios():
        for rules in scenario["subscriptions"].values():
            for data in rules or []:
                rule = RuleProperties.from_dict(data)
                again = RuleProperties.from_dict(rule.to_dict())
                assert again == rule
