"""``recorded_by_proxy``: live, the test is called with the keyword arguments it takes, nothing recorded.

The wrappers keep no ``__wrapped__``: pytest reads a test's fixtures from the signature it finds, and the
arguments a preparer makes (``servicebus_fully_qualified_namespace``, ...) are not fixtures.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from .sanitizers import set_custom_default_matcher

__all__ = ["accepted", "recorded_by_proxy", "recorded_by_proxy_async", "set_custom_default_matcher"]


def accepted(function: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments ``function`` takes (all of them if it has ``**kwargs``)."""
    parameters = inspect.signature(function).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return dict(kwargs)
    names = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {k: v for k, v in kwargs.items() if k in names}


def recorded_by_proxy(test: Callable[..., Any]) -> Callable[..., Any]:
    def live(*args: Any, **kwargs: Any) -> Any:
        return test(*args, **accepted(test, kwargs))

    live.__name__, live.__qualname__, live.__doc__ = test.__name__, test.__qualname__, test.__doc__
    return live


def recorded_by_proxy_async(test: Callable[..., Any]) -> Callable[..., Any]:
    async def live(*args: Any, **kwargs: Any) -> Any:
        return await test(*args, **accepted(test, kwargs))

    live.__name__, live.__qualname__, live.__doc__ = test.__name__, test.__qualname__, test.__doc__
    return live
