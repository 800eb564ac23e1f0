"""The ``Rules`` of a subscription in the official Service Bus emulator's config file.

Each entry is ``{"Name": ..., "Properties": {"FilterType": "Sql" | "Correlation",
"SqlFilter": {"SqlExpression": ...} | "CorrelationFilter": {...},
"Action": {"SqlExpression": ...}}}`` (the emulator's Config-schema.json). A
subscription without ``Rules`` (or with an empty list) gets ``$Default``; one
with rules gets exactly those. Pure: takes the parsed JSON, returns rules or
raises an error naming the entry and what is allowed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from oncebus.core.errors import InvalidArgumentError, named
from oncebus.core.properties import CORRELATION_NAMES, correlation_field
from oncebus.core.rules._evaluate import RuleSet
from oncebus.core.rules._model import (
    CorrelationRuleFilter,
    RuleFilter,
    RuleProperties,
    SqlRuleAction,
    SqlRuleFilter,
    default_rule,
)

_ALLOWED_CORRELATION = ", ".join([*sorted(CORRELATION_NAMES.values()), "Properties"])


def rules_from_emulator_config(entries: Any, *, where: str = "Rules") -> list[RuleProperties]:
    """The rules an emulator-format ``Rules`` list declares (``$Default`` when there are none)."""
    if entries is None or entries == []:
        return [default_rule()]
    if not isinstance(entries, list):
        raise InvalidArgumentError(f"{where} must be a list of rules, got {type(entries).__name__}")
    rules = [_rule(entry, f"{where}[{i}]") for i, entry in enumerate(entries)]
    RuleSet(rules)  # names unique
    return rules


def _rule(entry: Any, where: str) -> RuleProperties:
    if not isinstance(entry, Mapping):
        raise InvalidArgumentError(f"{where} must be an object with Name and Properties")
    _only(entry, {"Name", "Properties"}, where)
    name = entry.get("Name")
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(f"{where}: Name is required (a string)")
    where = f"{where} ({name!r})"
    props = entry.get("Properties")
    if not isinstance(props, Mapping):
        raise InvalidArgumentError(f"{where}: Properties is required (an object with FilterType)")
    _only(props, {"FilterType", "SqlFilter", "CorrelationFilter", "Action"}, where + " Properties")
    filter_type = str(props.get("FilterType", "")).lower()
    rule_filter: RuleFilter
    try:
        if filter_type == "sql":
            if "CorrelationFilter" in props:
                raise InvalidArgumentError(f"{where}: FilterType is Sql but a CorrelationFilter is given")
            sql = props.get("SqlFilter")
            if not isinstance(sql, Mapping) or not isinstance(sql.get("SqlExpression"), str):
                raise InvalidArgumentError(f"{where}: FilterType Sql needs SqlFilter.SqlExpression (a string)")
            _only(sql, {"SqlExpression"}, where + " SqlFilter")
            rule_filter = SqlRuleFilter(sql["SqlExpression"])
        elif filter_type == "correlation":
            if "SqlFilter" in props:
                raise InvalidArgumentError(f"{where}: FilterType is Correlation but a SqlFilter is given")
            rule_filter = _correlation(props.get("CorrelationFilter"), where)
        else:
            raise InvalidArgumentError(
                f"{where}: FilterType must be Sql or Correlation, got {props.get('FilterType')!r}"
            )
        action = None
        if props.get("Action") is not None:
            spec = props["Action"]
            if not isinstance(spec, Mapping) or not isinstance(spec.get("SqlExpression"), str):
                raise InvalidArgumentError(f"{where}: Action needs SqlExpression (a string)")
            _only(spec, {"SqlExpression"}, where + " Action")
            if spec["SqlExpression"].strip():
                action = SqlRuleAction(spec["SqlExpression"])
        return RuleProperties(name, rule_filter, action)
    except InvalidArgumentError as exc:
        raise named(where, exc) from None


def _correlation(spec: Any, where: str) -> CorrelationRuleFilter:
    if not isinstance(spec, Mapping) or not spec:
        raise InvalidArgumentError(
            f"{where}: FilterType Correlation needs a CorrelationFilter with at least one of {_ALLOWED_CORRELATION}"
        )
    fields: dict[str, Any] = {}
    properties: dict[str, Any] = {}
    for key, value in spec.items():
        if key.lower() == "properties":
            if not isinstance(value, Mapping):
                raise InvalidArgumentError(f"{where}: CorrelationFilter.Properties must be an object of name: value")
            properties = dict(value)
            continue
        field = correlation_field(key)
        if field is None:
            raise InvalidArgumentError(
                f"{where}: CorrelationFilter has no field {key!r}; its fields are {_ALLOWED_CORRELATION}"
            )
        fields[field] = value
    return CorrelationRuleFilter(**fields, properties=properties)


def _only(obj: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = [k for k in obj if k not in allowed]
    if unknown:
        raise InvalidArgumentError(
            f"{where}: unknown key {', '.join(map(repr, unknown))}; allowed: {', '.join(sorted(allowed))}"
        )
