"""LIKE without backtracking (issue 33, item 3): the same answers as before, in time that does not explode.

Held against two references on generated patterns and values over small alphabets (so that ``%``, ``_``, the
escape character and the literal characters collide often): the dynamic-programming matcher of
``test_rules_reference`` and the regular-expression translation LIKE used before (``.*`` for ``%``). Then
patterns that made that translation backtrack for minutes run against 64 KB values under a deadline.
"""

from __future__ import annotations

import contextlib
import re
import signal
import time
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncebus.core.rules import MessageView, SqlRuleFilter
from oncebus.core.rules._like import PatternError, like_pattern
from tests.core.test_rules_reference import RefError, like_match

ESCAPES = st.sampled_from([None, "!", "%", "_", "a"])


def regex_like(value: str, pattern: str, escape: str | None) -> bool:
    """LIKE as it was matched before: translated to a regular expression (same semantics, backtracking)."""
    out = []
    chars = iter(pattern)
    for c in chars:
        if escape is not None and c == escape:
            nxt = next(chars, None)
            if nxt is None:
                raise RefError("pattern ends with the escape character")
            out.append(re.escape(nxt))
        else:
            out.append(".*" if c == "%" else "." if c == "_" else re.escape(c))
    return re.fullmatch("".join(out), value, re.DOTALL) is not None


def ours(value: str, pattern: str, escape: str | None) -> bool:
    try:
        compiled = like_pattern(pattern, escape)
    except PatternError as exc:
        raise RefError(str(exc)) from exc
    got = compiled.matches(value)
    assert compiled.scan(value) is got  # a shortcut, where the pattern has one, answers as the scan does
    return got


def answer(match: object, value: str, pattern: str, escape: str | None) -> object:
    try:
        return match(value, pattern, escape)  # type: ignore[operator]
    except RefError:
        return "refused"


@settings(max_examples=3000, deadline=None)
@given(value=st.text(alphabet="ab!%_\n", max_size=8), pattern=st.text(alphabet="ab!%_\n", max_size=8), escape=ESCAPES)
def test_like_agrees_with_both_references(value: str, pattern: str, escape: str | None) -> None:
    got = answer(ours, value, pattern, escape)
    assert got == answer(like_match, value, pattern, escape), (value, pattern, escape)
    assert got == answer(regex_like, value, pattern, escape), (value, pattern, escape)


@settings(max_examples=1500, deadline=None)
@given(
    value=st.text(alphabet="ab", max_size=40),
    pattern=st.lists(st.sampled_from(["a", "b", "%", "_", "!%", "!_", "!!"]), max_size=12).map("".join),
)
def test_long_values_agree_with_the_reference(value: str, pattern: str) -> None:
    """Longer values, and pieces between ``%`` long enough that finding one takes a scan (``_`` and literals)."""
    assert ours(value, pattern, "!") == like_match(value, pattern, "!"), (value, pattern)


@pytest.mark.parametrize(
    ("pattern", "value", "expected"),
    [
        ("", "", True),
        ("", "a", False),
        ("%", "", True),
        ("%%", "x", True),
        ("_", "", False),
        ("_", "\n", True),  # ``_`` and ``%`` take line breaks
        ("a%", "A", False),  # case-sensitive
        ("%b%b", "bb", True),
        ("%b%b", "b", False),  # the pieces may not overlap
        ("ab%ba", "aba", False),  # nor the head and the tail
        ("ab%ba", "abba", True),
        ("%a_c%", "xxabcabc", True),
        ("%a_c%", "xxabbc", False),
        ("a_%_b", "axyb", True),
        ("a_%_b", "axb", False),
        ("%\U0001f600_", "\U0001f600x", True),  # a character is a code point
    ],
)
def test_like_cases(pattern: str, value: str, expected: bool) -> None:
    assert like_pattern(pattern, None).matches(value) is expected
    assert like_match(value, pattern, None) is expected


def test_pattern_errors_are_unchanged() -> None:
    with pytest.raises(PatternError, match="ends with its escape character"):
        like_pattern("ab!", "!")
    with pytest.raises(PatternError, match="ends with its escape character"):
        like_pattern("%", "%")  # the escape character is read as one before anything else
    with pytest.raises(PatternError, match="one character"):
        like_pattern("a", "!!")
    assert like_pattern("%%", "%").matches("%") and not like_pattern("%%", "%").matches("a")


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Fails the block (``TimeoutError``) once it has run ``seconds``; a regular expression stops for it too.

    Puts back pytest-timeout's own alarm (same signal) when it is done."""

    def expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"took more than {seconds} s")

    started = time.monotonic()
    previous_handler = signal.signal(signal.SIGALRM, expired)
    previous_timer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        if previous_timer:
            signal.setitimer(signal.ITIMER_REAL, max(previous_timer - (time.monotonic() - started), 0.001))


PATHOLOGICAL = [
    "%a%a%a%a%a%a%a%a%a%a%a%a%b",  # the issue's: thirty ``a`` took the regular expression 7 s
    "%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%b%",
    "%" + "a_" * 200 + "b%",  # long pieces with ``_``: found by the scan
    "%" + "_%" * 200 + "b",
    "%" + "a%_" * 150 + "%b",
]


@pytest.mark.parametrize("pattern", PATHOLOGICAL, ids=["issue", "thirty", "underscores", "ones", "mixed"])
def test_pathological_patterns_against_64_kb_take_no_time(pattern: str) -> None:
    """Each took the regular expression minutes at least; here all of the values, through both ways a filter
    compiles LIKE (a constant pattern, a pattern from a property), run under a deadline of one second together."""
    constant = SqlRuleFilter(f"sys.Label LIKE '{pattern}'")
    from_property = SqlRuleFilter("sys.Label LIKE user.pattern")
    answers = {}
    with deadline(1.0):
        for value in ["a" * 65536, "a" * 65535 + "b", "a" * 65535 + "c", "ab" * 32768, ("a" * 99 + "b") * 655]:
            view = MessageView({"Label": value}, {"pattern": pattern})
            answers[value[-200:]] = got = constant._match(view)
            assert from_property._match(view) is got
    # every pattern wants a ``b`` after a run of ``a``
    assert answers["a" * 200] is False and answers["a" * 199 + "b"] is True and answers["a" * 199 + "c"] is False
