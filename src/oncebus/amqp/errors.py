"""Broker errors as AMQP conditions and management status codes: each error class carries both
(:mod:`oncebus.core.errors`); this module only wraps them for proton."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import proton

from oncebus.core import errors

_LOG = logging.getLogger(__name__)

INTERNAL_ERROR = "amqp:internal-error"
TRACKING_ID = proton.symbol("com.microsoft:tracking-id")


def condition_of(exc: BaseException) -> proton.Condition:
    """The AMQP error for ``exc`` (an unexpected exception is logged and reported as an internal error)."""
    # the info map is always present: the SDK reads the error's third field unconditionally
    info: dict[Any, Any] = {TRACKING_ID: str(uuid.uuid4())}
    if isinstance(exc, errors.OncebusError):
        return proton.Condition(exc.condition, str(exc) or type(exc).__name__, info)
    _LOG.error("unexpected failure", exc_info=exc)
    return proton.Condition(INTERNAL_ERROR, f"oncebus failed: {type(exc).__name__}: {exc}", info)


status_of = errors.status_of
"""The management response status code for ``exc`` (its class's, as the HTTP doors answer it)."""
