"""Subscription rules in the administration API: ``RuleDescription`` XML <-> core rules, and the RuleBook.

The XML is what ``azure-servicebus`` writes and parses (its generated models
and ``management/_utils.serialize_rule_key_values``)::

    <RuleDescription>
      <Filter i:type="SqlFilter | TrueFilter | FalseFilter | CorrelationFilter">
        <SqlExpression>..</SqlExpression><CompatibilityLevel>20</CompatibilityLevel>
        <Parameters><KeyValueOfstringanyType><Key>@p</Key>
          <Value i:type="d6p1:int" xmlns:d6p1="http://www.w3.org/2001/XMLSchema">1</Value>
        </KeyValueOfstringanyType></Parameters>
        (CorrelationFilter: CorrelationId, MessageId, To, ReplyTo, Label, SessionId,
         ReplyToSessionId, ContentType, Properties)
      </Filter>
      <Action i:type="SqlRuleAction | EmptyRuleAction">..</Action>
      <CreatedAt>..</CreatedAt><Name>..</Name>
    </RuleDescription>

Every rule is validated (a SQL text compiled) by core when it is built, so an
invalid expression is refused with 400 naming its line and column, and
nothing is stored. :class:`NamespaceRules` keeps rules in the Namespace (the
same rules as the CLI's and the config file's).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any, Protocol
from xml.etree.ElementTree import Element
from xml.sax.saxutils import escape

from oncebus.broker import UNKNOWN_TIME, Administration
from oncebus.core.durations import format_duration, parse_duration
from oncebus.core.errors import InvalidArgumentError, named
from oncebus.core.properties import CORRELATION_NAMES
from oncebus.core.rules import (
    DEFAULT_RULE_NAME,
    CorrelationRuleFilter,
    FalseRuleFilter,
    RuleFilter,
    RuleProperties,
    SqlRuleAction,
    SqlRuleFilter,
    TrueRuleFilter,
)
from oncebus.http.atom import Description, RuleView

XSI_TYPE = "{http://www.w3.org/2001/XMLSchema-instance}type"
XSD_NS = "http://www.w3.org/2001/XMLSchema"
COMPATIBILITY_LEVEL = "20"
INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)

# CorrelationFilter elements, in the order the SDK writes them -> core field
_CORRELATION = tuple((name, field) for field, name in CORRELATION_NAMES.items())
_FILTER_TYPES = "SqlFilter, TrueFilter, FalseFilter or CorrelationFilter"


class RuleBook(Protocol):
    def list_rules(self, topic: str, subscription: str) -> list[RuleView]: ...

    def get_rule(self, topic: str, subscription: str, name: str) -> RuleView: ...

    async def put_rule(
        self, topic: str, subscription: str, name: str, description: Description, *, update: bool
    ) -> RuleView: ...

    async def delete_rule(self, topic: str, subscription: str, name: str) -> None: ...

    def default_rule(self, element: Element | None) -> RuleProperties | None:
        """The rule a new subscription starts with, from its ``DefaultRuleDescription`` (None: ``$Default``)."""


class NamespaceRules:
    """The rules of the Namespace's subscriptions, as the administration API shows and changes them."""

    def __init__(self, namespace: Administration) -> None:
        self.namespace = namespace

    def list_rules(self, topic: str, subscription: str) -> list[RuleView]:
        return [rule_view(r) for r in self.namespace.list_rules(topic, subscription)]

    def get_rule(self, topic: str, subscription: str, name: str) -> RuleView:
        return rule_view(self.namespace.get_rule(topic, subscription, name))

    async def put_rule(
        self, topic: str, subscription: str, name: str, description: Description, *, update: bool
    ) -> RuleView:
        self.namespace.get_subscription(topic, subscription)  # 404 before a 400 about the body
        rule = rule_from_xml(name, description.element)
        if update:
            stored = await self.namespace.update_rule(topic, subscription, rule)
        else:
            stored = await self.namespace.create_rule(topic, subscription, rule)
        return rule_view(stored)

    async def delete_rule(self, topic: str, subscription: str, name: str) -> None:
        await self.namespace.delete_rule(topic, subscription, name)

    def default_rule(self, element: Element | None) -> RuleProperties | None:
        if element is None:
            return None
        name_element = _child(element, "Name")
        name = (name_element.text or "").strip() if name_element is not None else ""
        return rule_from_xml(name or DEFAULT_RULE_NAME, element)


# ----------------------------------------------------------------------------------------- reading
def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _child(element: Element, name: str) -> Element | None:
    for child in element:
        if _local(child.tag) == name:
            return child
    return None


def _type_of(element: Element) -> str:
    value = element.get(XSI_TYPE, "")
    return value.rsplit(":", 1)[-1]


def rule_from_xml(name: str, description: Element) -> RuleProperties:
    """The rule a ``RuleDescription`` (or ``DefaultRuleDescription``) element declares, validated by core."""
    known = {"Filter", "Action", "Name", "CreatedAt"}
    for child in description:
        if _local(child.tag) not in known:
            raise InvalidArgumentError(
                f"unknown RuleDescription element {_local(child.tag)}; known: {', '.join(sorted(known))}"
            )
    filter_element = _child(description, "Filter")
    action_element = _child(description, "Action")
    where = f"rule {name!r}"
    try:
        rule_filter = TrueRuleFilter() if filter_element is None else _filter(filter_element, where)
        action = None if action_element is None else _action(action_element, where)
        return RuleProperties(name, rule_filter, action)
    except InvalidArgumentError as exc:
        raise named(where, exc) from None


def _sql_text(element: Element, what: str) -> str:
    expression = _child(element, "SqlExpression")
    if expression is None:
        raise InvalidArgumentError(f"the {what} has no SqlExpression")
    return expression.text or ""


def _filter(element: Element, where: str) -> RuleFilter:
    kind = _type_of(element)
    if kind == "TrueFilter":
        return TrueRuleFilter()
    if kind == "FalseFilter":
        return FalseRuleFilter()
    if kind == "SqlFilter":
        parameters = _key_values(_child(element, "Parameters"), "SqlFilter parameter")
        return SqlRuleFilter(_sql_text(element, "SqlFilter"), parameters)
    if kind == "CorrelationFilter":
        fields: dict[str, Any] = {}
        for xml_name, field in _CORRELATION:
            child = _child(element, xml_name)
            if child is not None and child.text is not None:
                fields[field] = child.text
        properties = _key_values(_child(element, "Properties"), "CorrelationFilter property")
        return CorrelationRuleFilter(**fields, properties=properties)
    shown = element.get(XSI_TYPE)
    raise InvalidArgumentError(
        f"the Filter's type {shown!r} is not supported; use {_FILTER_TYPES}"
        if shown
        else f"the Filter has no i:type; give one of {_FILTER_TYPES}"
    )


def _action(element: Element, where: str) -> SqlRuleAction | None:
    kind = _type_of(element)
    if kind in ("EmptyRuleAction", "") and _child(element, "SqlExpression") is None:
        return None
    if kind == "SqlRuleAction":
        text = _sql_text(element, "SqlRuleAction")
        parameters = _key_values(_child(element, "Parameters"), "SqlRuleAction parameter")
        return SqlRuleAction(text, parameters) if text.strip() or parameters else None
    raise InvalidArgumentError(
        f"the Action's type {element.get(XSI_TYPE)!r} is not supported; use SqlRuleAction or EmptyRuleAction"
    )


def _key_values(element: Element | None, what: str) -> dict[str, Any]:
    """``<KeyValueOfstringanyType><Key/><Value i:type="d6p1:int"/></...>`` items as a dict of typed values."""
    out: dict[str, Any] = {}
    if element is None:
        return out
    for item in element:
        if _local(item.tag) not in ("KeyValueOfstringanyType", "KeyValueOfObjectType"):
            raise InvalidArgumentError(f"{what}s hold KeyValueOfstringanyType items, not {_local(item.tag)}")
        key_element, value_element = _child(item, "Key"), _child(item, "Value")
        if key_element is None or not key_element.text:
            raise InvalidArgumentError(f"a {what} has no Key")
        key = key_element.text
        if value_element is None:
            raise InvalidArgumentError(f"{what} {key!r} has no Value")
        if key in out:
            raise InvalidArgumentError(f"{what} {key!r} is given twice")
        out[key] = _value(value_element, f"{what} {key!r}")
    return out


def _value(element: Element, where: str) -> Any:
    kind = _type_of(element) or "string"
    text = element.text or ""
    try:
        if kind == "string":
            return text
        if kind in ("int", "long", "short", "byte", "unsignedInt", "unsignedShort", "unsignedByte"):
            return int(text.strip())
        if kind in ("double", "float"):
            return float(text.strip())
        if kind == "decimal":
            return Decimal(text.strip())
        if kind == "boolean":
            lowered = text.strip().lower()
            if lowered not in ("true", "false"):
                raise ValueError(text)
            return lowered == "true"
        if kind == "dateTime":
            return datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        if kind == "duration":
            return parse_duration(text.strip(), name=where)
    except (ValueError, InvalidOperation):
        raise InvalidArgumentError(f"{where}: {text!r} is not a valid {kind}") from None
    raise InvalidArgumentError(
        f"{where}: the type {kind!r} is not supported; use string, int, long, double, decimal, boolean, "
        "dateTime or duration"
    )


# ----------------------------------------------------------------------------------------- writing
def _value_xml(value: Any) -> tuple[str, str]:
    if isinstance(value, bool):
        return "boolean", "true" if value else "false"
    if isinstance(value, int):
        return ("int" if INT32_MIN <= value <= INT32_MAX else "long"), str(value)
    if isinstance(value, float):
        return "double", repr(value)
    if isinstance(value, Decimal):
        return "decimal", str(value)
    if isinstance(value, datetime):
        return "dateTime", value.isoformat()
    if isinstance(value, timedelta):
        return "duration", format_duration(value)
    return "string", str(value)


def _key_values_xml(tag: str, values: dict[str, Any]) -> str:
    if not values:
        return ""
    items = []
    for key, value in values.items():
        kind, text = _value_xml(value)
        items.append(
            f"<KeyValueOfstringanyType><Key>{escape(key)}</Key>"
            f'<Value i:type="d6p1:{kind}" xmlns:d6p1="{XSD_NS}">{escape(text)}</Value>'
            "</KeyValueOfstringanyType>"
        )
    return f"<{tag}>{''.join(items)}</{tag}>"


def _sql_xml(kind: str, expression: str, parameters: dict[str, Any], tag: str) -> str:
    return (
        f'<{tag} i:type="{kind}"><SqlExpression>{escape(expression)}</SqlExpression>'
        f"<CompatibilityLevel>{COMPATIBILITY_LEVEL}</CompatibilityLevel>"
        f"{_key_values_xml('Parameters', parameters)}</{tag}>"
    )


def filter_xml(rule_filter: RuleFilter) -> str:
    if isinstance(rule_filter, TrueRuleFilter):
        return _sql_xml("TrueFilter", "1=1", {}, "Filter")
    if isinstance(rule_filter, FalseRuleFilter):
        return _sql_xml("FalseFilter", "1=0", {}, "Filter")
    if isinstance(rule_filter, SqlRuleFilter):
        return _sql_xml("SqlFilter", rule_filter.sql_expression, rule_filter.parameters, "Filter")
    fields = "".join(
        f"<{xml_name}>{escape(value)}</{xml_name}>"
        for xml_name, field in _CORRELATION
        if (value := getattr(rule_filter, field)) is not None
    )
    properties = _key_values_xml("Properties", rule_filter.properties)
    return f'<Filter i:type="CorrelationFilter">{fields}{properties}</Filter>'


def action_xml(action: SqlRuleAction | None) -> str:
    if action is None:
        return '<Action i:type="EmptyRuleAction"/>'
    return _sql_xml("SqlRuleAction", action.sql_expression, action.parameters, "Action")


def rule_view(rule: RuleProperties) -> RuleView:
    created = rule.created_at_utc if rule.created_at_utc is not None else UNKNOWN_TIME
    return RuleView(rule.name, filter_xml(rule.filter), action_xml(rule.action), created)
