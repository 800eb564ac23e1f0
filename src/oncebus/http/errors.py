"""The one map from oncebus's error tree to HTTP status codes (as Service Bus's REST API answers)."""

from __future__ import annotations

from oncebus.core.errors import (
    EntityAlreadyExistsError,
    EntityNotFoundError,
    InvalidArgumentError,
    MessageLockLostError,
    MessageNotFoundError,
    OncebusError,
    OperationTimeoutError,
    QuotaExceededError,
    ServerBusyError,
    SessionCannotBeLockedError,
    SessionLockLostError,
    StoreError,
    UnauthorizedError,
)


class NotImplementedFeatureError(OncebusError):
    """A Service Bus feature that oncebus's administration API does not offer yet (HTTP 501)."""


# most specific first: the first class an error is an instance of decides
_STATUS: tuple[tuple[type[BaseException], int], ...] = (
    (InvalidArgumentError, 400),  # out-of-range values, immutable properties (SubCode=40000), bad bodies
    (UnauthorizedError, 401),
    (QuotaExceededError, 403),
    (EntityNotFoundError, 404),
    (MessageNotFoundError, 404),
    (EntityAlreadyExistsError, 409),
    (SessionCannotBeLockedError, 409),
    (MessageLockLostError, 410),
    (SessionLockLostError, 410),
    (NotImplementedFeatureError, 501),
    (ServerBusyError, 503),
    (OperationTimeoutError, 504),
    (StoreError, 500),
    (OncebusError, 500),
)


def status_of(error: BaseException) -> int:
    for kind, status in _STATUS:
        if isinstance(error, kind):
            return status
    return 500
