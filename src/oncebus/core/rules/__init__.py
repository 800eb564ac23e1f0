"""Subscription rules as Service Bus evaluates them: SQL and correlation filters, SQL actions.

Pure: no I/O, no clock. A rule is validated and compiled when it is built;
evaluating it against a message never parses anything::

    rules = RuleSet([RuleProperties("red", SqlRuleFilter("color = 'red'"), SqlRuleAction("SET sys.To = 'x'"))])
    outcome = rules.evaluate(MessageView.of(message))   # outcome.deliveries: the copies to enqueue
"""

from __future__ import annotations

from oncebus.core.errors import SqlExpressionError
from oncebus.core.rules._emulator import rules_from_emulator_config
from oncebus.core.rules._evaluate import (
    RULE_NAME_PROPERTY,
    RuleDelivery,
    RuleFailure,
    RuleSet,
    RulesOutcome,
    evaluate_rules,
)
from oncebus.core.rules._model import (
    DEFAULT_RULE_NAME,
    MAX_ACTION_STATEMENTS,
    MAX_RULE_NAME_LENGTH,
    MAX_SQL_EXPRESSION_LENGTH,
    CorrelationRuleFilter,
    FalseRuleFilter,
    RuleFilter,
    RuleProperties,
    SqlRuleAction,
    SqlRuleFilter,
    TrueRuleFilter,
    action_from_dict,
    decode_value,
    default_rule,
    encode_value,
    filter_from_dict,
    validate_rule_name,
)
from oncebus.core.rules._values import EvaluationError
from oncebus.core.rules._view import SYSTEM_PROPERTIES, MessageView, SystemProperty

__all__ = [
    "DEFAULT_RULE_NAME",
    "MAX_ACTION_STATEMENTS",
    "MAX_RULE_NAME_LENGTH",
    "MAX_SQL_EXPRESSION_LENGTH",
    "RULE_NAME_PROPERTY",
    "SYSTEM_PROPERTIES",
    "CorrelationRuleFilter",
    "EvaluationError",
    "FalseRuleFilter",
    "MessageView",
    "RuleDelivery",
    "RuleFailure",
    "RuleFilter",
    "RuleProperties",
    "RuleSet",
    "RulesOutcome",
    "SqlExpressionError",
    "SqlRuleAction",
    "SqlRuleFilter",
    "SystemProperty",
    "TrueRuleFilter",
    "action_from_dict",
    "decode_value",
    "default_rule",
    "encode_value",
    "evaluate_rules",
    "filter_from_dict",
    "rules_from_emulator_config",
    "validate_rule_name",
]
