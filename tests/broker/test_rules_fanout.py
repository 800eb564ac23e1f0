"""Subscription rules in the broker engine: the shared rule scenarios, rule CRUD, persistence, filter failures.

The rule scenarios (tests/data/scenarios.json, ``rule_scenarios``) run on the
in-memory store and on SQLite; the namespace is reopened before the final
receive, so what each subscription got (and its rules) survived a restart.
"""

from __future__ import annotations

from typing import Any

import pytest

from oncebus.broker import ManualClock, Message, Namespace
from oncebus.broker.runtime_properties import topic_runtime_properties
from oncebus.core.errors import EntityAlreadyExistsError, EntityNotFoundError, InvalidArgumentError
from oncebus.core.rules import (
    DEFAULT_RULE_NAME,
    CorrelationRuleFilter,
    FalseRuleFilter,
    RuleProperties,
    SqlRuleAction,
    SqlRuleFilter,
)
from oncebus.core.timeutil import us_to_datetime
from tests.broker.conftest import StoreFactory, run
from tests.scenarios import load_rule_scenarios, projected_deliveries, rule_scenario_ids

START = 1_800_000_000_000_000
FIELDS = (
    "message_id",
    "correlation_id",
    "subject",
    "content_type",
    "reply_to",
    "reply_to_session_id",
    "to",
    "session_id",
    "application_properties",
)


def _message(spec: dict[str, Any]) -> Message:
    return Message(
        body=b"x",
        application_properties=dict(spec.get("application_properties", {})),
        **{f: spec.get(f) for f in FIELDS if f != "application_properties"},
    )


async def drain(ns: Namespace, path: str) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    while batch := await ns.receive(path, 100):
        for m in batch:
            got.append({f: getattr(m, f) for f in FIELDS})
            await ns.complete(path, m.lock_token)  # type: ignore[arg-type]
    return got


async def run_rule_scenario(scenario: dict[str, Any], stores: StoreFactory) -> dict[str, list[dict[str, Any]]]:
    clock = ManualClock(START)
    ns = await Namespace.open(stores.open(), clock)
    await ns.create_topic("t", **scenario["topic"])
    for name, rules in scenario["subscriptions"].items():
        await ns.create_subscription("t", name)
        assert [r.name for r in ns.list_rules("t", name)] == [DEFAULT_RULE_NAME]
        if rules is not None:
            await ns.set_rules("t", name, [RuleProperties.from_dict(r) for r in rules])
    for step in scenario["steps"]:
        clock.set(START + round(step["at"] * 1_000_000))
        ns.tick()
        if "send" in step:
            await ns.send("t", _message(step["send"]))
        elif "schedule" in step:
            when = us_to_datetime(clock.now_us() + round(step["enqueue_after"] * 1_000_000))
            await ns.schedule_messages("t", _message(step["schedule"]), when)
    ns.tick()
    await ns.close()
    ns = await Namespace.open(stores.open(), clock)  # rules and copies survive a restart
    for name, rules in scenario["subscriptions"].items():
        expected = [DEFAULT_RULE_NAME] if rules is None else [r["name"] for r in rules]
        assert [r.name for r in ns.list_rules("t", name)] == expected
    return {name: await drain(ns, f"t/Subscriptions/{name}") for name in scenario["subscriptions"]}


@pytest.mark.parametrize("scenario", load_rule_scenarios(), ids=rule_scenario_ids())
def test_rule_scenario_on_broker(scenario: dict[str, Any], stores: StoreFactory) -> None:
    got, expected = projected_deliveries(run(run_rule_scenario(scenario, stores)), scenario)
    assert got == expected


def test_rule_crud_refusals_and_persistence(stores: StoreFactory) -> None:
    async def go() -> None:
        clock = ManualClock(START)
        ns = await Namespace.open(stores.open(), clock)
        await ns.create_topic("t")
        await ns.create_subscription("t", "s")
        made = await ns.create_rule("t", "s", RuleProperties("red", SqlRuleFilter("color = 'red'")))
        assert made.created_at_utc == us_to_datetime(START)
        assert [r.name for r in ns.list_rules("t", "s")] == ["$Default", "red"]
        with pytest.raises(EntityAlreadyExistsError, match="rule 'RED'"):
            await ns.create_rule("t", "s", RuleProperties("RED", FalseRuleFilter()))
        with pytest.raises(EntityNotFoundError):
            await ns.create_rule("t", "missing", RuleProperties("x", FalseRuleFilter()))
        with pytest.raises(EntityNotFoundError, match="Rules/blue"):
            ns.get_rule("t", "s", "blue")
        with pytest.raises(EntityNotFoundError):
            await ns.update_rule("t", "s", RuleProperties("blue", FalseRuleFilter()))
        clock.advance(5)
        updated = await ns.update_rule(
            "t", "s", RuleProperties("Red", CorrelationRuleFilter(label="r"), SqlRuleAction("SET x = 1"))
        )
        assert updated.name == "red" and updated.created_at_utc == us_to_datetime(START)  # name and creation kept
        await ns.delete_rule("t", "s", "$DEFAULT")
        with pytest.raises(EntityNotFoundError):
            await ns.delete_rule("t", "s", "$Default")
        await ns.close()
        ns = await Namespace.open(stores.open(), clock)
        assert ns.list_rules("t", "s") == [updated]
        await ns.delete_subscription("t", "s")
        await ns.create_subscription("t", "s")  # a new subscription of the same name starts with $Default again
        assert [r.name for r in ns.list_rules("t", "s")] == ["$Default"]
        with pytest.raises(InvalidArgumentError, match="used twice"):
            await ns.set_rules(
                "t", "s", [RuleProperties("a", FalseRuleFilter()), RuleProperties("A", FalseRuleFilter())]
            )
        assert [r.name for r in ns.list_rules("t", "s")] == ["$Default"]

    run(go())


def test_a_subscription_created_with_its_own_first_rule(stores: StoreFactory) -> None:
    async def go() -> None:
        ns = await Namespace.open(stores.open(), ManualClock(START))
        await ns.create_topic("t")
        rule = RuleProperties("$Default", SqlRuleFilter("n > 1"))
        await ns.create_subscription("t", "s", default_rule=rule)
        await ns.create_subscription("t", "none", rules=[])
        await ns.send(
            "t", [Message(b"", message_id="a", application_properties={"n": 2}), Message(b"", message_id="b")]
        )
        assert [m["message_id"] for m in await drain(ns, "t/Subscriptions/s")] == ["a"]
        assert await drain(ns, "t/Subscriptions/none") == []

    run(go())


def test_filter_failures_dead_letter_when_the_subscription_says_so(stores: StoreFactory) -> None:
    async def go() -> None:
        ns = await Namespace.open(stores.open(), ManualClock(START))
        await ns.create_topic("t")
        await ns.create_subscription("t", "dlq")  # dead_lettering_on_filter_evaluation_exceptions: true by default
        await ns.create_subscription("t", "drop", dead_lettering_on_filter_evaluation_exceptions=False)
        for name in ("dlq", "drop"):
            await ns.set_rules("t", name, [RuleProperties("div", SqlRuleFilter("10 / n = 5"))])
        await ns.send(
            "t",
            [
                Message(b"", message_id="zero", application_properties={"n": 0}),
                Message(b"", message_id="two", application_properties={"n": 2}),
            ],
        )
        assert [m["message_id"] for m in await drain(ns, "t/Subscriptions/dlq")] == ["two"]
        dead = await ns.receive("t/Subscriptions/dlq/$DeadLetterQueue", 10)
        assert [(m.message_id, m.dead_letter_reason) for m in dead] == [("zero", "FilterEvaluationException")]
        assert "div" in (dead[0].dead_letter_error_description or "")
        assert [m["message_id"] for m in await drain(ns, "t/Subscriptions/drop")] == ["two"]
        assert await ns.receive("t/Subscriptions/drop/$DeadLetterQueue", 10) == []

    run(go())


def test_copies_through_rules_with_actions_have_their_own_sequence_numbers(stores: StoreFactory) -> None:
    async def go() -> None:
        ns = await Namespace.open(stores.open(), ManualClock(START))
        await ns.create_topic("t")
        await ns.create_subscription("t", "s")
        await ns.create_subscription("t", "plain")
        await ns.create_rule("t", "s", RuleProperties("a", SqlRuleFilter("1=1"), SqlRuleAction("SET copy = 'a'")))
        await ns.create_rule("t", "s", RuleProperties("b", SqlRuleFilter("1=1"), SqlRuleAction("SET copy = 'b'")))
        first = await ns.send("t", Message(b"", message_id="m"))
        second = await ns.send("t", Message(b"", message_id="n"))
        got = await ns.receive("t/Subscriptions/s", 10)
        assert [(m.message_id, m.application_properties.get("copy")) for m in got] == [
            ("m", None), ("m", "a"), ("m", "b"), ("n", None), ("n", "a"), ("n", "b")
        ]  # fmt: skip
        assert len({m.sequence_number for m in got}) == 6
        assert got[0].sequence_number == first[0].sequence_number
        plain = await ns.receive("t/Subscriptions/plain", 10)
        assert [m.sequence_number for m in plain] == [first[0].sequence_number, second[0].sequence_number]

    run(go())


def test_a_scheduled_topic_message_waits_at_the_topic_and_can_be_cancelled(stores: StoreFactory) -> None:
    async def go() -> None:
        clock = ManualClock(START)
        ns = await Namespace.open(stores.open(), clock)
        await ns.create_topic("t")
        await ns.create_subscription("t", "s")
        later = us_to_datetime(START + 60_000_000)
        (kept,) = await ns.schedule_messages("t", Message(b"xyz", message_id="kept"), later)
        (gone,) = await ns.schedule_messages("t", Message(b"", message_id="gone"), later)
        topic = topic_runtime_properties(ns, "t")
        assert topic.scheduled_message_count == 2 and topic.size_in_bytes > 0
        assert ns.peek_messages("t/Subscriptions/s") == []  # not in the subscription before it is due
        await ns.cancel_scheduled_messages("t", [gone])
        await ns.close()
        ns = await Namespace.open(stores.open(), clock)  # it waits at the topic across a restart
        assert topic_runtime_properties(ns, "t").scheduled_message_count == 1
        await ns.set_rules("t", "s", [RuleProperties("late", SqlRuleFilter("sys.MessageId = 'kept'"))])
        clock.advance(61)
        ns.tick()  # due: the rules of now decide
        got = await drain(ns, "t/Subscriptions/s")
        assert [m["message_id"] for m in got] == ["kept"]
        assert topic_runtime_properties(ns, "t").scheduled_message_count == 0
        assert kept > 0

    run(go())
