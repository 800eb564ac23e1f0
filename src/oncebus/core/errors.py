"""The one exception tree of oncebus.

Each error carries the Service Bus / AMQP error condition it maps to on the
wire, so front ends translate without knowing the rule that raised it::

    OncebusError
    ├── InvalidArgumentError          (ValueError; bad input, nothing stored)
    │   ├── ArgumentOutOfRangeError   (a number or duration outside its range)
    │   ├── ImmutablePropertyError    (an update of a property fixed at creation)
    │   ├── SqlExpressionError        (a rule's SQL filter or action that does not parse or make sense)
    │   └── MessageSizeExceededError  (a message or batch over the entity's limit)
    ├── EntityNotFoundError
    ├── EntityAlreadyExistsError
    ├── MessageNotFoundError
    ├── MessageLockLostError
    ├── SessionLockLostError
    ├── SessionCannotBeLockedError
    ├── OperationTimeoutError
    ├── UnauthorizedError
    ├── ServerBusyError
    │   └── StoreWriteError           (the store could not write, e.g. disk full: nothing of the call is stored)
    ├── QuotaExceededError           (the entity is full: max_size_in_megabytes)
    └── StoreError                    (the durable store cannot be opened or read)
"""

from __future__ import annotations


class OncebusError(Exception):
    """Base of every error oncebus raises on purpose."""

    condition: str = "amqp:internal-error"


class InvalidArgumentError(OncebusError, ValueError):
    condition = "com.microsoft:argument-error"


class ArgumentOutOfRangeError(InvalidArgumentError):
    condition = "com.microsoft:argument-out-of-range"


class ImmutablePropertyError(InvalidArgumentError):
    """Azure answers HTTP 400 SubCode=40000 for these."""

    condition = "com.microsoft:argument-error"


class SqlExpressionError(InvalidArgumentError):
    """A SQL filter or action refused when the rule is created, naming where and what was expected.

    ``line`` and ``column`` are 1-based positions in ``expression``; ``expected``
    lists what could have come there (empty when the text parsed but means
    nothing, such as an unknown ``sys.`` property).
    """

    condition = "com.microsoft:argument-error"

    def __init__(
        self,
        message: str,
        *,
        expression: str = "",
        line: int = 1,
        column: int = 1,
        expected: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message)
        self.expression = expression
        self.line = line
        self.column = column
        self.expected = expected


class MessageSizeExceededError(InvalidArgumentError):
    condition = "amqp:link:message-size-exceeded"


class EntityNotFoundError(OncebusError, LookupError):
    condition = "amqp:not-found"


class EntityAlreadyExistsError(OncebusError):
    condition = "com.microsoft:entity-already-exists"


class MessageNotFoundError(OncebusError, LookupError):
    condition = "com.microsoft:message-not-found"


class MessageLockLostError(OncebusError):
    condition = "com.microsoft:message-lock-lost"


class SessionLockLostError(OncebusError):
    condition = "com.microsoft:session-lock-lost"


class SessionCannotBeLockedError(OncebusError):
    condition = "com.microsoft:session-cannot-be-locked"


class EntityDisabledError(OncebusError):
    """The entity's status (Disabled, SendDisabled, ReceiveDisabled) refuses the operation."""

    condition = "com.microsoft:entity-disabled"


class OperationTimeoutError(OncebusError, TimeoutError):
    condition = "com.microsoft:timeout"


class UnauthorizedError(OncebusError, PermissionError):
    condition = "amqp:unauthorized-access"


class ServerBusyError(OncebusError):
    condition = "com.microsoft:server-busy"


class StoreWriteError(ServerBusyError):
    """The durable store refused a write (disk full, I/O error): nothing of the call was stored; retry later."""


class QuotaExceededError(OncebusError):
    condition = "amqp:resource-limit-exceeded"


class StoreError(OncebusError):
    condition = "amqp:internal-error"


class DataDirBusyError(StoreError, RuntimeError):
    """Another process holds the store (a data directory's ``oncebus serve``, a CLI command, a program that opened
    the same SQLite file): one process owns a store, others reach it through that process."""


def named(where: str, exc: InvalidArgumentError) -> InvalidArgumentError:
    """``exc`` with ``where`` (the rule, entity or field it concerns) in front of its message, once."""
    if str(exc).startswith(where):
        return exc
    if isinstance(exc, SqlExpressionError):
        return SqlExpressionError(
            f"{where}: {exc}", expression=exc.expression, line=exc.line, column=exc.column, expected=exc.expected
        )
    return InvalidArgumentError(f"{where}: {exc}")
