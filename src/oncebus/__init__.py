"""oncebus: a local, self-hosted Azure Service Bus with exact, durable duplicate detection.

The public surface, importable from ``oncebus`` itself (what the README uses)::

    from oncebus import Message, Namespace, SqliteStore
    namespace = await Namespace.open(SqliteStore("oncebus.db"))

- the namespace (``Namespace``, ``SendOutcome``, ``SessionLock``) and its clocks (``SystemClock``,
  ``ManualClock``, the ``Clock`` protocol);
- the message (``Message``, ``ReceivedMessage``, ``MessageState``, ``ServiceBusReceiveMode``) and the
  entities' properties (``QueueProperties``, ``TopicProperties``, ``SubscriptionProperties``);
- the stores (``SqliteStore``, the embedded default; ``MemoryStore``, for fast tests);
- the error tree, rooted at ``OncebusError`` (drawn in :mod:`oncebus.core.errors`): every error oncebus
  raises on purpose derives from it, including ``ServeError`` (``oncebus serve`` could not start),
  ``DataDirBusyError`` (another process holds the data directory) and the test broker's
  ``BrokerStartError`` and ``BrokerGoneError``.

Names load when first used, so ``import oncebus.spark`` on a Spark executor does not import the broker.
The Spark side (``oncebus.spark``) and the test broker (``oncebus.testing``) are sub-packages of their own.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from oncebus import _compiled

__version__ = "0.1.0"

_compiled.choose()  # the compiled per-message modules, or their Python sources (ONCEBUS_PURE_PYTHON, stale ones)

_ERRORS = "oncebus.core.errors"
_WHERE: dict[str, str] = {
    "ArgumentOutOfRangeError": _ERRORS,
    "BrokerGoneError": "oncebus.testing._client",
    "BrokerStartError": "oncebus.testing._launch",
    "Clock": "oncebus.broker.clock",
    "DataDirBusyError": _ERRORS,
    "EntityAlreadyExistsError": _ERRORS,
    "EntityNotFoundError": _ERRORS,
    "ImmutablePropertyError": _ERRORS,
    "InvalidArgumentError": _ERRORS,
    "ManualClock": "oncebus.broker.clock",
    "MemoryStore": "oncebus.store.memory",
    "Message": "oncebus.core.messages",
    "MessageLockLostError": _ERRORS,
    "MessageNotFoundError": _ERRORS,
    "MessageSizeExceededError": _ERRORS,
    "MessageState": "oncebus.core.messages",
    "Namespace": "oncebus.broker.namespace",
    "OncebusError": _ERRORS,
    "OperationTimeoutError": _ERRORS,
    "QueueProperties": "oncebus.core.entities",
    "QuotaExceededError": _ERRORS,
    "ReceivedMessage": "oncebus.core.received",
    "SendOutcome": "oncebus.broker.sending",
    "ServeError": "oncebus.server.process",
    "ServerBusyError": _ERRORS,
    "ServiceBusReceiveMode": "oncebus.core.messages",
    "SessionCannotBeLockedError": _ERRORS,
    "SessionLock": "oncebus.broker.receivable",
    "SessionLockLostError": _ERRORS,
    "SqlExpressionError": _ERRORS,
    "SqliteStore": "oncebus.store.sqlite",
    "StoreError": _ERRORS,
    "StoreWriteError": _ERRORS,
    "SubscriptionProperties": "oncebus.core.entities",
    "SystemClock": "oncebus.broker.clock",
    "TopicProperties": "oncebus.core.entities",
    "UnauthorizedError": _ERRORS,
}

__all__ = [
    "ArgumentOutOfRangeError",
    "BrokerGoneError",
    "BrokerStartError",
    "Clock",
    "DataDirBusyError",
    "EntityAlreadyExistsError",
    "EntityNotFoundError",
    "ImmutablePropertyError",
    "InvalidArgumentError",
    "ManualClock",
    "MemoryStore",
    "Message",
    "MessageLockLostError",
    "MessageNotFoundError",
    "MessageSizeExceededError",
    "MessageState",
    "Namespace",
    "OncebusError",
    "OperationTimeoutError",
    "QueueProperties",
    "QuotaExceededError",
    "ReceivedMessage",
    "SendOutcome",
    "ServeError",
    "ServerBusyError",
    "ServiceBusReceiveMode",
    "SessionCannotBeLockedError",
    "SessionLock",
    "SessionLockLostError",
    "SqlExpressionError",
    "SqliteStore",
    "StoreError",
    "StoreWriteError",
    "SubscriptionProperties",
    "SystemClock",
    "TopicProperties",
    "UnauthorizedError",
    "__version__",
]

if TYPE_CHECKING:
    from oncebus.broker.clock import Clock, ManualClock, SystemClock
    from oncebus.broker.namespace import Namespace
    from oncebus.broker.receivable import SessionLock
    from oncebus.broker.sending import SendOutcome
    from oncebus.core.entities import QueueProperties, SubscriptionProperties, TopicProperties
    from oncebus.core.errors import (
        ArgumentOutOfRangeError,
        DataDirBusyError,
        EntityAlreadyExistsError,
        EntityNotFoundError,
        ImmutablePropertyError,
        InvalidArgumentError,
        MessageLockLostError,
        MessageNotFoundError,
        MessageSizeExceededError,
        OncebusError,
        OperationTimeoutError,
        QuotaExceededError,
        ServerBusyError,
        SessionCannotBeLockedError,
        SessionLockLostError,
        SqlExpressionError,
        StoreError,
        StoreWriteError,
        UnauthorizedError,
    )
    from oncebus.core.messages import Message, MessageState, ServiceBusReceiveMode
    from oncebus.core.received import ReceivedMessage
    from oncebus.server.process import ServeError
    from oncebus.store.memory import MemoryStore
    from oncebus.store.sqlite import SqliteStore
    from oncebus.testing._client import BrokerGoneError
    from oncebus.testing._launch import BrokerStartError


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'oncebus' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
