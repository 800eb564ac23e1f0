"""Rules as values: filters, actions and the rule that holds them, named as in azure-servicebus.

``SqlRuleFilter``, ``TrueRuleFilter``, ``FalseRuleFilter``,
``CorrelationRuleFilter``, ``SqlRuleAction`` and ``RuleProperties`` have the
fields of the classes of the same names in ``azure.servicebus.management``,
so the administration API maps one to the other field by field. Each is
validated (and a SQL text compiled) when it is built: an invalid rule never
exists, so nothing invalid is ever stored. ``to_dict``/``from_dict`` give a
JSON-safe form for the store and for scenario files.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import InitVar, dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, ClassVar

from oncebus.core.durations import format_duration, parse_duration
from oncebus.core.errors import InvalidArgumentError
from oncebus.core.properties import CORRELATION_NAMES
from oncebus.core.rules import _values as V
from oncebus.core.rules._compiler import compile_action, compile_filter
from oncebus.core.rules._statements import Statement
from oncebus.core.rules._view import MessageView

MAX_SQL_EXPRESSION_LENGTH = 1024  # Service Bus quota: filter condition and action strings
MAX_ACTION_STATEMENTS = 32  # Service Bus quota: expressions per rule action
MAX_RULE_NAME_LENGTH = 50  # Service Bus quota: subscription rule names
DEFAULT_RULE_NAME = "$Default"

_VALUE_TYPES = (str, bool, int, float, Decimal, datetime, timedelta)
_VALUE_TYPE_NAMES = "string, integer, double, boolean, datetime or timespan"


def _check_value(value: Any, where: str) -> Any:
    if value is None or not isinstance(value, _VALUE_TYPES):
        raise InvalidArgumentError(f"{where}: {value!r} is not a {_VALUE_TYPE_NAMES}")
    return value


def _check_values(values: Mapping[str, Any] | None, where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in (values or {}).items():
        if not isinstance(key, str) or not key.strip():
            raise InvalidArgumentError(f"{where}: a name must be a non-empty string, got {key!r}")
        out[key] = _check_value(value, f"{where} {key!r}")
    return out


def _check_sql(text: Any, what: str) -> str:
    if not isinstance(text, str):
        raise InvalidArgumentError(f"the {what} expression must be a string, got {type(text).__name__}")
    if len(text) > MAX_SQL_EXPRESSION_LENGTH:
        raise InvalidArgumentError(
            f"the {what} expression is {len(text)} characters; Service Bus allows at most {MAX_SQL_EXPRESSION_LENGTH}"
        )
    return text


# ---------------------------------------------------------------- filters


@dataclass(frozen=True)
class SqlRuleFilter:
    """A SQL filter (``color = 'red' AND sys.Label LIKE 'order%'``), compiled once when built.

    ``parameters`` gives the values of ``@name`` placeholders (keys with or
    without the ``@``). Raises :class:`~oncebus.core.errors.SqlExpressionError`
    with the line, column and what was expected when the text is not valid.
    """

    sql_expression: str
    parameters: dict[str, Any] = field(default_factory=dict)
    _match: Callable[[MessageView], bool | None] = field(init=False, repr=False, compare=False)

    kind: ClassVar[str] = "sql"

    def __post_init__(self) -> None:
        _check_sql(self.sql_expression, "SQL filter")
        parameters = _check_values(self.parameters, "SQL filter parameter")
        object.__setattr__(self, "parameters", parameters)
        object.__setattr__(self, "_match", compile_filter(self.sql_expression, parameters))

    def matches(self, view: MessageView) -> bool:
        """Whether the message matches: unknown (a missing property, mismatched types) does not.

        Raises :class:`~oncebus.core.rules.EvaluationError` for what throws in
        Service Bus (integer division by zero and the like).
        """
        return self._match(view) is True

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.kind}
        if self.kind == "sql":
            out["sql_expression"] = self.sql_expression
            if self.parameters:
                out["parameters"] = {k: encode_value(v) for k, v in self.parameters.items()}
        return out


class TrueRuleFilter(SqlRuleFilter):
    """Matches every message (``1=1``); the filter of the ``$Default`` rule."""

    kind: ClassVar[str] = "true"

    def __init__(self) -> None:
        super().__init__("1=1")

    def matches(self, view: MessageView) -> bool:
        return True


class FalseRuleFilter(SqlRuleFilter):
    """Matches no message (``1=0``)."""

    kind: ClassVar[str] = "false"

    def __init__(self) -> None:
        super().__init__("1=0")

    def matches(self, view: MessageView) -> bool:
        return False


_CORRELATION_SYSTEM = {field: name.lower() for field, name in CORRELATION_NAMES.items()}  # -> MessageView.system key


@dataclass(frozen=True, kw_only=True)
class CorrelationRuleFilter:
    """Matches when every given field equals the message's (strings case-sensitive), properties included.

    ``label`` is the message's subject (``subject=`` is accepted too). A user
    property given here matches the message's property of the same name
    (case-insensitive name) whose value is equal as the SQL ``=`` is: a
    number to a number, a string to a string; ``2`` never equals ``'2'``.
    """

    correlation_id: str | None = None
    message_id: str | None = None
    to: str | None = None
    reply_to: str | None = None
    label: str | None = None
    session_id: str | None = None
    reply_to_session_id: str | None = None
    content_type: str | None = None
    properties: dict[str, Any] = field(default_factory=dict)
    subject: InitVar[str | None] = None
    _system: tuple[tuple[str, str], ...] = field(init=False, repr=False, compare=False)
    _user: tuple[tuple[str, Any], ...] = field(init=False, repr=False, compare=False)

    kind: ClassVar[str] = "correlation"

    def __post_init__(self, subject: str | None) -> None:
        if subject is not None:
            if self.label is not None and self.label != subject:
                raise InvalidArgumentError("a correlation filter's label and subject are one field; they differ")
            object.__setattr__(self, "label", subject)
        system = []
        for name, key in _CORRELATION_SYSTEM.items():
            value = getattr(self, name)
            if value is not None:
                if not isinstance(value, str):
                    raise InvalidArgumentError(f"correlation filter {name}: {value!r} is not a string")
                system.append((key, value))
        properties = _check_values(self.properties, "correlation filter property")
        object.__setattr__(self, "properties", properties)
        if not system and not properties:
            raise InvalidArgumentError(
                "a correlation filter needs at least one of: "
                + ", ".join(_CORRELATION_SYSTEM)
                + " or properties (an empty one would match nothing or everything)"
            )
        object.__setattr__(self, "_system", tuple(system))
        object.__setattr__(self, "_user", tuple((k.lower(), v) for k, v in properties.items()))

    def matches(self, view: MessageView) -> bool:
        system, user = view.system, view.user
        for key, wanted in self._system:
            if system.get(key) != wanted:
                return False
        for key, wanted in self._user:
            value = user.get(key)
            if type(value) is type(wanted) and type(value) in (str, int):
                if value != wanted:
                    return False
            elif V.equals(value, wanted) is not True:
                return False
        return True

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.kind}
        for name in _CORRELATION_SYSTEM:
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.properties:
            out["properties"] = {k: encode_value(v) for k, v in self.properties.items()}
        return out


RuleFilter = SqlRuleFilter | CorrelationRuleFilter

# ---------------------------------------------------------------- action


@dataclass(frozen=True)
class SqlRuleAction:
    """``SET`` and ``REMOVE`` statements applied to the copy a matching rule delivers.

    ``SET user.p = expr`` creates or replaces an application property (keeping
    the existing property's numeric type where C# converts implicitly);
    ``SET sys.To = 'x'`` changes a settable system property; ``REMOVE p``
    removes one. Statements run in order, each seeing the previous ones' work.
    """

    sql_expression: str
    parameters: dict[str, Any] = field(default_factory=dict)
    _statements: tuple[Statement, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_sql(self.sql_expression, "SQL action")
        parameters = _check_values(self.parameters, "SQL action parameter")
        object.__setattr__(self, "parameters", parameters)
        statements = compile_action(self.sql_expression, parameters, MAX_ACTION_STATEMENTS)
        object.__setattr__(self, "_statements", tuple(statements))

    def apply(self, view: MessageView) -> MessageView:
        """A changed copy of ``view``; raises EvaluationError where Service Bus's action would fail."""
        work = view.copy()
        for statement in self._statements:
            statement.apply(work)
        return work

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"sql_expression": self.sql_expression}
        if self.parameters:
            out["parameters"] = {k: encode_value(v) for k, v in self.parameters.items()}
        return out


# ---------------------------------------------------------------- rule


def validate_rule_name(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(f"a rule name must be a non-empty string, got {name!r}")
    if len(name) > MAX_RULE_NAME_LENGTH:
        raise InvalidArgumentError(
            f"the rule name {name[:20]!r}... is {len(name)} characters; Service Bus allows at most "
            f"{MAX_RULE_NAME_LENGTH}"
        )
    bad = sorted({c for c in name if c in "/\\?#" or not c.isprintable()})
    if bad:
        raise InvalidArgumentError(
            f"the rule name {name!r} contains {''.join(bad)!r}; '/', '\\', '?' and '#' are not allowed"
        )
    return name


@dataclass(frozen=True)
class RuleProperties:
    """One subscription rule: a name, a filter and an optional action (azure-servicebus ``RuleProperties``)."""

    name: str
    filter: RuleFilter = field(default_factory=TrueRuleFilter)
    action: SqlRuleAction | None = None
    created_at_utc: datetime | None = None

    def __post_init__(self) -> None:
        validate_rule_name(self.name)
        if self.filter is None:
            object.__setattr__(self, "filter", TrueRuleFilter())
        if not isinstance(self.filter, SqlRuleFilter | CorrelationRuleFilter):
            raise InvalidArgumentError(
                f"rule {self.name!r}: the filter must be a SqlRuleFilter, CorrelationRuleFilter, TrueRuleFilter or "
                f"FalseRuleFilter, got {type(self.filter).__name__}"
            )
        if self.action is not None and not isinstance(self.action, SqlRuleAction):
            raise InvalidArgumentError(
                f"rule {self.name!r}: the action must be a SqlRuleAction, got {type(self.action).__name__}"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "filter": self.filter.to_dict(),
            "action": None if self.action is None else self.action.to_dict(),
            "created_at_utc": None if self.created_at_utc is None else self.created_at_utc.isoformat(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RuleProperties:
        if not isinstance(data, Mapping) or "name" not in data:
            raise InvalidArgumentError(f"a rule is an object with a name, a filter and an action; got {data!r}")
        name = data["name"]
        created = data.get("created_at_utc")
        action = data.get("action")
        return cls(
            name=name,
            filter=filter_from_dict(data.get("filter") or {"type": "true"}, where=f"rule {name!r}"),
            action=None if action is None else action_from_dict(action, where=f"rule {name!r}"),
            created_at_utc=None if created is None else datetime.fromisoformat(created),
        )


def default_rule() -> RuleProperties:
    """The ``$Default`` rule every new subscription gets: a true filter, no action."""
    return RuleProperties(DEFAULT_RULE_NAME, TrueRuleFilter())


# ---------------------------------------------------------------- JSON-safe forms


def encode_value(value: Any) -> Any:
    """A parameter or property value as JSON: scalars as they are, the others tagged."""
    if isinstance(value, datetime):
        return {"datetime": value.isoformat()}
    if isinstance(value, timedelta):
        return {"timespan": format_duration(value)}
    if isinstance(value, Decimal):
        return {"decimal": str(value)}
    return value


def decode_value(value: Any, where: str = "value") -> Any:
    if isinstance(value, Mapping):
        if set(value) == {"datetime"}:
            return datetime.fromisoformat(value["datetime"])
        if set(value) == {"timespan"}:
            return parse_duration(value["timespan"], name=where)
        if set(value) == {"decimal"}:
            return Decimal(value["decimal"])
        raise InvalidArgumentError(f"{where}: {dict(value)!r} is not a value ({_VALUE_TYPE_NAMES})")
    return value


def _decode_values(values: Any, where: str) -> dict[str, Any]:
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise InvalidArgumentError(f"{where} must be an object of name: value, got {values!r}")
    return {k: decode_value(v, f"{where} {k!r}") for k, v in values.items()}


def filter_from_dict(data: Mapping[str, Any], *, where: str = "rule") -> RuleFilter:
    kind = str(data.get("type", "")).lower()
    if kind == "true":
        return TrueRuleFilter()
    if kind == "false":
        return FalseRuleFilter()
    if kind == "sql":
        return SqlRuleFilter(
            data.get("sql_expression"),  # type: ignore[arg-type]
            _decode_values(data.get("parameters"), f"{where} filter parameters"),
        )
    if kind == "correlation":
        fields = {k: data[k] for k in (*_CORRELATION_SYSTEM, "subject") if data.get(k) is not None}
        unknown = set(data) - {"type", "properties", *_CORRELATION_SYSTEM, "subject"}
        if unknown:
            raise InvalidArgumentError(
                f"{where}: a correlation filter has no field {', '.join(sorted(unknown))}; its fields are "
                + ", ".join(_CORRELATION_SYSTEM)
                + " and properties"
            )
        return CorrelationRuleFilter(
            **fields, properties=_decode_values(data.get("properties"), f"{where} filter properties")
        )
    raise InvalidArgumentError(f"{where}: filter type {data.get('type')!r} is not one of sql, correlation, true, false")


def action_from_dict(data: Mapping[str, Any], *, where: str = "rule") -> SqlRuleAction:
    if not isinstance(data, Mapping) or "sql_expression" not in data:
        raise InvalidArgumentError(f"{where}: an action is an object with a sql_expression, got {data!r}")
    return SqlRuleAction(data["sql_expression"], _decode_values(data.get("parameters"), f"{where} action parameters"))
