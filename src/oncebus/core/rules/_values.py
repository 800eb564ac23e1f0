"""What the operators of a Service Bus SQL filter do with values (C# semantics, three-valued).

A value is a Python object: ``int`` (a .NET ``long``: 64-bit, arithmetic wraps),
``float`` (``double``), ``Decimal`` (``decimal``), ``str``, ``bool``,
``datetime``, ``timedelta``, ``UUID`` or ``bytes``. ``None`` is null *and*
unknown (a missing user property): the filter grammar treats them alike except
in ``IS NULL`` and ``EXISTS``, which look at the property itself.

The rules, from the Service Bus SQL filter reference ("operators follow C#
implicit conversion semantics"; "if either operand is unknown the result is
unknown"):

- Numbers promote as C# does: ``long`` with ``double`` -> ``double``;
  ``long`` with ``decimal`` -> ``decimal``; ``double`` with ``decimal`` has no
  implicit conversion, so the result is unknown.
- Operands of types C# cannot combine (a string compared with a number, a
  bool added to anything, strings ordered with ``<``) give unknown, never an
  error: the message simply does not match.
- Integer (and decimal) division or remainder by zero is an exception in C#;
  here it raises :class:`EvaluationError`, which the rule reports (a
  subscription may dead-letter on filter evaluation exceptions). Double
  division follows IEEE 754 (infinity, NaN), as in C#.
"""

from __future__ import annotations

import decimal
import math
import uuid
from collections.abc import Callable
from datetime import UTC as _UTC
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from oncebus.core.rules._like import PatternError, like_pattern

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

# .NET decimal: 28-29 significant digits; overflow, division by zero and invalid operations throw
_DECIMAL = decimal.Context(
    prec=28, traps=[decimal.DivisionByZero, decimal.InvalidOperation, decimal.Overflow], Emin=-28, Emax=28
)


class EvaluationError(Exception):
    """An operation that throws in Service Bus (not one that is merely unknown)."""


# value kinds
K_NONE, K_INT, K_DOUBLE, K_DECIMAL, K_STRING, K_BOOL, K_DATETIME, K_TIMEDELTA, K_UUID, K_BYTES, K_OTHER = range(11)

_KINDS: dict[type, int] = {
    type(None): K_NONE,
    int: K_INT,
    float: K_DOUBLE,
    Decimal: K_DECIMAL,
    str: K_STRING,
    bool: K_BOOL,
    datetime: K_DATETIME,
    timedelta: K_TIMEDELTA,
    uuid.UUID: K_UUID,
    bytes: K_BYTES,
}
_NUMERIC = (K_INT, K_DOUBLE, K_DECIMAL)


def kind(value: Any) -> int:
    k = _KINDS.get(type(value))
    if k is not None:
        return k
    # subclasses (an IntEnum, a str subclass from a codec): classify by their base
    for base, base_kind in ((bool, K_BOOL), (int, K_INT), (float, K_DOUBLE), (str, K_STRING), (bytes, K_BYTES)):
        if isinstance(value, base):
            return base_kind
    return K_OTHER


def type_name(value: Any) -> str:
    return {
        K_NONE: "null",
        K_INT: "integer",
        K_DOUBLE: "double",
        K_DECIMAL: "decimal",
        K_STRING: "string",
        K_BOOL: "boolean",
        K_DATETIME: "datetime",
        K_TIMEDELTA: "timespan",
        K_UUID: "guid",
        K_BYTES: "binary",
    }.get(kind(value), type(value).__name__)


def wrap64(value: int) -> int:
    """C# unchecked ``long`` arithmetic: wrap into the 64-bit range."""
    if INT64_MIN <= value <= INT64_MAX:
        return value
    return ((value - INT64_MIN) & 0xFFFF_FFFF_FFFF_FFFF) + INT64_MIN


def _promote(a: Any, b: Any) -> tuple[int, Any, Any]:
    """The common numeric kind of a and b and both converted to it; kind K_OTHER if there is none."""
    ka, kb = kind(a), kind(b)
    if ka == kb and ka in _NUMERIC:
        return ka, a, b
    if ka in _NUMERIC and kb in _NUMERIC:
        if K_DECIMAL in (ka, kb):
            if K_DOUBLE in (ka, kb):
                return K_OTHER, a, b  # C#: no implicit conversion between double and decimal
            return K_DECIMAL, Decimal(a), Decimal(b)
        return K_DOUBLE, float(a), float(b)
    return K_OTHER, a, b


# ---------------------------------------------------------------- comparison


def equals(a: Any, b: Any) -> bool | None:
    """``a = b``: True, False, or None (unknown: a null operand, or types C# cannot compare)."""
    if a is None or b is None:
        return None
    ka, kb = kind(a), kind(b)
    if ka == kb:
        if ka == K_OTHER:
            return None
        if ka == K_DATETIME:
            return _compare_datetimes(a, b, "=")
        return bool(a == b)
    k, x, y = _promote(a, b)
    if k == K_OTHER:
        return None
    return bool(x == y)


def _utc(value: datetime) -> datetime:
    """A naive datetime is taken as UTC (AMQP timestamps and Service Bus times are UTC)."""
    return value if value.tzinfo is not None else value.replace(tzinfo=_UTC)


def _compare_datetimes(a: datetime, b: datetime, op: str) -> bool | None:
    if (a.tzinfo is None) != (b.tzinfo is None):
        a, b = _utc(a), _utc(b)
    return ORDER[op](a, b)


ORDER: dict[str, Callable[[Any, Any], bool]] = {
    "=": lambda x, y: bool(x == y),
    "<>": lambda x, y: bool(x != y),
    "<": lambda x, y: bool(x < y),
    "<=": lambda x, y: bool(x <= y),
    ">": lambda x, y: bool(x > y),
    ">=": lambda x, y: bool(x >= y),
}
ORDERED_KINDS = (K_DATETIME, K_TIMEDELTA)


def compare(op: str, a: Any, b: Any) -> bool | None:
    """``a op b`` for op in ``= <> != < <= > >=``."""
    if op == "=":
        return equals(a, b)
    if op in ("<>", "!="):
        same = equals(a, b)
        return None if same is None else not same
    if a is None or b is None:
        return None
    ka, kb = kind(a), kind(b)
    if ka == kb and ka in ORDERED_KINDS:
        if ka == K_DATETIME:
            return _compare_datetimes(a, b, op)
        return ORDER[op](a, b)
    k, x, y = _promote(a, b)
    if k == K_OTHER:
        return None  # strings, booleans, guids: C# has no ordering operators for them
    return ORDER[op](x, y)


# ---------------------------------------------------------------- arithmetic


def _int_div(a: int, b: int) -> int:
    if b == 0:
        raise EvaluationError("integer division by zero")
    if a == INT64_MIN and b == -1:
        raise EvaluationError("integer overflow in division")
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q  # C# truncates toward zero


def _int_rem(a: int, b: int) -> int:
    if b == 0:
        raise EvaluationError("integer remainder by zero")
    if a == INT64_MIN and b == -1:
        raise EvaluationError("integer overflow in remainder")  # C# throws here as it does for the division
    r = abs(a) % abs(b)
    return -r if a < 0 else r  # C#: the remainder takes the dividend's sign


def _double_div(a: float, b: float) -> float:
    if b == 0.0:
        if a == 0.0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def _double_rem(a: float, b: float) -> float:
    if b == 0.0 or math.isinf(a) or math.isnan(a) or math.isnan(b):
        return math.nan
    if math.isinf(b):
        return a
    return math.fmod(a, b)


def _decimal_op(op: str, a: Decimal, b: Decimal) -> Decimal:
    try:
        if op == "+":
            return _DECIMAL.add(a, b)
        if op == "-":
            return _DECIMAL.subtract(a, b)
        if op == "*":
            return _DECIMAL.multiply(a, b)
        if op == "/":
            return _DECIMAL.divide(a, b)
        return _DECIMAL.remainder(a, b)  # sign of the dividend, as C#
    except decimal.DivisionByZero as exc:
        raise EvaluationError("decimal division by zero") from exc
    except (decimal.Overflow, decimal.InvalidOperation) as exc:
        raise EvaluationError(f"decimal {op} overflowed or is undefined") from exc


def _number_op(op: str, k: int, a: Any, b: Any) -> Any:
    if k == K_INT:
        if op == "+":
            return wrap64(a + b)
        if op == "-":
            return wrap64(a - b)
        if op == "*":
            return wrap64(a * b)
        if op == "/":
            return _int_div(a, b)
        return _int_rem(a, b)
    if k == K_DOUBLE:
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            try:
                return a * b
            except OverflowError:  # pragma: no cover - float multiplication saturates to inf
                return math.inf
        if op == "/":
            return _double_div(a, b)
        return _double_rem(a, b)
    return _decimal_op(op, a, b)


def arithmetic(op: str, a: Any, b: Any) -> Any:
    """``a op b`` for op in ``+ - * / %``; None when unknown or the types do not combine."""
    if a is None or b is None:
        return None
    k, x, y = _promote(a, b)
    if k != K_OTHER:
        return _number_op(op, k, x, y)
    ka, kb = kind(a), kind(b)
    try:
        if op == "+":
            if ka == kb == K_STRING:
                return a + b
            if (ka, kb) in ((K_DATETIME, K_TIMEDELTA), (K_TIMEDELTA, K_DATETIME), (K_TIMEDELTA, K_TIMEDELTA)):
                return a + b
        elif op == "-":
            if (ka, kb) in ((K_DATETIME, K_TIMEDELTA), (K_TIMEDELTA, K_TIMEDELTA)):
                return a - b
            if ka == kb == K_DATETIME:
                return _subtract_datetimes(a, b)
    except OverflowError as exc:
        raise EvaluationError(f"{type_name(a)} {op} {type_name(b)} is out of range") from exc
    return None


def _subtract_datetimes(a: datetime, b: datetime) -> timedelta:
    if (a.tzinfo is None) != (b.tzinfo is None):
        a, b = _utc(a), _utc(b)
    return a - b


def negate(a: Any) -> Any:
    k = kind(a)
    if k == K_INT:
        return wrap64(-a)
    if k in (K_DOUBLE, K_DECIMAL, K_TIMEDELTA):
        return -a
    return None


def plus(a: Any) -> Any:
    return a if kind(a) in (K_INT, K_DOUBLE, K_DECIMAL, K_TIMEDELTA) else None


# ---------------------------------------------------------------- LIKE


def like(value: Any, pattern: Any, escape: Any = None, *, has_escape: bool = False) -> bool | None:
    if value is None or pattern is None or (has_escape and escape is None):
        return None
    if kind(value) != K_STRING or kind(pattern) != K_STRING or (has_escape and kind(escape) != K_STRING):
        return None
    try:
        compiled = like_pattern(pattern, escape if has_escape else None)
    except PatternError as exc:
        raise EvaluationError(str(exc)) from exc
    return compiled.matches(value)


# ---------------------------------------------------------------- three-valued logic


def and3(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    if a is None or b is None:
        return None
    return True


def or3(a: bool | None, b: bool | None) -> bool | None:
    if a is True or b is True:
        return True
    if a is None or b is None:
        return None
    return False


def not3(a: bool | None) -> bool | None:
    return None if a is None else not a


def as_condition(value: Any) -> bool | None:
    """A value used where a condition is expected: a boolean is itself, anything else unknown."""
    return value if type(value) is bool else None
