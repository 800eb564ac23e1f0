"""``oncebus rule ...``: a subscription's rules from the command line, through the control protocol.

::

    oncebus rule create TOPIC SUB NAME --sql "color = 'red'" [--action "SET sys.To = 'x'"]
    oncebus rule create TOPIC SUB NAME --correlation label=vip --correlation tier:=3
    oncebus rule list TOPIC SUB
    oncebus rule show TOPIC SUB NAME
    oncebus rule delete TOPIC SUB NAME

A correlation ``KEY=VALUE`` sets a system field when KEY names one
(``correlation_id``, ``message_id``, ``to``, ``reply_to``, ``label``/``subject``,
``session_id``, ``reply_to_session_id``, ``content_type``; PascalCase works too)
and an application property otherwise, with a text value; ``KEY:=JSON`` gives
a property a typed value (``tier:=3``, ``vip:=true``, ``ratio:=0.5``).
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Protocol

from oncebus.core.errors import InvalidArgumentError
from oncebus.core.properties import correlation_field


class Target(Protocol):
    def call(self, op: str, args: dict[str, Any]) -> Any: ...


def add_rule_parser(commands: Any) -> None:
    group = commands.add_parser("rule", help="manage a subscription's rules (filters and actions)").add_subparsers(
        dest="action", required=True
    )
    for action in ("create", "delete", "show", "list"):
        sub = group.add_parser(action)
        sub.set_defaults(kind="rule")
        sub.add_argument("topic")
        sub.add_argument("subscription")
        if action != "list":
            sub.add_argument("name")
        if action == "create":
            how = sub.add_mutually_exclusive_group(required=True)
            how.add_argument("--sql", help="a SQL filter, e.g. \"color = 'red' AND sys.Label LIKE 'order%%'\"")
            how.add_argument(
                "--correlation",
                action="append",
                metavar="KEY=VALUE",
                help="a correlation filter field (repeatable): a system field (label, correlation_id, ...) or an "
                "application property; KEY:=JSON for a typed property value (tier:=3)",
            )
            how.add_argument("--true", action="store_true", help="a true filter (every message)")
            how.add_argument("--false", action="store_true", help="a false filter (no message)")
            sub.add_argument("--action", dest="sql_action", help="a SQL action, e.g. \"SET sys.To = 'x'; REMOVE p\"")
        sub.add_argument("--json", action="store_true", help="print JSON")


def correlation_filter(items: list[str]) -> dict[str, Any]:
    """``--correlation`` items as a correlation filter's dict form (``core.rules.filter_from_dict``)."""
    out: dict[str, Any] = {"type": "correlation"}
    properties: dict[str, Any] = {}
    for item in items:
        at = item.find("=")
        if at < 0:
            raise InvalidArgumentError(f"--correlation {item!r}: use KEY=VALUE (or KEY:=JSON for a typed value)")
        typed = at > 0 and item[at - 1] == ":"
        key = item[: at - 1] if typed else item[:at]
        value: Any = item[at + 1 :]
        if typed:
            try:
                value = json.loads(value)
            except ValueError:
                raise InvalidArgumentError(f"--correlation {item!r}: {item[at + 1 :]!r} is not a JSON value") from None
            if isinstance(value, dict | list) or value is None:
                raise InvalidArgumentError(f"--correlation {item!r}: a property value is a string, number or boolean")
        key = key.strip()
        if not key:
            raise InvalidArgumentError(f"--correlation {item!r}: the key is empty")
        field = correlation_field(key)
        if field is not None and not typed:
            if field in out:
                raise InvalidArgumentError(f"--correlation: {field} is given twice")
            out[field] = value
        else:
            if key in properties:
                raise InvalidArgumentError(f"--correlation: the property {key!r} is given twice")
            properties[key] = value
    if properties:
        out["properties"] = properties
    return out


def _rule(args: argparse.Namespace) -> dict[str, Any]:
    if args.sql is not None:
        rule_filter: dict[str, Any] = {"type": "sql", "sql_expression": args.sql}
    elif args.correlation:
        rule_filter = correlation_filter(args.correlation)
    else:
        rule_filter = {"type": "true" if args.true else "false"}
    action = None if args.sql_action is None else {"sql_expression": args.sql_action}
    return {"name": args.name, "filter": rule_filter, "action": action}


def describe_filter(data: dict[str, Any]) -> str:
    kind = data.get("type")
    if kind == "sql":
        return str(data.get("sql_expression"))
    if kind in ("true", "false"):
        return "TRUE" if kind == "true" else "FALSE"
    parts = [f"{k}={v}" for k, v in data.items() if k not in ("type", "properties")]
    parts += [f"{k}={json.dumps(v)}" for k, v in (data.get("properties") or {}).items()]
    return "correlation " + " ".join(parts)


def rule_command(args: argparse.Namespace, target: Target) -> int:
    where = {"topic": args.topic, "subscription": args.subscription}
    if args.action == "create":
        result = target.call("rule.create", {**where, "rule": _rule(args)})
        _print(args, result, lambda r: print(f"created rule {r['name']}: {_line(r)}"))
    elif args.action == "delete":
        target.call("rule.delete", {**where, "name": args.name})
        print(f"deleted rule {args.name}")
    elif args.action == "show":
        _print(
            args, target.call("rule.show", {**where, "name": args.name}), lambda r: print(f"{r['name']}: {_line(r)}")
        )
    else:
        rows = target.call("rule.list", where)

        def table(rows: list[dict[str, Any]]) -> None:
            if not rows:
                print("(no rules: the subscription receives nothing)")
            for r in rows:
                print(f"{r['name']}: {_line(r)}")

        _print(args, rows, table)
    return 0


def _line(rule: dict[str, Any]) -> str:
    text = f"filter {describe_filter(rule['filter'])}"
    if rule.get("action"):
        text += f"; action {rule['action']['sql_expression']}"
    return text


def _print(args: argparse.Namespace, result: Any, human: Any) -> None:
    if getattr(args, "json", False):
        print(json.dumps(result, indent=2, default=str))
    else:
        human(result)
