"""``devtools_testutils.aio``: the ``async`` test decorator."""

from __future__ import annotations

from .proxy import recorded_by_proxy_async

__all__ = ["recorded_by_proxy_async"]
