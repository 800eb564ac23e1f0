"""The public surface of ``oncebus``: what it exports, sorted, each name real, and one error tree.

A change to the surface is a change to this list: users import these names.
"""

from __future__ import annotations

import subprocess
import sys

import oncebus

EXPECTED = {
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
}


def test_all_is_sorted_and_is_the_expected_surface() -> None:
    assert oncebus.__all__ == sorted(oncebus.__all__)
    assert set(oncebus.__all__) == EXPECTED


def test_every_exported_name_is_defined_where_it_says() -> None:
    for name in oncebus.__all__:
        value = getattr(oncebus, name)
        if name != "__version__":
            assert value.__name__ == name, name
            assert value.__module__.startswith("oncebus."), (name, value.__module__)
    assert "Namespace" in dir(oncebus)


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        oncebus.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("oncebus.NoSuchThing resolved")


def test_every_exported_error_derives_from_the_one_root() -> None:
    errors = [getattr(oncebus, name) for name in oncebus.__all__ if name.endswith("Error")]
    assert len(errors) > 15
    for error in errors:
        assert issubclass(error, oncebus.OncebusError), error


def test_importing_oncebus_imports_neither_the_broker_nor_the_server() -> None:
    """Spark executors import ``oncebus.spark``, hence ``oncebus``: the names load when first used (only
    ``oncebus._compiled``, which chooses between the compiled modules and their sources and imports no other)."""
    code = "import sys, oncebus; print(sorted(m for m in sys.modules if m.startswith('oncebus')))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "['oncebus', 'oncebus._compiled']"


def test_the_spark_option_error_is_under_the_root_too() -> None:
    from oncebus.spark._options import OncebusOptionError

    assert issubclass(OncebusOptionError, oncebus.OncebusError)
    assert issubclass(OncebusOptionError, ValueError)  # as before
