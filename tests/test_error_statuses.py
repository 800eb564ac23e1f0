"""Each error class of the one tree carries its HTTP status and its AMQP condition, declared once on the class,
and every door answers with them (issue 33 item 5): the administration API and the REST data plane over HTTP,
``$management`` responses and error conditions over AMQP. Before, HTTP and AMQP kept two tables that disagreed
(a timeout was 504 over HTTP and 408 over AMQP) and a disabled entity was in neither (a 500)."""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Iterator
from typing import Any

import pytest

from oncebus.amqp.errors import condition_of
from oncebus.amqp.management import error_response
from oncebus.broker import ManualClock, Namespace
from oncebus.core import errors
from oncebus.core.errors import OncebusError
from oncebus.http.admin import AdminApi
from oncebus.http.messages import RestMessaging
from oncebus.store.memory import MemoryStore

# every module that defines a class of the tree beside the code that raises it
DEFINING_MODULES = (
    "oncebus.broker.transactions",
    "oncebus.broker.faults",
    "oncebus.server.process",
    "oncebus.server.settings",
    "oncebus.spark._options",
    "oncebus.testing._client",
    "oncebus.testing._launch",
)


def _tree(root: type[OncebusError] = OncebusError) -> Iterator[type[OncebusError]]:
    yield root
    for sub in root.__subclasses__():
        yield from _tree(sub)


def error_classes() -> list[type[OncebusError]]:
    for name in DEFINING_MODULES:
        importlib.import_module(name)
    return sorted(set(_tree()), key=lambda cls: f"{cls.__module__}.{cls.__qualname__}")


def _instance(cls: type[OncebusError]) -> OncebusError:
    return cls(f"a {cls.__name__} for the test")


def test_the_tree_is_every_error_oncebus_raises() -> None:
    found = {cls.__name__ for cls in error_classes()}
    assert {"EntityDisabledError", "OperationTimeoutError", "TransactionTimeoutError", "ServeError"} <= found
    assert len(found) == len(error_classes())  # one name, one class


@pytest.mark.parametrize("cls", error_classes(), ids=lambda cls: cls.__name__)
def test_each_class_declares_one_status_and_one_condition(cls: type[OncebusError]) -> None:
    declared = vars(cls)
    assert "status" in declared and "condition" in declared, f"{cls.__name__} inherits its answer: declare it"
    assert isinstance(cls.status, int) and 400 <= cls.status <= 599
    assert cls.condition.startswith(("amqp:", "com.microsoft:"))
    if cls.data_plane_status is not None:
        assert 400 <= cls.data_plane_status <= 599 and cls.data_plane_status != cls.status
    if issubclass(cls, errors.InvalidArgumentError):
        assert cls.status in (400, 403)  # bad input is the caller's, never the server's
    if cls.status >= 500:
        assert not issubclass(cls, errors.InvalidArgumentError | errors.EntityDisabledError)


def _admin_status(exc: OncebusError) -> int:
    """The administration API's answer when handling a request raises ``exc``."""

    async def go() -> int:
        api = AdminApi(await Namespace.open(MemoryStore(), ManualClock()), {})

        def fail(*_: Any) -> Any:
            raise exc

        api._request = fail  # type: ignore[method-assign]
        reply = await api.handle({"method": "GET", "path": "/q", "headers": [], "query_string": b""}, b"")
        return reply.status

    return asyncio.run(go())


def _data_plane_status(exc: OncebusError) -> int:
    """The REST data plane's answer when handling a request raises ``exc``."""

    async def go() -> int:
        rest = RestMessaging(await Namespace.open(MemoryStore(), ManualClock()), {})  # type: ignore[arg-type]

        async def fail(*_: Any) -> Any:
            raise exc

        rest.handle = fail  # type: ignore[method-assign]
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(event: dict[str, Any]) -> None:
            sent.append(event)

        await rest({"method": "POST", "path": "/q/messages", "headers": []}, receive, send)
        return int(sent[0]["status"])

    return asyncio.run(go())


@pytest.mark.parametrize("cls", error_classes(), ids=lambda cls: cls.__name__)
def test_the_http_and_amqp_doors_answer_each_error_alike(cls: type[OncebusError]) -> None:
    exc = _instance(cls)
    response = error_response(exc)  # $management over AMQP
    properties = response.properties or {}
    assert properties["statusCode"] == cls.status
    assert str(properties["errorCondition"]) == cls.condition == condition_of(exc).name
    assert _admin_status(exc) == cls.status  # the administration API over HTTP
    assert _data_plane_status(exc) == (cls.data_plane_status or cls.status)  # the REST data plane


def test_the_answers_azure_documents() -> None:
    assert (errors.OperationTimeoutError.status, errors.OperationTimeoutError.condition) == (
        408,
        "com.microsoft:timeout",
    )
    assert (errors.EntityDisabledError.status, errors.EntityDisabledError.condition) == (
        403,
        "com.microsoft:entity-disabled",
    )
    assert errors.EntityNotFoundError.data_plane_status == 410  # "Specified queue or topic doesn't exist"
    assert errors.MessageSizeExceededError.status == 403  # "Quota exceeded or message too large"
    assert errors.MessageLockLostError.data_plane_status == 404  # "No message was found with the ... LockToken"
