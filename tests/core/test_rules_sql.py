"""SQL filters: cases taken from the Service Bus documentation, three-valued logic, types, and parse errors.

Sources: "Subscription Rule SQL Filter Syntax" (service-bus-messaging-sql-filter),
"Set subscription filters" (service-bus-filter-examples) and "Topic filters and
actions" (topic-filters), learn.microsoft.com.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from oncebus.core.errors import InvalidArgumentError, SqlExpressionError
from oncebus.core.messages import Message, StoredMessage
from oncebus.core.rules import EvaluationError, MessageView, SqlRuleFilter

T, F, U = True, False, None
TRUE_SQL, FALSE_SQL, UNKNOWN_SQL = "1=1", "1=0", "missing = 1"


def view(app: dict[str, Any] | None = None, **system: Any) -> MessageView:
    return MessageView(system, app or {})


def result(sql: str, v: MessageView, **parameters: Any) -> bool | None:
    """The filter's three-valued result (matches() folds unknown into False)."""
    return SqlRuleFilter(sql, parameters)._match(v)


# ------------------------------------------------------------------ the documentation's examples

ORDER = {"color": "blue", "quantity": 10, "priority": "low", "StoreId": "Store8", "MessageProperty": 1}

DOC_CASES: list[tuple[str, MessageView, bool]] = [
    # filter on system properties
    ("sys.Label LIKE '%bus%'", view(Label="the bus stop"), True),
    ("sys.Label LIKE '%bus%'", view(Label="train"), False),
    ("sys.label LIKE '%bus%'", view(Subject="omnibus"), True),  # Subject is Label's newer name
    ("sys.messageid = 'xxxx'", view(MessageId="xxxx"), True),
    ("sys.correlationid like 'abc-%'", view(CorrelationId="abc-123"), True),
    ("sys.correlationid like 'abc-%'", view(CorrelationId="abd-123"), False),
    # user properties, with or without user.
    ("MessageProperty = 'A'", view({"MessageProperty": "A"}), True),
    ("user.SuperHero like 'SuperMan%'", view({"SuperHero": "SuperMan Returns"}), True),
    ("user.SuperHero like 'SuperMan%'", view({"SuperHero": "superman"}), False),  # LIKE is case-sensitive
    # special characters in a property name
    (
        "\"http://schemas.microsoft.com/xrm/2011/Claims/EntityLogicalName\" = 'account'",
        view({"http://schemas.microsoft.com/xrm/2011/Claims/EntityLogicalName": "account"}),
        True,
    ),
    ("[Property With Space] = 1", view({"Property With Space": 1}), True),
    ("[HR-EmployeeID] = 'e1'", view({"HR-EmployeeID": "e1"}), True),
    ("[a]]b] = 1", view({"a]b": 1}), True),
    ('"say ""hi""" = 1', view({'say "hi"': 1}), True),
    # numbers
    ("MessageProperty = 1", view(ORDER), True),
    ("MessageProperty > 1", view(ORDER), False),
    ("MessageProperty > 2.08", view({"MessageProperty": 3}), True),
    ("MessageProperty = 1 AND MessageProperty2 = 3", view({"MessageProperty": 1, "MessageProperty2": 3}), True),
    ("MessageProperty = 1 OR MessageProperty2 = 3", view({"MessageProperty": 2, "MessageProperty2": 3}), True),
    # IN and NOT IN
    ("StoreId IN('Store1', 'Store2', 'Store3')", view({"StoreId": "Store2"}), True),
    ("StoreId IN('Store1', 'Store2', 'Store3')", view({"StoreId": "Store4"}), False),
    ("sys.To IN ('Store5','Store6','Store7') OR StoreId = 'Store8'", view(ORDER, To="Store1"), True),
    ("sys.To IN ('Store5','Store6','Store7') OR StoreId = 'Store8'", view({"StoreId": "x"}, To="Store6"), True),
    (
        "sys.To NOT IN ('Store1','Store2','Store3','Store4','Store5','Store6','Store7','Store8') OR "
        "StoreId NOT IN ('Store1','Store2','Store3','Store4','Store5','Store6','Store7','Store8')",
        view({"StoreId": "Store8"}, To="Store1"),
        False,
    ),
    (
        "sys.To NOT IN ('Store1','Store2','Store3','Store4','Store5','Store6','Store7','Store8') OR "
        "StoreId NOT IN ('Store1','Store2','Store3','Store4','Store5','Store6','Store7','Store8')",
        view({"StoreId": "Store9"}, To="Store1"),
        True,
    ),
    ("sys.Label LIKE '%bus%' OR user.tag IN ('queue', 'topic', 'subscription')", view({"tag": "topic"}), True),
    # the .NET sample's subscriptions
    ("color='blue' AND quantity=10", view(ORDER), True),
    ("color='blue' AND quantity=10", view({**ORDER, "quantity": 5}), False),
    ("user.color='red'", view({"color": "red"}), True),
    # LIKE with ESCAPE (the reference's own example)
    ("property LIKE 'ABC\\%' ESCAPE '\\'", view({"property": "ABC%"}), True),
    ("property LIKE 'ABC\\%' ESCAPE '\\'", view({"property": "ABCD"}), False),
    ("property LIKE 'A_C'", view({"property": "ABC"}), True),
    ("property LIKE 'A_C'", view({"property": "ABBC"}), False),
    ("property LIKE 'A!_C' ESCAPE '!'", view({"property": "A_C"}), True),
    ("property LIKE 'A!_C' ESCAPE '!'", view({"property": "ABC"}), False),
    ("property LIKE '%'", view({"property": "line\nbreak"}), True),
    ("property NOT LIKE 'a%'", view({"property": "ba"}), True),
    # IS NULL: missing or null
    ("property IS NULL", view({}), True),
    ("property IS NULL", view({"property": None}), True),
    ("property IS NULL", view({"property": 0}), False),
    ("property IS NOT NULL", view({"property": ""}), True),
    ("sys.ReplyTo IS NULL", view(), True),
    # EXISTS: the property is there, even when null
    ("EXISTS(property)", view({"property": None}), True),
    ("EXISTS(user.property)", view({}), False),
    ("EXISTS(sys.To)", view(To="x"), True),
    # constants of the reference
    ("n = 1894", view({"n": 1894}), True),
    ("n = 1894.1204", view({"n": 1894.1204}), True),
    ("n = 2.0", view({"n": 2}), True),  # long promoted to double
    ("n = 101.5E5", view({"n": 10150000}), True),
    ("n = 0.5E-2", view({"n": 0.005}), True),
    ("flag = TRUE", view({"flag": True}), True),
    ("flag = false", view({"flag": True}), False),
    ("s = 'it''s'", view({"s": "it's"}), True),
    # case-insensitive keywords and property names
    ("COLOR = 'blue' and Quantity = 10 AnD NoT priority = 'high'", view(ORDER), True),
    ("SYS.MESSAGEID = 'm'", view(MessageId="m"), True),
    # functions
    ("property('color') = 'blue'", view(ORDER), True),
    ("p('sys.MessageId') = 'm'", view(MessageId="m"), True),
    ("p(name) = 'blue'", view({**ORDER, "name": "color"}), True),
    ("newid() <> newid()", view(), True),
    # parameters (the SDK's SqlRuleFilter(sql, parameters={"@p": ...}))
]


@pytest.mark.parametrize(("sql", "message", "expected"), DOC_CASES, ids=[c[0][:60] for c in DOC_CASES])
def test_documented_filters(sql: str, message: MessageView, expected: bool) -> None:
    assert SqlRuleFilter(sql).matches(message) is expected


def test_parameters_like_the_sdk() -> None:
    earlier = datetime(2026, 1, 1, tzinfo=UTC)
    later = earlier + timedelta(hours=2)
    v = view({"DateTimeMp": earlier, "DateTimeMp1": earlier, "DateTimeMp2": later, "source": "orders"})
    assert SqlRuleFilter("DateTimeMp < @dtParam", {"@dtParam": later}).matches(v)
    assert not SqlRuleFilter("DateTimeMp > @dtParam", {"@dtParam": later}).matches(v)
    assert SqlRuleFilter("(DateTimeMp2-DateTimeMp1) <= @timespan", {"@timespan": timedelta(hours=2)}).matches(v)
    assert SqlRuleFilter("DateTimeMp2-DateTimeMp1 <= @timespan", {"@timespan": timedelta(hours=1)}).matches(v) is False
    assert SqlRuleFilter("source = @stringParam", {"stringParam": "orders"}).matches(v)  # '@' optional in the key
    assert SqlRuleFilter("source = @P1 AND @p2 = 2", {"@p1": "orders", "@P2": 2}).matches(v)  # case-insensitive


# ------------------------------------------------------------------ unknown: the reference's truth tables

AND_TABLE = {(T, T): T, (T, F): F, (T, U): U, (F, T): F, (F, F): F, (F, U): F, (U, T): U, (U, F): F, (U, U): U}
OR_TABLE = {(T, T): T, (T, F): T, (T, U): T, (F, T): T, (F, F): F, (F, U): U, (U, T): T, (U, F): U, (U, U): U}
SQL_OF = {T: TRUE_SQL, F: FALSE_SQL, U: UNKNOWN_SQL}


@pytest.mark.parametrize(("a", "b"), list(AND_TABLE))
def test_and_or_truth_tables(a: bool | None, b: bool | None) -> None:
    assert result(f"{SQL_OF[a]} AND {SQL_OF[b]}", view()) is AND_TABLE[a, b]
    assert result(f"{SQL_OF[a]} OR {SQL_OF[b]}", view()) is OR_TABLE[a, b]


@pytest.mark.parametrize(
    "sql",
    [
        "missing = 1",
        "missing <> 1",
        "missing + 1 = 1",  # arithmetic with unknown is unknown
        "-missing = 1",
        "1 - missing > 0",
        "missing LIKE 'a%'",  # LIKE with an unknown operand
        "'abc' LIKE missing",
        "'abc' LIKE 'a%' ESCAPE missing",
        "missing IN (1, 2)",  # IN with an unknown left operand
        "missing NOT IN (1, 2)",
        "nullprop = 1",  # a null value behaves as unknown
        "nullprop = NULL",
        "NULL = NULL",
        "missing",  # a missing property where a condition is expected
    ],
)
def test_unknown_propagates_and_does_not_match(sql: str) -> None:
    v = view({"nullprop": None})
    assert result(sql, v) is None
    assert result(f"NOT ({sql})", v) is None
    assert not SqlRuleFilter(sql).matches(v) and not SqlRuleFilter(f"NOT ({sql})").matches(v)


def test_in_list_items_that_are_unknown_do_not_make_it_unknown() -> None:
    # the reference: IN is unknown only when its left operand is
    assert result("1 IN (missing, 1)", view()) is True
    assert result("1 IN (missing, 2)", view()) is False
    assert result("1 NOT IN (missing, 2)", view()) is True


# ------------------------------------------------------------------ types: C# promotion and mismatches


@pytest.mark.parametrize(
    ("sql", "app", "expected"),
    [
        ("i = 2.0", {"i": 2}, T),  # long = double: promoted to double
        ("i / 2 = 1", {"i": 3}, T),  # long / long: integer division
        ("i / 2.0 = 1.5", {"i": 3}, T),  # long / double
        ("-7 / 2 = -3", {}, T),  # truncates toward zero
        ("-7 % 3 = -1", {}, T),  # remainder takes the dividend's sign
        ("7 % -3 = 1", {}, T),
        ("d = 2", {"d": Decimal("2.0")}, T),  # long = decimal: promoted to decimal
        ("d + 1 = 3.5", {"d": Decimal("2.5")}, U),  # decimal with double: no implicit conversion in C#
        ("d * 2 = x", {"d": Decimal("1.5"), "x": Decimal(3)}, T),
        ("f = d", {"f": 1.5, "d": Decimal("1.5")}, U),
        ("s = 1", {"s": "1"}, U),  # a string is never a number
        ("s > 10", {"s": "11"}, U),  # Quantity > 10 on a string property matches nothing
        ("s + 1 = 2", {"s": "1"}, U),
        ("s + 't' = 'st'", {"s": "s"}, T),  # string concatenation
        ("s < 't'", {"s": "s"}, U),  # C# has no ordering operators on strings
        ("b = TRUE", {"b": True}, T),
        ("b = 1", {"b": True}, U),  # a boolean is not a number
        ("b > FALSE", {"b": True}, U),
        ("b", {"b": True}, T),  # a boolean property is a condition
        ("b", {"b": 1}, U),
        ("big + 1 < 0", {"big": 2**63 - 1}, T),  # long arithmetic wraps (C# unchecked)
        ("-big - 2 > 0", {"big": 2**63 - 1}, T),
        ("9007199254740993 = 9007199254740992.0", {}, T),  # long converted to double, as C#
        ("1.0 / 0 > 1e308", {}, T),  # double division by zero: infinity
        ("NOT (0.0 / 0 = 0.0 / 0)", {}, T),  # NaN is not equal to itself
        ("t = @t", {"t": datetime(2026, 1, 1, tzinfo=UTC)}, T),
        ("u = @u", {"u": datetime(2026, 1, 1)}, T),  # a naive datetime is UTC
    ],
)
def test_types(sql: str, app: dict[str, Any], expected: bool | None) -> None:
    params = {"@t": datetime(2026, 1, 1, tzinfo=UTC), "@u": datetime(2026, 1, 1, tzinfo=UTC)}
    used = {k: v for k, v in params.items() if k in sql}
    assert result(sql, view(app), **used) is expected


@pytest.mark.parametrize(
    ("sql", "app"),
    [
        ("i / zero = 1", {"i": 1, "zero": 0}),
        ("i % zero = 1", {"i": 1, "zero": 0}),
        ("d / zero = 1", {"d": Decimal(1), "zero": 0}),
        ("min / -1 = 1", {"min": -(2**63)}),
        ("s LIKE 'a' ESCAPE e", {"s": "a", "e": "ab"}),
    ],
)
def test_what_throws_in_service_bus_raises(sql: str, app: dict[str, Any]) -> None:
    with pytest.raises(EvaluationError):
        SqlRuleFilter(sql).matches(view(app))


def test_double_remainder_and_division_follow_ieee() -> None:
    v = view({"x": 5.5, "zero": 0.0, "inf": math.inf})
    assert result("x % 2 = 1.5", v) is True
    assert result("x % zero = x % zero", v) is False  # NaN
    assert result("-x / zero < -1e308", v) is True
    assert result("x % inf = x", v) is True


def test_precedence() -> None:
    v = view({"a": 1, "b": 2, "c": 3})
    assert result("1 + 2 * 3 = 7", v) is True
    assert result("(1 + 2) * 3 = 9", v) is True
    assert result("10 - 4 - 3 = 3", v) is True  # left-associative
    assert result("24 / 4 / 2 = 3", v) is True
    assert result("-2 * -3 = 6", v) is True
    assert result("a = 1 OR b = 0 AND c = 0", v) is True  # AND binds tighter than OR
    assert result("(a = 1 OR b = 0) AND c = 0", v) is False
    assert result("NOT a = 2 AND b = 2", v) is True  # NOT binds tighter than AND
    assert result("NOT (a = 1 AND b = 3)", v) is True
    assert result("a + 1 IN (2, 3)", v) is True
    assert result("'x' + 'y' LIKE 'x_'", v) is True


# ------------------------------------------------------------------ system properties


def test_system_properties_of_a_stored_message() -> None:
    stored = StoredMessage(
        path="t/subscriptions/s",
        sequence_number=42,
        message_id="m1",
        body=b"12345",
        enqueued_time_us=1_800_000_000_000_000,
        expires_at_us=1_800_000_060_000_000,
        subject="order",
        time_to_live_us=60_000_000,
        application_properties={"Color": "red"},
    )
    v = MessageView.of(stored)
    assert result("sys.SequenceNumber = 42 AND sys.Label = 'order' AND sys.Subject = 'order'", v) is True
    assert result("sys.TimeToLive = @ttl", v, ttl=timedelta(minutes=1)) is True
    assert result("sys.ExpiresAtUtc - sys.EnqueuedTimeUtc = sys.TimeToLive", v) is True
    assert result("sys.Size >= 5 AND sys.DeliveryCount = 0", v) is True
    assert result("color = 'red'", v) is True  # user property names are case-insensitive
    assert result("sys.ReplyToSessionId IS NULL AND sys.LockToken IS NULL", v) is True


def test_system_properties_of_a_message_being_sent() -> None:
    message = Message(
        body=b"x", message_id="m", session_id="s", reply_to="r", reply_to_session_id="rs", to="t", content_type="c"
    )
    v = MessageView.of(message)
    assert result(
        "sys.SessionId = 's' AND sys.ReplyTo = 'r' AND sys.ReplyToSessionId = 'rs' AND sys.To = 't' "
        "AND sys.ContentType = 'c' AND sys.SequenceNumber IS NULL AND sys.Size = 1",
        v,
    )
    assert MessageView.of(message).application_properties == {}


def test_a_view_names_only_known_system_properties() -> None:
    with pytest.raises(InvalidArgumentError, match="not a Service Bus system property"):
        MessageView({"Colour": "red"})


# ------------------------------------------------------------------ errors at creation, with positions


@pytest.mark.parametrize(
    ("sql", "line", "column", "words"),
    [
        ("color = = 'red'", 1, 9, ["found '='", "a value"]),
        ("color = 'red' AND", 1, 18, ["the expression ends", "a value", "NOT", "EXISTS"]),
        ("color = 'red'\nAND size >", 2, 11, ["line 2, column 11", "the expression ends"]),
        ("color = 'red", 1, 9, ["not closed"]),
        ("[color = 1", 1, 1, ["[bracketed name] is not closed"]),
        ("color = 'red' size = 1", 1, 15, ["found 'size'", "AND", "OR"]),
        ("color # 'red'", 1, 7, ["unexpected character '#'", "an operator"]),
        ("(color = 'red'", 1, 15, ["')'"]),
        ("color IS 'red'", 1, 10, ["NOT or NULL"]),
        ("color IN 'red'", 1, 10, ["'('"]),
        ("AND = 1", 1, 1, ["AND is a reserved word"]),
        ("a = 1 AND and = 2", 1, 11, ["AND is a reserved word", "[and]"]),
        ("sys.Colour = 'red'", 1, 1, ["sys.Colour is not a Service Bus system property", "MessageId"]),
        ("other.x = 1", 1, 1, ["unknown scope 'other'"]),
        ("x = @missing", 1, 5, ["parameter @missing is not given"]),
        ("a = 1 AND 5", 1, 11, ["integer constant 5 is not a condition"]),
        ("'yes'", 1, 1, ["string constant 'yes' is not a condition"]),
        ("(a = 1) + 1 = 2", 1, 4, ["a condition cannot be used as an operand of +"]),
        ("1 IS NULL", 1, 1, ["IS [NOT] NULL applies to a property"]),
        ("a LIKE 5", 1, 8, ["pattern must be a string"]),
        ("a LIKE 'x' ESCAPE 'ab'", 1, 19, ["one character"]),
        ("a LIKE 'x!' ESCAPE '!'", 1, 8, ["ends with its escape character"]),
        ("upper(a) = 'A'", 1, 1, ["unknown function 'upper'", "newid()"]),
        ("a = 1 / 0", 1, 7, ["integer division by zero"]),
        ("a = 9223372036854775808", 1, 5, ["out of the range of a 64-bit integer"]),
        ("a = 1e999", 1, 5, ["out of the range of a double"]),
        ("EXISTS(1)", 1, 8, ["a property name"]),
        ("   ", 1, 1, ["empty"]),
    ],
)
def test_invalid_filters_name_the_position_and_what_was_expected(
    sql: str, line: int, column: int, words: list[str]
) -> None:
    with pytest.raises(SqlExpressionError) as caught:
        SqlRuleFilter(sql)
    error = caught.value
    assert (error.line, error.column) == (line, column), str(error)
    assert error.expression == sql
    assert error.condition == "com.microsoft:argument-error"
    assert isinstance(error, InvalidArgumentError)
    for word in words:
        assert word in str(error), (word, str(error))


def test_syntax_errors_list_what_was_expected() -> None:
    with pytest.raises(SqlExpressionError) as caught:
        SqlRuleFilter("color = 'red' AND")
    assert "NOT" in caught.value.expected and "EXISTS" in caught.value.expected


def test_length_limit_is_service_bus_quota() -> None:
    long_sql = "a = '" + "x" * 1100 + "'"
    with pytest.raises(InvalidArgumentError, match="at most 1024"):
        SqlRuleFilter(long_sql)
    SqlRuleFilter("a = '" + "x" * 1000 + "'")


def test_parameter_values_are_checked() -> None:
    with pytest.raises(InvalidArgumentError, match="not a string, integer"):
        SqlRuleFilter("a = @p", {"@p": [1, 2]})
