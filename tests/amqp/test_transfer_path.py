"""Following one transfer's payload from the socket to the broker: how often it enters the codec and the encoding
module (issue 34: "the codec is entered five times and the encoding module three for one decode").

Method: the AMQP listener runs in this process (its own loop thread); ``sys.setprofile`` on that thread sees every
Python call from the ``data_received`` that carries an SDK's transfer of one realistic message (subject, content
type, correlation id, four application properties) up to the broker's ``Namespace.send``. A module is *entered*
when a function of it is called from a function of another module (its calls to itself are not counted).
``python -m tests.amqp.test_transfer_path`` prints the entries one by one.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from oncebus.amqp.limits import AmqpLimits
from oncebus.amqp.sas import connection_string
from tests.amqp.inprocess import InProcessServer

_AMQP = str(Path("oncebus") / "amqp")
MODULES = {"codec": f"{_AMQP}/codec.py", "encoding": f"{_AMQP}/encoding.py"}
# what this engine does (measured); an increase is a step back, a decrease updates the figure here and in
# docs/performance-log.md ("Where the bytes are parsed")
MOST = {"codec": 1, "encoding": 1}


def _realistic(index: int) -> ServiceBusMessage:
    return ServiceBusMessage(
        b"x" * 1024,
        message_id=f"m{index}",
        subject="order.created",
        content_type="application/json",
        correlation_id=f"c{index}",
        application_properties={"tenant": "contoso", "attempt": 1, "priority": True, "amount": 9.5},
    )


class _Entries:
    """Calls into the watched modules from elsewhere, between the transfer's arrival and the broker's send."""

    def __init__(self) -> None:
        self.armed = False
        self.active = False
        self.done = threading.Event()
        self.entries: list[tuple[str, str, str]] = []  # (module, function entered, the caller's function)

    def hook(self, frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call" or not self.armed or self.done.is_set():
            return
        code = frame.f_code
        if not self.active:
            self.active = code.co_name == "data_received" and code.co_filename.endswith(f"{_AMQP}/connection.py")
            return
        if code.co_name == "send" and code.co_filename.endswith(str(Path("oncebus") / "broker" / "namespace.py")):
            self.done.set()
            return
        caller = frame.f_back
        for name, path in MODULES.items():
            if code.co_filename.endswith(path) and (caller is None or not caller.f_code.co_filename.endswith(path)):
                self.entries.append((name, code.co_name, caller.f_code.co_name if caller is not None else "?"))

    def count(self, name: str) -> int:
        return sum(1 for module, _, _ in self.entries if module == name)


def follow_one_transfer() -> _Entries:
    server = InProcessServer(AmqpLimits(), ["q"]).start()
    entries = _Entries()
    try:
        server.loop.call_soon_threadsafe(sys.setprofile, entries.hook)
        conn_str = connection_string("127.0.0.1", server.port, "RootManageSharedAccessKey", "SAS_KEY_VALUE")
        with ServiceBusClient.from_connection_string(conn_str) as client, client.get_queue_sender("q") as sender:
            sender.send_messages(_realistic(0))  # warm: links open, the first message's one-time work done
            entries.armed = True
            sender.send_messages(_realistic(1))
            assert entries.done.wait(10), "the transfer never reached Namespace.send"
    finally:
        server.loop.call_soon_threadsafe(sys.setprofile, None)
        server.stop()
    return entries


@pytest.fixture(scope="module")
def followed() -> Iterator[_Entries]:
    yield follow_one_transfer()


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_transfer_enters_each_module_no_more_often_than_measured(followed: _Entries, module: str) -> None:
    entered = [entry for entry in followed.entries if entry[0] == module]
    assert len(entered) <= MOST[module], f"{module} entered {len(entered)} times: {entered}"


if __name__ == "__main__":
    found = follow_one_transfer()
    for module, function, caller in found.entries:
        print(f"{module:9} {function:32} from {caller}")
    print(", ".join(f"{name} entered {found.count(name)} times" for name in MODULES))
