"""RuleDescription XML both ways, against azure-servicebus's own serializer and parser (no server needed).

What the SDK's ``create_rule`` sends is read into core rules; what oncebus
answers is read back by the SDK's ``get_rule`` code path into the same
``RuleProperties`` it sent: every filter kind, every parameter and property
value type the SDK writes, and actions.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from xml.etree import ElementTree

import pytest
from azure.servicebus.management import CorrelationRuleFilter as SdkCorrelation
from azure.servicebus.management import FalseRuleFilter as SdkFalse
from azure.servicebus.management import RuleProperties as SdkRule
from azure.servicebus.management import SqlRuleAction as SdkAction
from azure.servicebus.management import SqlRuleFilter as SdkSql
from azure.servicebus.management import TrueRuleFilter as SdkTrue
from azure.servicebus.management._generated.models import (
    CreateRuleBody,
    CreateRuleBodyContent,
    RuleDescriptionEntry,
)
from azure.servicebus.management._utils import deserialize_rule_key_values, serialize_rule_key_values

from oncebus.core.errors import InvalidArgumentError, SqlExpressionError
from oncebus.core.rules import (
    CorrelationRuleFilter,
    FalseRuleFilter,
    RuleProperties,
    SqlRuleAction,
    SqlRuleFilter,
    TrueRuleFilter,
)
from oncebus.http import atom
from oncebus.http.rules import rule_from_xml, rule_view

WHEN = datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)


def rule(name: str, **kwargs: Any) -> SdkRule:
    return SdkRule(name, created_at_utc=None, **kwargs)


def sdk_body(sdk: SdkRule) -> bytes:
    """The body ``ServiceBusAdministrationClient.create_rule`` sends (its XML workaround policy included)."""
    body = CreateRuleBody(content=CreateRuleBodyContent(rule_description=sdk._to_internal_entity()))
    element = body.serialize(is_xml=True)
    serialize_rule_key_values(element, sdk)
    raw = ElementTree.tostring(element)
    return raw.replace(b"ns1:", b"").replace(b":ns1", b"")  # what ServiceBusXMLWorkaroundPolicy does


def sdk_read(rule: RuleProperties) -> SdkRule:
    """oncebus's answer for ``rule``, read as ``ServiceBusAdministrationClient.get_rule`` reads it."""
    content = atom.rule_description(rule_view(rule))
    entry = atom.entry(
        "https://h/t/Subscriptions/s/Rules/r", rule.name, content, published=WHEN, updated=WHEN, author="x"
    )
    element = ElementTree.fromstring(atom.entry_document(entry))
    parsed = RuleDescriptionEntry.deserialize(element)
    result = SdkRule._from_internal_entity(rule.name, parsed.content.rule_description)
    deserialize_rule_key_values(element, result)
    return result


def ours(rule: SdkRule) -> RuleProperties:
    return rule_from_xml(rule.name, atom.parse_description(sdk_body(rule)).element)


VALUES: dict[str, Any] = {
    "s": "text <&>",
    "i": -7,
    "big": 2**40,
    "f": 2.5,
    "yes": True,
    "no": False,
    "when": WHEN,
    "span": timedelta(minutes=5, seconds=3),
}

CASES = [
    (
        rule("sql", filter=SdkSql("color = 'red' AND n > @n", parameters={"@n": 3}), action=None),
        RuleProperties("sql", SqlRuleFilter("color = 'red' AND n > @n", {"@n": 3})),
    ),
    (rule("true", filter=SdkTrue(), action=None), RuleProperties("true", TrueRuleFilter())),
    (rule("false", filter=SdkFalse(), action=None), RuleProperties("false", FalseRuleFilter())),
    (
        rule(
            "corr",
            filter=SdkCorrelation(
                correlation_id="c",
                message_id="m",
                to="t",
                reply_to="rt",
                label="l",
                session_id="s",
                reply_to_session_id="rs",
                content_type="application/json",
                properties=dict(VALUES),
            ),
            action=None,
        ),
        RuleProperties(
            "corr",
            CorrelationRuleFilter(
                correlation_id="c",
                message_id="m",
                to="t",
                reply_to="rt",
                label="l",
                session_id="s",
                reply_to_session_id="rs",
                content_type="application/json",
                properties=dict(VALUES),
            ),
        ),
    ),
    (
        rule(
            "act",
            filter=SdkSql("EXISTS(x)"),
            action=SdkAction("SET x = @v; SET sys.Label = 'changed'; REMOVE y", parameters={"@v": 2.5}),
        ),
        RuleProperties(
            "act",
            SqlRuleFilter("EXISTS(x)"),
            SqlRuleAction("SET x = @v; SET sys.Label = 'changed'; REMOVE y", {"@v": 2.5}),
        ),
    ),
]


@pytest.mark.parametrize(("sdk", "expected"), CASES, ids=[c[1].name for c in CASES])
def test_what_the_sdk_sends_is_read_into_the_same_rule(sdk: SdkRule, expected: RuleProperties) -> None:
    assert ours(sdk) == expected


def _filter_fields(rule_filter: Any) -> dict[str, Any]:
    fields = {k: v for k, v in vars(rule_filter).items() if k != "requires_preprocessing"}
    for key in ("parameters", "properties"):
        if key in fields:
            fields[key] = dict(fields[key] or {})
    return {"type": type(rule_filter).__name__, **fields}


@pytest.mark.parametrize(("sdk", "expected"), CASES, ids=[c[1].name for c in CASES])
def test_what_oncebus_answers_is_read_by_the_sdk_as_what_it_sent(sdk: SdkRule, expected: RuleProperties) -> None:
    back = sdk_read(ours(sdk))
    assert back.name == sdk.name
    sent = _filter_fields(sdk.filter)
    if isinstance(sdk.filter, SdkFalse):
        sent["sql_expression"] = "1=0"  # Service Bus's text for the false filter; the SDK writes 1>1
    assert _filter_fields(back.filter) == sent
    if sdk.action is None:
        assert back.action is None
    else:
        assert (back.action.sql_expression, dict(back.action.parameters)) == (
            sdk.action.sql_expression,
            dict(sdk.action.parameters or {}),
        )


def test_a_decimal_and_a_created_time_are_shown() -> None:
    rule = RuleProperties("d", SqlRuleFilter("n = @d", {"@d": Decimal("1.25")}), created_at_utc=WHEN)
    back = sdk_read(rule)
    assert back.filter.parameters == {"@d": "1.25"}  # the SDK leaves decimals as text
    assert back.created_at_utc == WHEN


def test_an_invalid_sql_expression_names_its_position() -> None:
    with pytest.raises(SqlExpressionError, match=r"rule 'bad': invalid SQL filter at line 1, column 9") as caught:
        ours(rule("bad", filter=SdkSql("color = = 1"), action=None))
    assert (caught.value.line, caught.value.column) == (1, 9)
    with pytest.raises(SqlExpressionError, match=r"rule 'bad': invalid SQL action"):
        ours(rule("bad", filter=SdkTrue(), action=SdkAction("SET = 1")))


@pytest.mark.parametrize(
    ("xml", "message"),
    [
        ('<Filter i:type="LambdaFilter"/>', "LambdaFilter.*not supported"),
        ("<Filter/>", "no i:type"),
        ('<Filter i:type="SqlFilter"/>', "no SqlExpression"),
        ('<Filter i:type="CorrelationFilter"/>', "needs at least one of"),
        (
            '<Filter i:type="SqlFilter"><SqlExpression>a=@p</SqlExpression><Parameters><KeyValueOfstringanyType>'
            '<Key>@p</Key><Value i:type="d6p1:int" xmlns:d6p1="http://www.w3.org/2001/XMLSchema">x</Value>'
            "</KeyValueOfstringanyType></Parameters></Filter>",
            "'x' is not a valid int",
        ),
        ('<Action i:type="RubyAction"/>', "RubyAction.*not supported"),
        ("<Colour/>", "unknown RuleDescription element Colour"),
    ],
)
def test_bad_rule_descriptions_are_refused_naming_what_is_wrong(xml: str, message: str) -> None:
    body = (
        '<RuleDescription xmlns="http://schemas.microsoft.com/netservices/2010/10/servicebus/connect" '
        f'xmlns:i="http://www.w3.org/2001/XMLSchema-instance">{xml}</RuleDescription>'
    ).encode()
    with pytest.raises(InvalidArgumentError, match=message):
        rule_from_xml("r", atom.parse_description(body).element)
