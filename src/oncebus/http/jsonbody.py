"""JSON read from a request (a header, a body): every way it can be wrong is a 400 naming what was expected."""

from __future__ import annotations

import json
from typing import Any

from oncebus.core.errors import InvalidArgumentError


def parse_json(data: bytes | str, what: str, expected: str) -> Any:
    """``data`` parsed, or InvalidArgumentError naming ``what`` it is and what was ``expected`` of it.

    Nesting deeper than the parser's recursion allows (thousands of ``[``) is refused as such, not a failure.
    """
    try:
        return json.loads(data)
    except RecursionError:
        raise InvalidArgumentError(f"{what} is nested too deeply to read; {what} is {expected}") from None
    except (ValueError, UnicodeDecodeError) as exc:  # not JSON, not UTF-8, a number past Python's 4300 digits
        raise InvalidArgumentError(f"{what} is not valid JSON ({exc}); {what} is {expected}") from None
