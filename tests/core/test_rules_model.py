"""Correlation filters, SQL actions, a subscription's rule set, JSON forms and the emulator's Rules format."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from oncebus.core.errors import InvalidArgumentError, SqlExpressionError
from oncebus.core.messages import Message, StoredMessage
from oncebus.core.rules import (
    DEFAULT_RULE_NAME,
    RULE_NAME_PROPERTY,
    CorrelationRuleFilter,
    FalseRuleFilter,
    MessageView,
    RuleProperties,
    RuleSet,
    SqlRuleAction,
    SqlRuleFilter,
    TrueRuleFilter,
    default_rule,
    evaluate_rules,
    filter_from_dict,
    rules_from_emulator_config,
)


def view(app: dict[str, Any] | None = None, **system: Any) -> MessageView:
    return MessageView(system, app or {})


# ------------------------------------------------------------------ correlation filters


@pytest.mark.parametrize(
    ("fields", "message", "expected"),
    [
        ({"correlation_id": "Contoso"}, view(CorrelationId="Contoso"), True),
        ({"correlation_id": "Contoso"}, view(CorrelationId="contoso"), False),  # case-sensitive
        ({"correlation_id": "Contoso"}, view(), False),
        ({"label": "red", "correlation_id": "high"}, view(Label="red", CorrelationId="high"), True),
        ({"label": "red", "correlation_id": "high"}, view(Label="red", CorrelationId="low"), False),  # all must match
        ({"subject": "red"}, view(Subject="red"), True),
        (
            {"message_id": "m", "to": "t", "reply_to": "r", "session_id": "s", "reply_to_session_id": "rs"},
            view(MessageId="m", To="t", ReplyTo="r", SessionId="s", ReplyToSessionId="rs"),
            True,
        ),
        ({"content_type": "application/json"}, view(ContentType="application/json"), True),
        ({"content_type": "application/json"}, view(ContentType="text/plain"), False),
        ({"properties": {"prop1": "value1"}}, view({"prop1": "value1"}), True),
        ({"properties": {"prop1": "value1"}}, view({"PROP1": "value1"}), True),  # names are case-insensitive
        ({"properties": {"prop1": "value1"}}, view({"prop1": "Value1"}), False),
        ({"properties": {"prop1": "value1"}}, view({}), False),
        ({"properties": {"version": 2}}, view({"version": 2}), True),
        ({"properties": {"version": 2}}, view({"version": "2"}), False),  # Azure/azure-service-bus#401
        ({"properties": {"version": 2}}, view({"version": 2.0}), True),
        ({"properties": {"flag": True}}, view({"flag": 1}), False),
        ({"properties": {"a": 1, "b": "x"}}, view({"a": 1, "b": "x"}), True),
        ({"properties": {"a": 1, "b": "x"}}, view({"a": 1}), False),
    ],
)
def test_correlation_filter(fields: dict[str, Any], message: MessageView, expected: bool) -> None:
    assert CorrelationRuleFilter(**fields).matches(message) is expected


def test_correlation_filter_equals_its_documented_sql() -> None:
    # "equivalent to: sys.ReplyTo = 'johndoe@contoso.com' AND sys.Label = 'Important' AND color = 'Red'"
    correlation = CorrelationRuleFilter(label="Important", reply_to="johndoe@contoso.com", properties={"color": "Red"})
    sql = SqlRuleFilter("sys.ReplyTo = 'johndoe@contoso.com' AND sys.Label = 'Important' AND color = 'Red'")
    for reply_to in ("johndoe@contoso.com", "x", None):
        for label in ("Important", "important", None):
            for color in ("Red", "red", None):
                app = {} if color is None else {"color": color}
                v = view(app, ReplyTo=reply_to, Label=label)
                assert correlation.matches(v) is sql.matches(v)


def test_correlation_filter_validation() -> None:
    with pytest.raises(InvalidArgumentError, match="at least one"):
        CorrelationRuleFilter()
    with pytest.raises(InvalidArgumentError, match="not a string"):
        CorrelationRuleFilter(correlation_id=5)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="not a string, integer"):
        CorrelationRuleFilter(properties={"a": None})
    with pytest.raises(InvalidArgumentError, match="differ"):
        CorrelationRuleFilter(label="a", subject="b")


# ------------------------------------------------------------------ actions


def apply(action: str, app: dict[str, Any] | None = None, **system: Any) -> MessageView:
    return SqlRuleAction(action).apply(view(app, **system))


def test_action_of_the_dotnet_sample() -> None:
    before = view({"color": "red", "quantity": 5, "priority": "high"}, CorrelationId="high")
    after = SqlRuleAction("SET quantity = quantity / 2; REMOVE priority;SET sys.CorrelationId = 'low';").apply(before)
    assert after.application_properties == {"color": "red", "quantity": 2}  # long / long stays a long
    assert after.system["correlationid"] == "low"
    assert before.application_properties == {"color": "red", "quantity": 5, "priority": "high"}  # a copy changed


def test_action_statements() -> None:
    assert apply("SET sys.To = 'Entity'").system["to"] == "Entity"
    assert apply("SET sys.Label = 'x'").system["subject"] == "x"
    assert apply("set a = 1 set b = a + 1").application_properties == {"a": 1, "b": 2}  # in order, no separator
    assert apply("SET price = 3", {"price": 2.5}).application_properties == {"price": 3.0}  # long -> double
    assert apply("SET d = 3", {"d": Decimal("2.5")}).application_properties == {"d": Decimal(3)}
    assert apply("SET s = 3", {"s": "x"}).application_properties == {"s": 3}  # no implicit conversion: replaced
    assert apply("SET Quantity = 1", {"quantity": 5}).application_properties == {"quantity": 1}  # keeps the key
    assert apply("SET x = missing + 1").application_properties == {"x": None}  # unknown: not an error
    assert apply("REMOVE missing", {"a": 1}).application_properties == {"a": 1}
    assert apply("REMOVE A", {"a": 1, "A": 2}).application_properties == {}
    assert apply("REMOVE sys.To", To="t").system["to"] is None
    assert apply("SET [my prop] = 'v'").application_properties == {"my prop": "v"}
    ttl = SqlRuleAction("SET sys.TimeToLive = @ttl", {"@ttl": timedelta(seconds=30)}).apply(view())
    assert ttl.system["timetolive"] == timedelta(seconds=30)


@pytest.mark.parametrize(
    ("action", "words"),
    [
        ("SET sys.Size = 1", "sys.Size is read-only"),
        ("SET sys.SequenceNumber = 1", "read-only"),
        ("REMOVE sys.MessageId", "cannot be removed"),
        ("SET sys.To = 5", "sys.To takes a string"),
        ("SET sys.MessageId = NULL", "cannot be set to null"),
        ("SET sys.TimeToLive = 5", "takes a timespan"),
        ("SET sys.Colour = 'x'", "not a Service Bus system property"),
        ("SET a = b = c", "found '='"),
        ("SET a = (b = 1)", "a condition cannot be used as the value of SET"),
        ("SET a", "expected '='"),
        ("DELETE a", "found 'DELETE'"),
        ("SET set = 1", "SET is a reserved word"),
        ("; ".join(f"SET a{i} = {i}" for i in range(33)), "at most 32 statements"),
    ],
)
def test_invalid_actions_are_refused_at_creation(action: str, words: str) -> None:
    with pytest.raises(SqlExpressionError, match=words.replace("(", r"\(")):
        SqlRuleAction(action)


def test_an_action_that_fails_on_a_message_is_a_rule_failure() -> None:
    rules = RuleSet([RuleProperties("r", TrueRuleFilter(), SqlRuleAction("SET sys.To = quantity"))])
    outcome = rules.evaluate(view({"quantity": 1}))
    assert outcome.deliveries == ()
    assert [f.rule_name for f in outcome.failures] == ["r"]
    assert "sys.To takes a string" in outcome.failures[0].reason


# ------------------------------------------------------------------ a subscription's rules


def test_five_matching_rules_two_with_actions_give_three_copies() -> None:
    # "if you send one message that matches all five rules, you get three messages on the subscription"
    rules = [
        RuleProperties("a", SqlRuleFilter("n > 0")),
        RuleProperties("b", CorrelationRuleFilter(properties={"n": 1})),
        RuleProperties("c", TrueRuleFilter()),
        RuleProperties("d", SqlRuleFilter("n = 1"), SqlRuleAction("SET tag = 'd'")),
        RuleProperties("e", TrueRuleFilter(), SqlRuleAction("SET sys.To = 'e'")),
    ]
    outcome = evaluate_rules(rules, view({"n": 1}))
    assert [d.rule_name for d in outcome.deliveries] == [None, "d", "e"]
    plain, d, e = outcome.deliveries
    assert plain.application_properties == {"n": 1} and plain.system_properties == {}
    assert d.application_properties == {"n": 1, "tag": "d", RULE_NAME_PROPERTY: "d"}
    assert e.system_properties == {"to": "e"} and e.application_properties == {"n": 1, RULE_NAME_PROPERTY: "e"}


def test_rules_without_actions_give_one_copy() -> None:
    rules = [RuleProperties(f"r{i}", SqlRuleFilter(f"n >= {i}")) for i in range(5)]
    assert len(evaluate_rules(rules, view({"n": 9})).deliveries) == 1
    assert evaluate_rules(rules, view({"n": -1})).deliveries == ()
    assert evaluate_rules([], view({"n": 1})).matched is False  # no rule: nothing is delivered


def test_default_rule_and_boolean_filters() -> None:
    assert default_rule().name == DEFAULT_RULE_NAME == "$Default"
    assert isinstance(default_rule().filter, TrueRuleFilter) and default_rule().action is None
    assert RuleSet([default_rule()]).delivers_everything_unchanged
    assert not RuleSet(
        [default_rule(), RuleProperties("x", TrueRuleFilter(), SqlRuleAction("SET a = 1"))]
    ).delivers_everything_unchanged
    assert not RuleSet(
        [RuleProperties("x", SqlRuleFilter("1=1"))]
    ).delivers_everything_unchanged  # not known without compiling
    assert evaluate_rules([RuleProperties("f", FalseRuleFilter())], view()).matched is False
    assert TrueRuleFilter().sql_expression == "1=1" and FalseRuleFilter().sql_expression == "1=0"
    assert SqlRuleFilter("1=1").matches(view()) and not SqlRuleFilter("1=0").matches(view())


def test_a_failing_filter_is_reported_and_other_rules_still_deliver() -> None:
    rules = [RuleProperties("div", SqlRuleFilter("1 / n = 1")), RuleProperties("ok", SqlRuleFilter("n = 0"))]
    outcome = evaluate_rules(rules, view({"n": 0}))
    assert outcome.matched and [f.rule_name for f in outcome.failures] == ["div"]
    assert "division by zero" in outcome.failures[0].reason


def test_rule_names() -> None:
    with pytest.raises(InvalidArgumentError, match="used twice"):
        RuleSet([RuleProperties("a", TrueRuleFilter()), RuleProperties("A", FalseRuleFilter())])
    with pytest.raises(InvalidArgumentError, match="at most 50"):
        RuleProperties("x" * 51)
    with pytest.raises(InvalidArgumentError, match="not allowed"):
        RuleProperties("a/b")
    with pytest.raises(InvalidArgumentError, match="non-empty"):
        RuleProperties("")
    assert RuleProperties("sql-filter.1_x").filter == TrueRuleFilter()


def test_delivery_applied_to_a_stored_copy() -> None:
    stored = StoredMessage(
        path="t/subscriptions/s",
        sequence_number=1,
        message_id="m",
        body=b"x",
        enqueued_time_us=1_000_000,
        expires_at_us=None,
        application_properties={"a": 1},
    )
    action = SqlRuleAction(
        "SET sys.TimeToLive = @ttl; SET sys.Label = 'l'; SET sys.MessageId = 'n'; SET b = 2",
        {"@ttl": timedelta(seconds=5)},
    )
    (delivery,) = evaluate_rules([RuleProperties("r", TrueRuleFilter(), action)], MessageView.of(stored)).deliveries
    copy = delivery.apply_to(stored)
    assert copy.subject == "l" and copy.message_id == "n"
    assert copy.time_to_live_us == 5_000_000 and copy.expires_at_us == 6_000_000
    assert copy.application_properties == {"a": 1, "b": 2, RULE_NAME_PROPERTY: "r"}
    assert stored.application_properties == {"a": 1} and stored.subject is None


# ------------------------------------------------------------------ JSON-safe forms

ROUND_TRIP = [
    default_rule(),
    RuleProperties("f", FalseRuleFilter()),
    RuleProperties(
        "sql",
        SqlRuleFilter(
            "t < @t AND d > @d AND n = @n AND x = @x",
            {"@t": datetime(2026, 1, 1, tzinfo=UTC), "@d": timedelta(minutes=5), "@n": Decimal("1.5"), "@x": 2.5},
        ),
        SqlRuleAction("SET a = @a; REMOVE b", {"@a": "v"}),
        created_at_utc=datetime(2026, 2, 3, 4, 5, 6, tzinfo=UTC),
    ),
    RuleProperties(
        "corr",
        CorrelationRuleFilter(correlation_id="c", label="l", content_type="ct", properties={"p": 1, "q": True}),
        SqlRuleAction("SET sys.To = 'x'"),
    ),
]


@pytest.mark.parametrize("rule", ROUND_TRIP, ids=[r.name for r in ROUND_TRIP])
def test_rules_round_trip_through_json(rule: RuleProperties) -> None:
    text = json.dumps(rule.to_dict())
    again = RuleProperties.from_dict(json.loads(text))
    assert again == rule
    assert type(again.filter) is type(rule.filter)


def test_dict_forms_are_what_the_sdk_names() -> None:
    assert default_rule().to_dict() == {
        "name": "$Default",
        "filter": {"type": "true"},
        "action": None,
        "created_at_utc": None,
    }
    assert CorrelationRuleFilter(label="x", properties={"a": 1}).to_dict() == {
        "type": "correlation",
        "label": "x",
        "properties": {"a": 1},
    }
    assert filter_from_dict({"type": "correlation", "subject": "x"}) == CorrelationRuleFilter(label="x")


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"name": "r", "filter": {"type": "regex"}}, "not one of sql, correlation, true, false"),
        ({"name": "r", "filter": {"type": "correlation", "colour": "x"}}, "no field colour"),
        ({"name": "r", "filter": {"type": "sql", "sql_expression": "a ="}}, "column 4"),
        ({"name": "r", "action": {"sql": "SET a = 1"}}, "sql_expression"),
        ({"filter": {"type": "true"}}, "with a name"),
        (
            {"name": "r", "filter": {"type": "sql", "sql_expression": "a = @p", "parameters": {"@p": {"x": 1}}}},
            "not a value",
        ),
    ],
)
def test_bad_dicts_are_refused(data: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidArgumentError, match=words):
        RuleProperties.from_dict(data)


# ------------------------------------------------------------------ the emulator's Rules

# The four subscriptions of the official emulator's example Config.json
# (Azure/azure-service-bus-emulator-installer, ServiceBus-Emulator/Config/Config.json, MIT licence),
# with what its comments say each one routes.
EMULATOR_SUBSCRIPTIONS: dict[str, Any] = {
    "subscription.1": [
        {
            "Name": "app-prop-filter-1",
            "Properties": {"FilterType": "Correlation", "CorrelationFilter": {"ContentType": "application/json"}},
        }
    ],
    "subscription.2": [
        {
            "Name": "user-prop-filter-1",
            "Properties": {"FilterType": "Correlation", "CorrelationFilter": {"Properties": {"prop1": "value1"}}},
        }
    ],
    "subscription.3": None,
    "subscription.4": [
        {
            "Name": "sql-filter-1",
            "Properties": {
                "FilterType": "Sql",
                "SqlFilter": {"SqlExpression": "sys.MessageId = '123456' AND userProp1 = 'value1'"},
                "Action": {"SqlExpression": "SET sys.To = 'Entity'"},
            },
        }
    ],
}


def routes(message: Message) -> dict[str, list[str | None]]:
    out = {}
    for name, entries in EMULATOR_SUBSCRIPTIONS.items():
        outcome = evaluate_rules(rules_from_emulator_config(entries), MessageView.of(message))
        out[name] = [d.system_properties.get("to") for d in outcome.deliveries]
    return out


def test_the_emulator_example_routes_as_its_comments_say() -> None:
    assert routes(Message(content_type="application/json")) == {
        "subscription.1": [None],
        "subscription.2": [],
        "subscription.3": [None],
        "subscription.4": [],
    }
    assert routes(Message(application_properties={"prop1": "value1"})) == {
        "subscription.1": [],
        "subscription.2": [None],
        "subscription.3": [None],
        "subscription.4": [],
    }
    assert routes(Message(message_id="123456", application_properties={"userProp1": "value1"})) == {
        "subscription.1": [],
        "subscription.2": [],
        "subscription.3": [None],
        "subscription.4": ["Entity"],
    }


def test_emulator_rules_map_every_correlation_field() -> None:
    (rule,) = rules_from_emulator_config(
        [
            {
                "Name": "all",
                "Properties": {
                    "FilterType": "correlation",
                    "CorrelationFilter": {
                        "CorrelationId": "id1",
                        "Label": "subject1",
                        "MessageId": "msgid1",
                        "ReplyTo": "someQueue",
                        "ReplyToSessionId": "sessionId",
                        "SessionId": "session1",
                        "To": "xyz",
                        "ContentType": "ct",
                    },
                },
            }
        ]
    )
    assert rule.filter == CorrelationRuleFilter(
        correlation_id="id1",
        label="subject1",
        message_id="msgid1",
        reply_to="someQueue",
        reply_to_session_id="sessionId",
        session_id="session1",
        to="xyz",
        content_type="ct",
    )
    assert rules_from_emulator_config([]) == [default_rule()]


@pytest.mark.parametrize(
    ("entries", "words"),
    [
        (
            [{"Name": "r", "Properties": {"FilterType": "Regex"}}],
            r"Rules\[0\] \('r'\): FilterType must be Sql or Correlation",
        ),
        ([{"Name": "r", "Properties": {"FilterType": "Sql"}}], "needs SqlFilter.SqlExpression"),
        ([{"Name": "r", "Properties": {"FilterType": "Correlation", "CorrelationFilter": {}}}], "at least one of"),
        (
            [{"Name": "r", "Properties": {"FilterType": "Correlation", "CorrelationFilter": {"Colour": "x"}}}],
            "no field 'Colour'",
        ),
        (
            [{"Name": "r", "Properties": {"FilterType": "Sql", "SqlFilter": {"SqlExpression": "a = = 1"}}}],
            r"Rules\[0\] \('r'\): invalid SQL filter at line 1, column 5",
        ),
        (
            [
                {
                    "Name": "r",
                    "Properties": {
                        "FilterType": "Sql",
                        "SqlFilter": {"SqlExpression": "a = 1"},
                        "Action": {"SqlExpression": "SET sys.Size = 1"},
                    },
                }
            ],
            "read-only",
        ),
        (
            [{"Name": "r", "Properties": {"FilterType": "Sql", "SqlFilter": {"SqlExpression": "1=1"}, "Acton": {}}}],
            "unknown key 'Acton'",
        ),
        (
            [
                {"Name": "r", "Properties": {"FilterType": "Sql", "SqlFilter": {"SqlExpression": "1=1"}}},
                {"Name": "R", "Properties": {"FilterType": "Sql", "SqlFilter": {"SqlExpression": "1=1"}}},
            ],
            "used twice",
        ),
        ([{"Properties": {}}], "Name is required"),
        ({"Name": "r"}, "must be a list"),
    ],
)
def test_bad_emulator_rules_are_refused_with_their_place(entries: Any, words: str) -> None:
    with pytest.raises(InvalidArgumentError, match=words):
        rules_from_emulator_config(entries)


def test_emulator_sql_errors_keep_their_position() -> None:
    with pytest.raises(SqlExpressionError) as caught:
        rules_from_emulator_config(
            [{"Name": "r", "Properties": {"FilterType": "Sql", "SqlFilter": {"SqlExpression": "a = = 1"}}}]
        )
    assert (caught.value.line, caught.value.column) == (1, 5)
