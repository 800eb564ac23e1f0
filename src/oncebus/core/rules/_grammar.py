"""The Service Bus SQL filter and action grammar (lark, LALR), and its syntax errors made readable.

Follows the "Subscription Rule SQL Filter Syntax" and "SQL Action Syntax"
references: predicates (``NOT AND OR``, comparisons, ``IS [NOT] NULL``,
``[NOT] IN``, ``[NOT] LIKE ... [ESCAPE ...]``, ``EXISTS``), expressions
(``+ - * / %``, unary ``+ -``, parentheses), constants (integers, decimals,
scientific notation, ``'strings'`` with ``''``, ``TRUE FALSE NULL``),
``@parameters``, functions (``newid()``, ``property(name)``, ``p(name)``) and
properties (``[sys.|user.]name``, ``[bracketed name]``, ``"quoted name"``).
Keywords are case-insensitive and reserved. Actions are ``SET property =
expression`` and ``REMOVE property`` statements, ``;`` between them optional.

Predicates and expressions share one precedence ladder here (so that
``(a + 1) > 2`` and ``(a > 1 OR b)`` both parse without lookahead tricks); the
compiler then checks that a condition stands where a condition belongs.
"""

from __future__ import annotations

from functools import lru_cache

from lark import Lark, Token, Tree, UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from oncebus.core.errors import SqlExpressionError

KEYWORDS = ("AND", "OR", "NOT", "IS", "NULL", "IN", "LIKE", "ESCAPE", "EXISTS", "TRUE", "FALSE")
ACTION_KEYWORDS = ("SET", "REMOVE")

_GRAMMAR = r"""
filter: or_expr
action: statement (";"? statement)* ";"?

?statement: SET property EQ add_expr   -> set_statement
          | REMOVE property            -> remove_statement

?or_expr: and_expr
        | or_expr OR and_expr          -> or_op
?and_expr: not_expr
         | and_expr AND not_expr       -> and_op
?not_expr: cmp_expr
         | NOT not_expr                -> not_op
?cmp_expr: add_expr
         | add_expr (COMPOP | EQ) add_expr                 -> comparison
         | add_expr IS NULL                                -> is_null
         | add_expr IS NOT NULL                            -> is_not_null
         | add_expr IN "(" expr_list ")"                   -> in_list
         | add_expr NOT IN "(" expr_list ")"               -> not_in_list
         | add_expr LIKE add_expr (ESCAPE add_expr)?       -> like
         | add_expr NOT LIKE add_expr (ESCAPE add_expr)?   -> not_like
expr_list: add_expr ("," add_expr)*
?add_expr: mul_expr
         | add_expr ADDOP mul_expr     -> binary
?mul_expr: unary
         | mul_expr MULOP unary        -> binary
?unary: primary
      | ADDOP unary                    -> unary
?primary: NUMBER                       -> number
        | STRING                       -> string
        | TRUE                         -> true
        | FALSE                        -> false
        | NULL                         -> null
        | PARAM                        -> parameter
        | property
        | NAME "(" (or_expr ("," or_expr)*)? ")"   -> function
        | EXISTS "(" property ")"      -> exists
        | "(" or_expr ")"              -> parens
property: name_part                    -> plain_property
        | NAME "." name_part           -> scoped_property
?name_part: NAME | DELIMITED | QUOTED

AND: "and"i
OR: "or"i
NOT: "not"i
IS: "is"i
NULL: "null"i
IN: "in"i
LIKE: "like"i
ESCAPE: "escape"i
EXISTS: "exists"i
TRUE: "true"i
FALSE: "false"i
SET: "set"i
REMOVE: "remove"i

EQ: "="
COMPOP: "<>" | "!=" | ">=" | "<=" | ">" | "<"
ADDOP: "+" | "-"
MULOP: "*" | "/" | "%"
NUMBER: /(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?/
STRING: /'([^']|'')*'/
DELIMITED: /\[([^\]]|\]\])*\]/
QUOTED: /"([^"]|"")*"/
PARAM: /@\w+/
NAME: /[^\W\d_]\w*/

%ignore /\s+/
"""

_FRIENDLY = {
    "NAME": "a property name",
    "DELIMITED": "a [bracketed name]",
    "QUOTED": 'a "quoted name"',
    "NUMBER": "a number",
    "STRING": "a 'string'",
    "PARAM": "an @parameter",
    "COMPOP": "a comparison (<> != < <= > >=)",
    "EQ": "'='",
    "ADDOP": "'+' or '-'",
    "MULOP": "'*', '/' or '%'",
    "LPAR": "'('",
    "RPAR": "')'",
    "COMMA": "','",
    "DOT": "'.'",
    "SEMICOLON": "';'",
    "$END": "the end of the expression",
}
# what can start a value: when all of these are expected, say so in three words
_VALUE_STARTS = {"NAME", "DELIMITED", "QUOTED", "NUMBER", "STRING", "PARAM", "TRUE", "FALSE", "NULL", "LPAR", "ADDOP"}


_OPERATORS = {"ADDOP", "MULOP", "COMPOP", "EQ"}


@lru_cache(maxsize=1)
def _parser() -> Lark:
    return Lark(
        _GRAMMAR,
        start=["filter", "action"],
        parser="lalr",
        lexer="contextual",
        propagate_positions=True,
        maybe_placeholders=False,
    )


def parse(text: str, start: str) -> Tree[Token]:
    """Parse a filter (``start="filter"``) or an action; raise SqlExpressionError on bad syntax."""
    what = "SQL filter" if start == "filter" else "SQL action"
    if not text.strip():
        raise SqlExpressionError(f"the {what} expression is empty", expression=text, expected=("an expression",))
    try:
        return _parser().parse(text, start=start)
    except UnexpectedInput as exc:
        raise _syntax_error(text, what, exc) from None


def _describe(expected: set[str]) -> tuple[str, ...]:
    names = set(expected)
    out: list[str] = []
    if _VALUE_STARTS - {"ADDOP", "LPAR"} <= names:
        out.append("a value (property, constant, @parameter or function)")
        names -= _VALUE_STARTS
    if _OPERATORS <= names:
        out.append("an operator (= <> != < <= > >= + - * / %)")
        names -= _OPERATORS
    order = ["DOT", "LPAR", "RPAR", "COMMA", "SEMICOLON", *KEYWORDS, *ACTION_KEYWORDS]
    for name in sorted(names, key=lambda n: (n == "$END", order.index(n) if n in order else len(order), n)):
        out.append(_FRIENDLY.get(name, name))
    return tuple(out)


def position_of_end(text: str) -> tuple[int, int]:
    lines = text.split("\n")
    return len(lines), len(lines[-1]) + 1


def near(text: str, line: int, column: int) -> str:
    rows = text.split("\n")
    row = rows[line - 1] if 0 < line <= len(rows) else ""
    snippet = row[column - 1 : column + 19]
    return f" near {snippet!r}" if snippet.strip() else ""


def _syntax_error(text: str, what: str, exc: UnexpectedInput) -> SqlExpressionError:
    accepts: set[str] = exc.interactive_parser.accepts() if getattr(exc, "interactive_parser", None) else set()  # type: ignore[no-untyped-call]
    if isinstance(exc, UnexpectedToken):
        expected = _describe(accepts or set(exc.expected))
        if exc.token.type == "$END":
            line, column = position_of_end(text)
            found = "the expression ends"
        else:
            line, column = exc.token.line or 1, exc.token.column or 1
            found = f"found {exc.token.value!r}"
    elif isinstance(exc, UnexpectedCharacters):
        line, column = exc.line, exc.column
        expected = _describe(accepts or set(exc.allowed or ()))
        char = exc.char
        found = {
            "'": "a string is not closed (a quote inside a string is written '')",
            "[": "a [bracketed name] is not closed (']' inside is written ']]')",
            '"': 'a "quoted name" is not closed (\'"\' inside is written \'""\')',
        }.get(char, f"unexpected character {char!r}")
    else:  # pragma: no cover - LALR raises only the two above
        line, column = getattr(exc, "line", 1), getattr(exc, "column", 1)
        expected, found = (), str(exc)
    message = f"invalid {what} at line {line}, column {column}{near(text, line, column)}: {found}"
    if expected:
        message += "; expected " + _join(expected)
    return SqlExpressionError(message, expression=text, line=line, column=column, expected=expected)


def _join(items: tuple[str, ...]) -> str:
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " or " + items[-1]
