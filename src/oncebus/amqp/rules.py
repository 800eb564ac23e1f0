"""Subscription rules as the ``$management`` rule operations carry them: AMQP maps <-> core rules.

``com.microsoft:add-rule`` carries a ``rule-description`` map (what the .NET and JavaScript SDKs' rule managers
write)::

    {"sql-filter": {"expression": "color = 'red'"}            # or
     "correlation-filter": {"correlation-id": .., "message-id": .., "to": .., "reply-to": .., "label": ..,
                            "session-id": .., "reply-to-session-id": .., "content-type": .., "properties": {..}},
     "sql-rule-action": {"expression": "SET x = 1"} | null,
     "rule-name": ..}                                          # .NET repeats the name here

``com.microsoft:enumerate-rules`` answers each rule as the described list ``com.microsoft:rule-description:list``
(0x0000013700000004): ``[filter, action, name, created-at]``, the filter one of ``sql-filter:list``
(0x000001370000006), ``true-filter:list`` (..7), ``false-filter:list`` (..8), ``correlation-filter:list`` (..9),
the action ``empty-rule-action:list`` (0x0000013700000005) or ``sql-rule-action:list`` (..6).

The rule is built by core (``oncebus.core.rules``), which validates it (names, SQL compiled, values): the same
validation as the administration API's and the CLI's, so a rule refused there is refused here with the same words.
"""

from __future__ import annotations

import datetime
from decimal import Decimal
from typing import Any

import proton

from oncebus.core.errors import InvalidArgumentError, named
from oncebus.core.rules import (
    CorrelationRuleFilter,
    FalseRuleFilter,
    RuleFilter,
    RuleProperties,
    SqlRuleAction,
    SqlRuleFilter,
    TrueRuleFilter,
)
from oncebus.core.timeutil import datetime_to_us, us_to_datetime

RULE_DESCRIPTION = proton.ulong(0x0000013700000004)
SQL_FILTER = proton.ulong(0x000001370000006)
TRUE_FILTER = proton.ulong(0x000001370000007)
FALSE_FILTER = proton.ulong(0x000001370000008)
CORRELATION_FILTER = proton.ulong(0x000001370000009)
EMPTY_RULE_ACTION = proton.ulong(0x0000013700000005)
SQL_RULE_ACTION = proton.ulong(0x0000013700000006)
COMPATIBILITY_LEVEL = proton.int32(20)

# .NET's encodings of values AMQP has no type for (its AmqpMessageConstants)
TIMESPAN = "com.microsoft:timespan"  # ticks (100 ns)
DATETIME_OFFSET = "com.microsoft:datetime-offset"  # UTC ticks since 0001-01-01
_TICKS_AT_EPOCH = 621_355_968_000_000_000

# correlation-filter keys, in the order of the described list, -> core field
CORRELATION_FIELDS = (
    ("correlation-id", "correlation_id"),
    ("message-id", "message_id"),
    ("to", "to"),
    ("reply-to", "reply_to"),
    ("label", "label"),
    ("session-id", "session_id"),
    ("reply-to-session-id", "reply_to_session_id"),
    ("content-type", "content_type"),
)
_DESCRIPTION_KEYS = ("sql-filter", "correlation-filter", "sql-rule-action", "rule-name")
_SQL_KEYS = ("expression", "parameters", "compatibility-level")


# ----------------------------------------------------------------------------------------- reading
def _map(value: Any, what: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"{what} must be a map, got {type(value).__name__}")
    out = {str(key): item for key, item in value.items()}
    unknown = sorted(set(out) - set(allowed))
    if unknown:
        shown = ", ".join(map(repr, unknown))
        raise InvalidArgumentError(f"{what} has no key {shown}; its keys are {', '.join(allowed)}")
    return out


def _string(value: Any, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{what} must be a string, got {value!r}")
    return str(value)


def value_from_amqp(value: Any) -> Any:
    """A filter property or parameter value as core holds it (core refuses the types Service Bus rules cannot hold)."""
    if isinstance(value, proton.timestamp):
        return us_to_datetime(int(value) * 1000)
    if isinstance(value, bool | datetime.datetime):
        return value
    if isinstance(value, proton.char | proton.symbol | str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, proton.Described) and isinstance(value.descriptor, str) and isinstance(value.value, int):
        if str(value.descriptor) == TIMESPAN:
            return datetime.timedelta(microseconds=int(value.value) // 10)
        if str(value.descriptor) == DATETIME_OFFSET:
            return us_to_datetime((int(value.value) - _TICKS_AT_EPOCH) // 10)
    return value


def _values(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"{what} must be a map, got {type(value).__name__}")
    return {str(key): value_from_amqp(item) for key, item in value.items()}


def _sql(value: Any, what: str) -> tuple[str, dict[str, Any]]:
    sql = _map(value, what, _SQL_KEYS)
    expression = _string(sql.get("expression"), f"the {what}'s expression")
    if expression is None:
        raise InvalidArgumentError(f"the {what} has no expression")
    return expression, _values(sql.get("parameters"), f"the {what}'s parameters")


def _filter(description: dict[str, Any]) -> RuleFilter:
    sql, correlation = description.get("sql-filter"), description.get("correlation-filter")
    if sql is not None and correlation is not None:
        raise InvalidArgumentError("a rule-description holds sql-filter or correlation-filter, not both")
    if sql is not None:
        return SqlRuleFilter(*_sql(sql, "sql-filter"))
    if correlation is not None:
        allowed = (*(key for key, _ in CORRELATION_FIELDS), "properties")
        fields = _map(correlation, "correlation-filter", allowed)
        given = {
            field: text
            for key, field in CORRELATION_FIELDS
            if (text := _string(fields.get(key), f"correlation-filter {key}")) is not None
        }
        properties = _values(fields.get("properties"), "the correlation-filter's properties")
        return CorrelationRuleFilter(**given, properties=properties)
    raise InvalidArgumentError("the rule-description has neither sql-filter nor correlation-filter; give one")


def rule_from_amqp(name: str | None, description: Any) -> RuleProperties:
    """The rule an ``add-rule`` request declares (``rule-name`` and ``rule-description``), validated by core."""
    where = f"rule {name!r}"
    try:
        fields = _map(description, "the rule-description", _DESCRIPTION_KEYS)
        repeated = _string(fields.get("rule-name"), "the rule-description's rule-name")
        if repeated is not None and name is not None and repeated.lower() != name.lower():
            raise InvalidArgumentError(f"the rule-description names rule {repeated!r}, the request {name!r}")
        action_map = fields.get("sql-rule-action")
        action = None if action_map is None else SqlRuleAction(*_sql(action_map, "sql-rule-action"))
        return RuleProperties(name, _filter(fields), action)  # type: ignore[arg-type]  # core checks the name
    except InvalidArgumentError as exc:
        raise named(where, exc) from None


# ----------------------------------------------------------------------------------------- writing
def value_to_amqp(value: Any) -> Any:
    if isinstance(value, datetime.datetime):
        return proton.timestamp(datetime_to_us(value) // 1000)
    if isinstance(value, datetime.timedelta):
        ticks = (value.days * 86_400_000_000 + value.seconds * 1_000_000 + value.microseconds) * 10
        return proton.Described(proton.symbol(TIMESPAN), ticks)  # a Python int is an AMQP long
    if isinstance(value, Decimal):
        return float(value)  # AMQP's decimal128 is not what the SDKs read; a double is
    return value


def _sql_list(code: proton.ulong, expression: str) -> proton.Described:
    return proton.Described(code, [expression, COMPATIBILITY_LEVEL])


def filter_to_amqp(rule_filter: RuleFilter) -> proton.Described:
    if isinstance(rule_filter, TrueRuleFilter):
        return _sql_list(TRUE_FILTER, rule_filter.sql_expression)
    if isinstance(rule_filter, FalseRuleFilter):
        return _sql_list(FALSE_FILTER, rule_filter.sql_expression)
    if isinstance(rule_filter, SqlRuleFilter):
        return _sql_list(SQL_FILTER, rule_filter.sql_expression)
    fields: list[Any] = [getattr(rule_filter, field) for _, field in CORRELATION_FIELDS]
    fields.append({key: value_to_amqp(value) for key, value in rule_filter.properties.items()})
    return proton.Described(CORRELATION_FILTER, fields)


def rule_to_amqp(rule: RuleProperties) -> proton.Described:
    """The ``rule-description`` an ``enumerate-rules`` answer holds for ``rule``."""
    action = (
        proton.Described(EMPTY_RULE_ACTION, [])
        if rule.action is None
        else _sql_list(SQL_RULE_ACTION, rule.action.sql_expression)
    )
    created = None if rule.created_at_utc is None else proton.timestamp(datetime_to_us(rule.created_at_utc) // 1000)
    return proton.Described(RULE_DESCRIPTION, [filter_to_amqp(rule.filter), action, rule.name, created])
