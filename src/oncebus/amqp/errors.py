"""Broker errors as AMQP conditions and management status codes."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import proton

from oncebus.core import errors

_LOG = logging.getLogger(__name__)

INTERNAL_ERROR = "amqp:internal-error"
TRACKING_ID = proton.symbol("com.microsoft:tracking-id")

_STATUS: list[tuple[type[errors.OncebusError], int]] = [
    (errors.EntityNotFoundError, 404),
    (errors.MessageNotFoundError, 404),
    (errors.MessageLockLostError, 410),
    (errors.SessionLockLostError, 410),
    (errors.SessionCannotBeLockedError, 409),
    (errors.EntityAlreadyExistsError, 409),
    (errors.UnauthorizedError, 401),
    (errors.OperationTimeoutError, 408),
    (errors.ServerBusyError, 503),
    (errors.QuotaExceededError, 403),
    (errors.InvalidArgumentError, 400),
]


def condition_of(exc: BaseException) -> proton.Condition:
    """The AMQP error for ``exc`` (an unexpected exception is logged and reported as an internal error)."""
    # the info map is always present: the SDK reads the error's third field unconditionally
    info: dict[Any, Any] = {TRACKING_ID: str(uuid.uuid4())}
    if isinstance(exc, errors.OncebusError):
        return proton.Condition(exc.condition, str(exc) or type(exc).__name__, info)
    _LOG.error("unexpected failure", exc_info=exc)
    return proton.Condition(INTERNAL_ERROR, f"oncebus failed: {type(exc).__name__}: {exc}", info)


def status_of(exc: BaseException) -> int:
    """The management response status code for ``exc``."""
    for kind, status in _STATUS:
        if isinstance(exc, kind):
            return status
    return 500
