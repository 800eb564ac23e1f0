"""LIKE as the SQL filter grammar defines it: ``%`` any run of characters, ``_`` exactly one, and the ESCAPE
character makes the character after it literal; case-sensitive, and ``%`` and ``_`` match line breaks too.

Matched without backtracking. The pattern is cut at each ``%`` into pieces of fixed width (literal characters
and ``_``). The first piece must match at the start of the value and the last at its end; each piece between
goes at the leftmost place after the one before it. That greedy placement is never wrong (the argument of the
classic two-pointer wildcard match): a piece placed further right leaves the pieces after it less room, never
more, so no placement is ever revisited, and a value is read about once whatever the pattern. A piece of
literal characters is found by ``str.find``; one with ``_`` by a shift-and scan (one bit per character of the
piece), one step per character of the value. A regular expression (``.*`` for each ``%``) backtracks instead:
``'%a%a%a%a%a%a%a%a%a%a%a%a%b'`` took seconds against thirty ``a``, and the event loop with it.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache


class PatternError(ValueError):
    pass


_ANY = None  # ``_`` in a piece: any one character


class _Piece:
    """A run of the pattern between two ``%``: literal characters and ``_`` (``None``), of a fixed width."""

    __slots__ = ("any_mask", "masks", "runs", "text", "width")

    def __init__(self, chars: list[str | None]) -> None:
        self.width = len(chars)
        # all literal: the piece as text, found by ``str.find``
        self.text = None if _ANY in chars else "".join(c for c in chars if c is not None)
        # its literal runs, by their offset in the piece (checked at a given place)
        runs: list[tuple[int, str]] = []
        start = 0
        for offset, char in enumerate([*chars, _ANY]):
            if char is _ANY:
                if offset > start:
                    runs.append((start, "".join(c for c in chars[start:offset] if c is not None)))
                start = offset + 1
        self.runs = tuple(runs)
        # shift-and: for each character, the offsets it may stand at as bits (``_``'s offsets take any character)
        self.any_mask = sum(1 << offset for offset, char in enumerate(chars) if char is _ANY)
        self.masks: dict[str, int] = {}
        for offset, char in enumerate(chars):
            if char is not None:
                self.masks[char] = self.masks.get(char, self.any_mask) | 1 << offset

    def at(self, value: str, start: int) -> bool:
        """Whether the piece matches ``value`` at ``start`` (the caller knows the width fits there)."""
        if self.text is not None:
            return value.startswith(self.text, start)
        return all(value.startswith(run, start + offset) for offset, run in self.runs)

    def find(self, value: str, start: int, stop: int) -> int:
        """The leftmost place at or after ``start`` where the piece matches, ending at or before ``stop``; -1: none."""
        if self.text is not None:
            return value.find(self.text, start, stop)
        if not self.runs:  # only ``_``: anywhere it fits
            return start if start + self.width <= stop else -1
        masks, any_mask, last = self.masks, self.any_mask, 1 << (self.width - 1)
        state = 0  # bit i: the piece's first i + 1 characters match the value's up to here
        for index in range(start, stop):
            state = ((state << 1) | 1) & masks.get(value[index], any_mask)
            if state & last:
                return index + 1 - self.width
        return -1


class LikePattern:
    """A compiled LIKE pattern: ``head % middle[0] % ... % tail``, or ``head`` alone when there is no ``%``.

    ``matches(value)`` answers; for the patterns filters mostly use (no ``_``, at most one piece between ``%``:
    ``'order%'``, ``'%bus%'``, ``'abc'``) it is the same answer in a string call or three."""

    __slots__ = ("head", "matches", "middle", "tail")

    def __init__(self, head: _Piece, middle: tuple[_Piece, ...], tail: _Piece | None) -> None:
        self.head = head
        self.middle = middle
        self.tail = tail  # None: no ``%`` (the value is exactly ``head``'s width)
        self.matches: Callable[[str], bool] = self._shortcut() or self.scan

    def scan(self, value: str) -> bool:
        head, tail = self.head, self.tail
        if tail is None:
            return len(value) == head.width and head.at(value, 0)
        end = len(value) - tail.width  # where the tail starts: at the very end
        if end < head.width or not head.at(value, 0) or not tail.at(value, end):
            return False
        place = head.width
        for piece in self.middle:
            found = piece.find(value, place, end)
            if found < 0:
                return False
            place = found + piece.width
        return True

    def _shortcut(self) -> Callable[[str], bool] | None:
        texts = [piece.text for piece in (self.head, *self.middle, *([self.tail] if self.tail else []))]
        if len(self.middle) > 1 or None in texts:
            return None
        head, *rest = (text or "" for text in texts)
        if not rest:
            return lambda value: value == head
        *inner, tail = rest
        if not inner:
            width = len(head) + len(tail)
            return lambda value: len(value) >= width and value.startswith(head) and value.endswith(tail)
        (between,) = inner
        start, width = len(head), len(head) + len(between) + len(tail)
        return lambda value: (
            len(value) >= width
            and value.startswith(head)
            and value.endswith(tail)
            and value.find(between, start, len(value) - len(tail)) >= 0
        )


@lru_cache(maxsize=1024)
def like_pattern(pattern: str, escape: str | None) -> LikePattern:
    """``pattern`` compiled; ``escape`` (one character, or None for none) makes the character after it literal."""
    if escape is not None and len(escape) != 1:
        raise PatternError(f"the ESCAPE character must be one character, got {escape!r}")
    pieces: list[list[str | None]] = [[]]
    chars = iter(pattern)
    for char in chars:
        if escape is not None and char == escape:
            literal = next(chars, None)
            if literal is None:
                raise PatternError(f"the pattern {pattern!r} ends with its escape character {escape!r}")
            pieces[-1].append(literal)
        elif char == "%":
            pieces.append([])
        else:
            pieces[-1].append(_ANY if char == "_" else char)
    head, *rest = (_Piece(piece) for piece in pieces)
    if not rest:
        return LikePattern(head, (), None)
    *middle, tail = rest
    return LikePattern(head, tuple(p for p in middle if p.width), tail)
