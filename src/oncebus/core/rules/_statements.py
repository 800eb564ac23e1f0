"""The statements of a SQL rule action, compiled: SET and REMOVE applied to a copy of a message view."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from oncebus.core.rules import _values as V
from oncebus.core.rules._view import SYSTEM_PROPERTIES, MessageView


@dataclass(frozen=True)
class PropertyRef:
    scope: str  # "sys" or "user"
    key: str  # lower-case name: the lookup key in MessageView.system / .user
    name: str  # as written (without brackets or quotes)

    def __str__(self) -> str:
        return f"{self.scope}.{SYSTEM_PROPERTIES[self.key].name if self.scope == 'sys' else self.name}"


@dataclass(frozen=True)
class Statement:
    verb: str  # "set" or "remove"
    target: PropertyRef
    value: Callable[[MessageView], Any] | None
    line: int
    column: int

    def apply(self, work: MessageView) -> None:
        ref = self.target
        if self.verb == "remove":
            if ref.scope == "sys":
                work.set_system(ref.key, None)
            else:
                work.remove_user(ref.name)
            return
        assert self.value is not None
        value = self.value(work)
        if ref.scope == "sys":
            check_system_value(SYSTEM_PROPERTIES[ref.key].name, ref.key, value)
            work.set_system(ref.key, value)
        else:
            work.set_user(ref.name, _implicit(work.user.get(ref.key), value))


def _implicit(existing: Any, value: Any) -> Any:
    """SET converts to the existing property's type when C# converts implicitly (long -> double, decimal)."""
    if type(value) is int:
        if type(existing) is float:
            return float(value)
        if type(existing) is Decimal:
            return Decimal(value)
    return value


def check_system_value(name: str, key: str, value: Any) -> None:
    wanted = SYSTEM_PROPERTIES[key].type
    if value is None:
        if key == "messageid":
            raise V.EvaluationError("sys.MessageId cannot be set to null")
        return
    if wanted is str and type(value) is not str:
        raise V.EvaluationError(f"sys.{name} takes a string, not {V.type_name(value)} {value!r}")
    if wanted is timedelta and type(value) is not timedelta:
        raise V.EvaluationError(f"sys.{name} takes a timespan, not {V.type_name(value)} {value!r}")
    if wanted is datetime and type(value) is not datetime:
        raise V.EvaluationError(f"sys.{name} takes a datetime, not {V.type_name(value)} {value!r}")
    if key == "messageid" and len(value) > 128:
        raise V.EvaluationError("sys.MessageId is at most 128 characters")
