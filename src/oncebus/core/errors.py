"""The one exception tree of oncebus.

Each error class carries, once, how Service Bus answers it on the wire: ``condition``, the AMQP error
condition (a link, disposition or connection error, and the ``error-condition`` of a ``$management``
response), and ``status``, the status code of the administration API over HTTP and of ``$management``
responses over AMQP, as Azure answers. ``data_plane_status`` is set where Azure's REST data plane (send,
peek-lock, settle over HTTP) documents another code for the same failure. Every door reads these
(:func:`status_of`); none keeps a table of its own::

    class                               condition (amqp: or com.microsoft:)  status
    OncebusError                        internal-error                       500
    ├── InvalidArgumentError            argument-error                       400  bad input, nothing stored
    │   ├── ArgumentOutOfRangeError     argument-out-of-range                400  a number outside its range
    │   ├── ImmutablePropertyError      argument-error                       400  a property fixed at creation
    │   ├── SqlExpressionError          argument-error                       400  a rule's SQL
    │   ├── InvalidOperationError       not-allowed                          400  refused in this context
    │   └── MessageSizeExceededError    link:message-size-exceeded           403  over the entity's limit
    ├── EntityNotFoundError             not-found                            404  (REST data plane: 410)
    ├── EntityAlreadyExistsError        entity-already-exists                409
    ├── EntityDisabledError             entity-disabled                      403  Disabled, Send/ReceiveDisabled
    ├── MessageNotFoundError            message-not-found                    404
    ├── MessageLockLostError            message-lock-lost                    410  (REST data plane: 404)
    ├── SessionLockLostError            session-lock-lost                    410
    ├── SessionCannotBeLockedError      session-cannot-be-locked             409
    ├── OperationTimeoutError           timeout                              408
    ├── UnauthorizedError               unauthorized-access                  401
    ├── NotImplementedFeatureError      not-implemented                      501  a feature oncebus lacks
    ├── ServerBusyError                 server-busy                          503
    │   └── StoreWriteError             server-busy                          503  nothing of the call stored
    ├── QuotaExceededError              resource-limit-exceeded              403  max_size_in_megabytes
    └── StoreError                      internal-error                       500  the store cannot be read
        └── DataDirBusyError            internal-error                       500  another process has it

Errors defined beside the code that raises them (transactions, faults, the serve process, the test
harness) subclass these and declare their own pair.
"""

from __future__ import annotations

from typing import ClassVar


class OncebusError(Exception):
    """Base of every error oncebus raises on purpose."""

    condition: ClassVar[str] = "amqp:internal-error"
    """The AMQP error condition Service Bus answers with."""
    status: ClassVar[int] = 500
    """The HTTP status code (the administration API; ``$management`` responses over AMQP)."""
    data_plane_status: ClassVar[int | None] = None
    """The REST data plane's status code where Azure documents another one (None: ``status``)."""


class InvalidArgumentError(OncebusError, ValueError):
    condition = "com.microsoft:argument-error"
    status = 400


class ArgumentOutOfRangeError(InvalidArgumentError):
    condition = "com.microsoft:argument-out-of-range"
    status = 400


class ImmutablePropertyError(InvalidArgumentError):
    """Azure answers HTTP 400 SubCode=40000 for these."""

    condition = "com.microsoft:argument-error"
    status = 400


class SqlExpressionError(InvalidArgumentError):
    """A SQL filter or action refused when the rule is created, naming where and what was expected.

    ``line`` and ``column`` are 1-based positions in ``expression``; ``expected``
    lists what could have come there (empty when the text parsed but means
    nothing, such as an unknown ``sys.`` property).
    """

    condition = "com.microsoft:argument-error"
    status = 400

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


class InvalidOperationError(InvalidArgumentError):
    """What Service Bus reports as an InvalidOperationException: a request well formed but not allowed here (a
    message without a session id sent to an entity that requires sessions, a partition key that differs from the
    session id, a receiver without a session on such an entity). Over AMQP ``amqp:not-allowed``, which the SDKs
    take as final (the Go SDK retries a condition it does not know, such as ``argument-error``, on new
    connections)."""

    condition = "amqp:not-allowed"
    status = 400


class MessageSizeExceededError(InvalidArgumentError):
    """Azure's REST: 403, "Quota exceeded or message too large"."""

    condition = "amqp:link:message-size-exceeded"
    status = 403


class EntityNotFoundError(OncebusError, LookupError):
    """Azure's REST data plane: 410, "Specified queue or topic doesn't exist"."""

    condition = "amqp:not-found"
    status = 404
    data_plane_status = 410


class EntityAlreadyExistsError(OncebusError):
    condition = "com.microsoft:entity-already-exists"
    status = 409


class MessageNotFoundError(OncebusError, LookupError):
    condition = "com.microsoft:message-not-found"
    status = 404


class MessageLockLostError(OncebusError):
    """Azure's REST data plane: 404, "No message was found with the specified MessageId or LockToken"."""

    condition = "com.microsoft:message-lock-lost"
    status = 410
    data_plane_status = 404


class SessionLockLostError(OncebusError):
    condition = "com.microsoft:session-lock-lost"
    status = 410


class SessionCannotBeLockedError(OncebusError):
    condition = "com.microsoft:session-cannot-be-locked"
    status = 409


class EntityDisabledError(OncebusError):
    """The entity's status (Disabled, SendDisabled, ReceiveDisabled) refuses the operation (Azure: 403,
    MessagingEntityDisabled)."""

    condition = "com.microsoft:entity-disabled"
    status = 403


class OperationTimeoutError(OncebusError, TimeoutError):
    condition = "com.microsoft:timeout"
    status = 408


class UnauthorizedError(OncebusError, PermissionError):
    condition = "amqp:unauthorized-access"
    status = 401


class NotImplementedFeatureError(OncebusError):
    """A Service Bus feature that oncebus does not offer yet."""

    condition = "amqp:not-implemented"
    status = 501


class ServerBusyError(OncebusError):
    condition = "com.microsoft:server-busy"
    status = 503


class StoreWriteError(ServerBusyError):
    """The durable store refused a write (disk full, I/O error): nothing of the call was stored; retry later."""

    condition = "com.microsoft:server-busy"
    status = 503


class QuotaExceededError(OncebusError):
    condition = "amqp:resource-limit-exceeded"
    status = 403


class StoreError(OncebusError):
    condition = "amqp:internal-error"
    status = 500


class DataDirBusyError(StoreError, RuntimeError):
    """Another process holds the store (a data directory's ``oncebus serve``, a CLI command, a program that opened
    the same SQLite file): one process owns a store, others reach it through that process."""

    condition = "amqp:internal-error"
    status = 500


def status_of(error: BaseException, *, data_plane: bool = False) -> int:
    """The HTTP status code for ``error``: its class's (``data_plane``: as the REST data plane answers it);
    500 for an error outside the tree (a failure, not a refusal)."""
    if not isinstance(error, OncebusError):
        return 500
    if data_plane and error.data_plane_status is not None:
        return error.data_plane_status
    return error.status


def named(where: str, exc: InvalidArgumentError) -> InvalidArgumentError:
    """``exc`` with ``where`` (the rule, entity or field it concerns) in front of its message, once."""
    if str(exc).startswith(where):
        return exc
    if isinstance(exc, SqlExpressionError):
        return SqlExpressionError(
            f"{where}: {exc}", expression=exc.expression, line=exc.line, column=exc.column, expected=exc.expected
        )
    return InvalidArgumentError(f"{where}: {exc}")
