"""``oncebus serve`` runs on uvloop where it is installed, on asyncio's loop with ``ONCEBUS_EVENT_LOOP=asyncio``,
and a Service Bus client cannot tell them apart (server/loop.py). The rest of the suite runs on the default;
``.ci/run`` runs the AMQP wire suites once more on asyncio's loop."""

from __future__ import annotations

import importlib.util

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode

from oncebus.server import loop
from oncebus.testing import Mode, serve

pytestmark = pytest.mark.skipif(importlib.util.find_spec("uvloop") is None, reason="uvloop is not built here")


def _round_trip(connection_string: str, queue: str) -> list[str]:
    with ServiceBusClient.from_connection_string(connection_string) as client:
        with client.get_queue_sender(queue) as sender:
            sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"id{i % 3}") for i in range(5)])
        with client.get_queue_receiver(queue, receive_mode=ServiceBusReceiveMode.PEEK_LOCK) as receiver:
            got = receiver.receive_messages(max_message_count=10, max_wait_time=5)
            for message in got:
                receiver.complete_message(message)
            return [str(m) for m in got]


@pytest.mark.parametrize("mode", ["subprocess", "thread"])
@pytest.mark.parametrize("chosen", [None, "asyncio", "uvloop"])
def test_serve_runs_on_the_loop_chosen_and_a_client_sees_the_same_broker(
    monkeypatch: pytest.MonkeyPatch, mode: Mode, chosen: str | None
) -> None:
    if chosen is None:
        monkeypatch.delenv("ONCEBUS_EVENT_LOOP", raising=False)
    else:
        monkeypatch.setenv("ONCEBUS_EVENT_LOOP", chosen)
    config = {
        "UserConfig": {
            "Namespaces": [
                {"Name": "sbemulatorns", "Queues": [{"Name": "q", "Properties": {"RequiresDuplicateDetection": True}}]}
            ]
        }
    }
    with serve(mode=mode, config=config) as server:
        assert server.info["event_loop"] == (chosen or "uvloop")
        assert _round_trip(server.connection_string, "q") == ["m0", "m1", "m2"]  # m3, m4: duplicates


def test_the_default_is_uvloop_where_installed() -> None:
    assert loop.default() == "uvloop" and loop.available("asyncio")
    assert loop.run(_which()) == "uvloop" and loop.run(_which(), "asyncio") == "asyncio"


async def _which() -> str:
    return loop.running()


def test_without_uvloop_serve_takes_asyncios_loop_and_refuses_to_be_told_uvloop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where uvloop is not built (Windows), the default is asyncio's loop, and asking for uvloop is one clear line."""
    from oncebus.server import settings

    def without_uvloop(name: loop.EventLoop) -> bool:
        return name == "asyncio"

    monkeypatch.setattr(loop, "available", without_uvloop)
    monkeypatch.setattr(settings, "available", without_uvloop)
    assert loop.default() == "asyncio" and loop.run(_which()) == "asyncio"
    assert settings.Settings.from_environ({"ONCEBUS_EVENT_LOOP": "asyncio"}).event_loop == "asyncio"
    with pytest.raises(settings.SettingsError, match=r"ONCEBUS_EVENT_LOOP='uvloop': uvloop is not installed here"):
        settings.Settings.from_environ({"ONCEBUS_EVENT_LOOP": "uvloop"})
