"""Compile a parsed SQL filter or action once into Python closures evaluated per message.

Each node of the tree becomes a function of a :class:`MessageView`. Checks
that need no message happen here, at rule creation, with the position of the
offending part: an unknown ``sys.`` property, a reserved word used as a name,
a missing ``@parameter``, a condition where a value belongs (or the reverse),
``IS NULL`` on something that is not a property, a constant pattern or escape
that is not a string, a ``SET`` of a read-only system property. Parts made of
constants only are folded here, so ``1=1`` costs one call per message.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lark import Token, Transformer, Tree, v_args
from lark.exceptions import VisitError

from oncebus.core.errors import SqlExpressionError
from oncebus.core.rules import _values as V
from oncebus.core.rules._grammar import ACTION_KEYWORDS, KEYWORDS, near, parse
from oncebus.core.rules._like import PatternError, like_pattern
from oncebus.core.rules._statements import PropertyRef, Statement, check_system_value
from oncebus.core.rules._view import SYSTEM_PROPERTIES, MessageView

Fn = Callable[[MessageView], Any]
FUNCTIONS = ("newid()", "property(name)", "p(name)")


@dataclass
class Node:
    fn: Fn
    condition: bool  # True/False/unknown rather than a value
    line: int
    column: int
    const: bool = False
    value: Any = None
    prop: PropertyRef | None = None
    named_by_value: bool = False  # property(expression): a property whose name is computed per message


def _constant(value: Any, line: int, column: int, *, condition: bool = False) -> Node:
    return Node(lambda _v: value, condition, line, column, const=True, value=value)


class _Fail(Exception):
    """Raised inside the transformer; turned into SqlExpressionError with the expression's text."""

    def __init__(self, message: str, line: int, column: int) -> None:
        super().__init__(message)
        self.message, self.line, self.column = message, line, column


def _pos(item: Any) -> tuple[int, int]:
    if isinstance(item, Token):
        return item.line or 1, item.column or 1
    if isinstance(item, Node):
        return item.line, item.column
    meta = getattr(item, "meta", None)
    return (getattr(meta, "line", 1), getattr(meta, "column", 1)) if meta else (1, 1)


def _unquote(token: Token) -> str:
    text = str(token)
    if token.type == "DELIMITED":
        return text[1:-1].replace("]]", "]")
    if token.type == "QUOTED":
        return text[1:-1].replace('""', '"')
    return text


@v_args(meta=True)
class _Compiler(Transformer[Token, Any]):
    def __init__(self, parameters: Mapping[str, Any], reserved: tuple[str, ...]) -> None:
        super().__init__()
        self.parameters = {k.lower() if k.startswith("@") else "@" + k.lower(): v for k, v in parameters.items()}
        self.reserved = reserved

    # ------------------------------------------------------------ checks

    def _name(self, token: Token) -> str:
        if token.type == "NAME" and token.upper() in self.reserved:
            line, column = _pos(token)
            raise _Fail(
                f"{token.upper()} is a reserved word; write [{token}] to use it as a property name", line, column
            )
        return _unquote(token)

    def _value(self, node: Node, what: str) -> Node:
        if node.condition:
            raise _Fail(f"a condition cannot be used as {what}; expected a value", node.line, node.column)
        return node

    def _condition(self, node: Node) -> Node:
        if node.condition:
            return node
        if node.const:
            if type(node.value) is not bool and node.value is not None:
                raise _Fail(
                    f"{V.type_name(node.value)} constant {node.value!r} is not a condition; "
                    "expected a comparison, IS NULL, IN, LIKE, EXISTS or TRUE/FALSE",
                    node.line,
                    node.column,
                )
            return Node(node.fn, True, node.line, node.column, const=True, value=node.value)
        fn = node.fn
        return Node(lambda v: V.as_condition(fn(v)), True, node.line, node.column)

    @staticmethod
    def _fold(node: Node, children: list[Node]) -> Node:
        if all(c.const for c in children):
            try:
                value = node.fn(None)  # type: ignore[arg-type]
            except V.EvaluationError as exc:
                raise _Fail(str(exc), node.line, node.column) from exc
            return Node(lambda _v: value, node.condition, node.line, node.column, const=True, value=value)
        return node

    # ------------------------------------------------------------ properties

    def _property_node(self, ref: PropertyRef, line: int, column: int) -> Node:
        key = ref.key
        if ref.scope == "sys":
            return Node(_system_getter(key), False, line, column, prop=ref)
        return Node(lambda v: v.user.get(key), False, line, column, prop=ref)

    def plain_property(self, meta: Any, children: list[Token]) -> Node:
        (token,) = children
        name = self._name(token)
        line, column = _pos(token)
        return self._property_node(PropertyRef("user", name.lower(), name), line, column)

    def scoped_property(self, meta: Any, children: list[Token]) -> Node:
        scope_token, token = children
        scope = scope_token.lower()
        line, column = _pos(scope_token)
        if scope not in ("sys", "user"):
            raise _Fail(
                f"unknown scope {str(scope_token)!r}; a property is written name, user.name or sys.name", line, column
            )
        name = _unquote(token) if token.type != "NAME" else str(token)
        return self._property_node(self._ref(scope, name, line, column), line, column)

    @staticmethod
    def _ref(scope: str, name: str, line: int, column: int) -> PropertyRef:
        if scope == "sys" and name.lower() not in SYSTEM_PROPERTIES:
            raise _Fail(
                f"sys.{name} is not a Service Bus system property; known: "
                + ", ".join(sorted(p.name for p in SYSTEM_PROPERTIES.values())),
                line,
                column,
            )
        return PropertyRef(scope, name.lower(), name)

    # ------------------------------------------------------------ constants

    def number(self, meta: Any, children: list[Token]) -> Node:
        (token,) = children
        text = str(token)
        line, column = _pos(token)
        if any(c in text for c in ".eE"):
            value: Any = float(text)
            if value in (float("inf"), float("-inf")):
                raise _Fail(f"the number {text} is out of the range of a double", line, column)
        else:
            value = int(text)
            if value > V.INT64_MAX:
                raise _Fail(f"the integer {text} is out of the range of a 64-bit integer", line, column)
        return _constant(value, line, column)

    def string(self, meta: Any, children: list[Token]) -> Node:
        (token,) = children
        return _constant(str(token)[1:-1].replace("''", "'"), *_pos(token))

    def true(self, meta: Any, children: list[Token]) -> Node:
        return _constant(True, *_pos(children[0]))

    def false(self, meta: Any, children: list[Token]) -> Node:
        return _constant(False, *_pos(children[0]))

    def null(self, meta: Any, children: list[Token]) -> Node:
        return _constant(None, *_pos(children[0]))

    def parameter(self, meta: Any, children: list[Token]) -> Node:
        (token,) = children
        key = token.lower()
        line, column = _pos(token)
        if key not in self.parameters:
            given = ", ".join(sorted(self.parameters)) or "none"
            raise _Fail(f"the parameter {token} is not given (parameters given: {given})", line, column)
        return _constant(self.parameters[key], line, column)

    # ------------------------------------------------------------ functions

    def function(self, meta: Any, children: list[Any]) -> Node:
        name_token, *args = children
        name = name_token.lower()
        line, column = _pos(name_token)
        if name == "newid":
            if args:
                raise _Fail("newid() takes no argument", line, column)
            return Node(lambda _v: uuid.uuid4(), False, line, column)
        if name in ("property", "p"):
            if len(args) != 1:
                raise _Fail(f"{name}(name) takes one argument: the property's name", line, column)
            arg = self._value(args[0], f"the argument of {name}()")
            if arg.const:
                if type(arg.value) is not str:
                    raise _Fail(f"{name}() needs a string naming a property", arg.line, arg.column)
                scope, _, rest = arg.value.partition(".")
                if rest and scope.lower() in ("sys", "user"):
                    ref = self._ref(scope.lower(), rest, arg.line, arg.column)
                else:
                    ref = PropertyRef("user", arg.value.lower(), arg.value)
                return self._property_node(ref, line, column)
            arg_fn = arg.fn
            return Node(lambda v: _dynamic_property(v, arg_fn(v)), False, line, column, named_by_value=True)
        raise _Fail(f"unknown function {str(name_token)!r}; the functions are " + ", ".join(FUNCTIONS), line, column)

    # ------------------------------------------------------------ expressions

    def parens(self, meta: Any, children: list[Node]) -> Node:
        (inner,) = children
        return inner

    def unary(self, meta: Any, children: list[Any]) -> Node:
        op, operand = children
        operand = self._value(operand, f"the operand of unary {op}")
        f = operand.fn
        fn: Fn = (lambda v: V.negate(f(v))) if op == "-" else (lambda v: V.plus(f(v)))
        return self._fold(Node(fn, False, *_pos(op)), [operand])

    def binary(self, meta: Any, children: list[Any]) -> Node:
        left, op, right = children
        op_text = str(op)
        left = self._value(left, f"an operand of {op_text}")
        right = self._value(right, f"an operand of {op_text}")
        lf, rf = left.fn, right.fn

        def fn(v: MessageView) -> Any:
            return V.arithmetic(op_text, lf(v), rf(v))

        return self._fold(Node(fn, False, *_pos(op)), [left, right])

    def comparison(self, meta: Any, children: list[Any]) -> Node:
        left, op, right = children
        op_text = "<>" if op == "!=" else str(op)
        left = self._value(left, f"an operand of {op}")
        right = self._value(right, f"an operand of {op}")
        fn = _comparison_fn(op_text, left, right)
        return self._fold(Node(fn, True, *_pos(op)), [left, right])

    def is_null(self, meta: Any, children: list[Any]) -> Node:
        return self._null_test(children[0], children[1], negate=False)

    def is_not_null(self, meta: Any, children: list[Any]) -> Node:
        return self._null_test(children[0], children[1], negate=True)

    def _null_test(self, operand: Node, is_token: Token, *, negate: bool) -> Node:
        if operand.prop is None and not operand.named_by_value:
            raise _Fail("IS [NOT] NULL applies to a property", operand.line, operand.column)
        f = operand.fn
        fn: Fn = (lambda v: f(v) is not None) if negate else (lambda v: f(v) is None)
        return self._fold(Node(fn, True, *_pos(is_token)), [operand])

    def expr_list(self, meta: Any, children: list[Node]) -> list[Node]:
        return [self._value(c, "an item of IN (...)") for c in children]

    def in_list(self, meta: Any, children: list[Any]) -> Node:
        return self._in(children[0], children[1], children[2], negate=False)

    def not_in_list(self, meta: Any, children: list[Any]) -> Node:
        return self._in(children[0], children[2], children[3], negate=True)

    def _in(self, left: Node, in_token: Token, items: list[Node], *, negate: bool) -> Node:
        left = self._value(left, "the left side of IN")
        lf = left.fn
        if all(i.const for i in items):
            values = tuple(i.value for i in items)

            def contains(v: MessageView) -> bool | None:
                x = lf(v)
                if x is None:
                    return None
                return any(V.equals(x, c) is True for c in values)

        else:
            fns = tuple(i.fn for i in items)

            def contains(v: MessageView) -> bool | None:
                x = lf(v)
                if x is None:
                    return None
                return any(V.equals(x, f(v)) is True for f in fns)

        fn: Fn = (lambda v: V.not3(contains(v))) if negate else contains
        return self._fold(Node(fn, True, *_pos(in_token)), [left, *items])

    def like(self, meta: Any, children: list[Any]) -> Node:
        return self._like(children, negate=False)

    def not_like(self, meta: Any, children: list[Any]) -> Node:
        return self._like(children[:1] + children[2:], negate=True)

    def _like(self, children: list[Any], *, negate: bool) -> Node:
        left, like_token, pattern, *rest = children
        escape = rest[1] if rest else None
        left = self._value(left, "the left side of LIKE")
        pattern = self._value(pattern, "a LIKE pattern")
        for part, what in ((pattern, "pattern"), (escape, "ESCAPE character")):
            if part is not None and part.const and part.value is not None and type(part.value) is not str:
                raise _Fail(f"the LIKE {what} must be a string", part.line, part.column)
        if escape is not None:
            escape = self._value(escape, "an ESCAPE character")
            if escape.const and escape.value is not None and len(escape.value) != 1:
                raise _Fail("the ESCAPE character must be a string of one character", escape.line, escape.column)
        lf, pf = left.fn, pattern.fn
        if pattern.const and pattern.value is not None and (escape is None or escape.const):
            esc = None if escape is None else escape.value
            if escape is not None and esc is None:
                match: Fn = lambda v: None  # noqa: E731 - ESCAPE NULL: always unknown
            else:
                try:
                    compiled = like_pattern(pattern.value, esc)
                except PatternError as exc:
                    raise _Fail(str(exc), pattern.line, pattern.column) from exc

                def match(v: MessageView) -> bool | None:
                    x = lf(v)
                    if type(x) is str:
                        return compiled.matches(x)
                    return None if x is None or V.kind(x) != V.K_STRING else compiled.matches(x)

        else:
            ef = escape.fn if escape is not None else (lambda _v: None)
            has_escape = escape is not None

            def match(v: MessageView) -> bool | None:
                return V.like(lf(v), pf(v), ef(v), has_escape=has_escape)

        fn: Fn = (lambda v: V.not3(match(v))) if negate else match
        nodes = [left, pattern] + ([escape] if escape is not None else [])
        return self._fold(Node(fn, True, *_pos(like_token)), nodes)

    def exists(self, meta: Any, children: list[Any]) -> Node:
        exists_token, prop = children
        ref = prop.prop
        assert ref is not None
        key = ref.key
        if ref.scope == "sys":
            get = _system_getter(key)
            fn: Fn = lambda v: get(v) is not None  # noqa: E731
        else:
            fn = lambda v: key in v.user  # noqa: E731
        return Node(fn, True, *_pos(exists_token))

    # ------------------------------------------------------------ logic

    def not_op(self, meta: Any, children: list[Any]) -> Node:
        not_token, operand = children
        operand = self._condition(operand)
        f = operand.fn
        return self._fold(Node(lambda v: V.not3(f(v)), True, *_pos(not_token)), [operand])

    def and_op(self, meta: Any, children: list[Any]) -> Node:
        left, op, right = children
        left, right = self._condition(left), self._condition(right)
        lf, rf = left.fn, right.fn

        def fn(v: MessageView) -> bool | None:
            a = lf(v)
            if a is False:
                return False
            b = rf(v)
            if b is False:
                return False
            return None if a is None or b is None else True

        return self._fold(Node(fn, True, *_pos(op)), [left, right])

    def or_op(self, meta: Any, children: list[Any]) -> Node:
        left, op, right = children
        left, right = self._condition(left), self._condition(right)
        lf, rf = left.fn, right.fn

        def fn(v: MessageView) -> bool | None:
            a = lf(v)
            if a is True:
                return True
            b = rf(v)
            if b is True:
                return True
            return None if a is None or b is None else False

        return self._fold(Node(fn, True, *_pos(op)), [left, right])

    def filter(self, meta: Any, children: list[Node]) -> Node:
        return self._condition(children[0])

    # ------------------------------------------------------------ actions

    def set_statement(self, meta: Any, children: list[Any]) -> Statement:
        _set, target, _eq, value = children
        ref = target.prop
        value = self._value(value, "the value of SET")
        if ref.scope == "sys":
            prop = SYSTEM_PROPERTIES[ref.key]
            if not prop.settable:
                raise _Fail(
                    f"sys.{prop.name} is read-only; SET may change "
                    + ", ".join(sorted({p.name for p in SYSTEM_PROPERTIES.values() if p.settable})),
                    target.line,
                    target.column,
                )
            if value.const:
                try:
                    check_system_value(prop.name, ref.key, value.value)
                except V.EvaluationError as exc:
                    raise _Fail(str(exc), value.line, value.column) from exc
        return Statement("set", ref, value.fn, target.line, target.column)

    def remove_statement(self, meta: Any, children: list[Any]) -> Statement:
        _remove_token, target = children
        ref = target.prop
        if ref.scope == "sys":
            prop = SYSTEM_PROPERTIES[ref.key]
            if not prop.settable or ref.key == "messageid":
                raise _Fail(f"sys.{prop.name} cannot be removed", target.line, target.column)
        return Statement("remove", ref, None, target.line, target.column)

    def action(self, meta: Any, children: list[Statement]) -> list[Statement]:
        return children


def _dynamic_property(view: MessageView, name: Any) -> Any:
    if type(name) is not str:
        return None
    scope, _, rest = name.partition(".")
    if rest and scope.lower() == "sys":
        return view.system_value(rest.lower())
    if rest and scope.lower() == "user":
        return view.user.get(rest.lower())
    return view.user.get(name.lower())


def _system_getter(key: str) -> Fn:
    if key == "size":  # computed on first use
        return lambda v: v.system_value("size")
    return lambda v: v.system.get(key)


def _comparison_fn(op: str, left: Node, right: Node) -> Fn:
    lf, rf = left.fn, right.fn
    # the common shape, property = 'constant', without the generic dispatch
    if (
        op == "="
        and left.prop is not None
        and left.prop.key != "size"
        and right.const
        and type(right.value) in (str, int)
    ):
        c, ctype, key = right.value, type(right.value), left.prop.key
        equals = V.equals
        if left.prop.scope == "sys":

            def eq_constant(v: MessageView) -> bool | None:
                x = v.system.get(key)
                return x == c if type(x) is ctype else equals(x, c)

        else:

            def eq_constant(v: MessageView) -> bool | None:
                x = v.user.get(key)
                return x == c if type(x) is ctype else equals(x, c)

        return eq_constant
    if op != "=" and left.prop is not None and right.const and type(right.value) in (int, float):
        # property < number: same-typed numbers compare directly, anything else takes the general rule
        c, ctype, order, compare = right.value, type(right.value), V.ORDER[op], V.compare

        def compare_constant(v: MessageView) -> bool | None:
            x = lf(v)
            return order(x, c) if type(x) is ctype else compare(op, x, c)

        return compare_constant
    if op == "=":
        return lambda v: V.equals(lf(v), rf(v))
    return lambda v: V.compare(op, lf(v), rf(v))


def _fail_to_error(exc: _Fail, text: str, what: str) -> SqlExpressionError:
    return SqlExpressionError(
        f"invalid {what} at line {exc.line}, column {exc.column}{near(text, exc.line, exc.column)}: {exc.message}",
        expression=text,
        line=exc.line,
        column=exc.column,
    )


def _transform(
    tree: Tree[Token], text: str, what: str, parameters: Mapping[str, Any], reserved: tuple[str, ...]
) -> Any:
    compiler = _Compiler(parameters, reserved)
    try:
        result = compiler.transform(tree)
    except VisitError as exc:
        if isinstance(exc.orig_exc, _Fail):
            raise _fail_to_error(exc.orig_exc, text, what) from None
        raise
    return result


def compile_filter(text: str, parameters: Mapping[str, Any]) -> Callable[[MessageView], bool | None]:
    """The filter as a function of a message view: True, False or None (unknown, which does not match)."""
    tree = parse(text, "filter")
    node = _transform(tree, text, "SQL filter", parameters, KEYWORDS)
    return node.fn  # type: ignore[no-any-return]


def compile_action(text: str, parameters: Mapping[str, Any], max_statements: int) -> list[Statement]:
    tree = parse(text, "action")
    statements: list[Statement] = _transform(tree, text, "SQL action", parameters, KEYWORDS + ACTION_KEYWORDS)
    if len(statements) > max_statements:
        extra = statements[max_statements]
        raise SqlExpressionError(
            f"invalid SQL action at line {extra.line}, column {extra.column}: an action has at most "
            f"{max_statements} statements, this one has {len(statements)}",
            expression=text,
            line=extra.line,
            column=extra.column,
        )
    return statements
