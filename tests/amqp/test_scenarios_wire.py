"""Every scenario of tests/data/scenarios.json over the wire, with the real SDK.

The server is ``oncebus serve`` run as a subprocess whose clock the test sets
(``ONCEBUS_CLOCK_FILE``: the broker reads its time from that file), so steps
happen at their exact offsets; one more test waits for a real 20 s window
against the system clock (marked slow).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode, ServiceBusSender
from azure.servicebus.amqp import AmqpAnnotatedMessage
from azure.servicebus.exceptions import ServiceBusError

from oncebus.core.timeutil import us_to_datetime
from tests.amqp.conftest import ServerProcess, TestClock, topology
from tests.scenarios import delivered_tuple, expected_delivered, load_scenarios

SCENARIOS = load_scenarios()
_PROPERTY_NAMES = {
    "requires_duplicate_detection": "RequiresDuplicateDetection",
    "duplicate_detection_history_time_window": "DuplicateDetectionHistoryTimeWindow",
    "enable_partitioning": "EnablePartitioning",
}


def queue_name(scenario: dict[str, Any]) -> str:
    return str(scenario["name"]).replace("_", "-")


@pytest.fixture(scope="module")
def clocked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, TestClock]]:
    base = tmp_path_factory.mktemp("clocked")
    clock = TestClock(base / "clock")
    queues = {queue_name(s): {_PROPERTY_NAMES[k]: v for k, v in s["entity"].items()} for s in SCENARIOS}
    process = ServerProcess(base / "data", topology(queues, {}), clock_file=clock.path).start()
    yield process, clock
    process.stop()


def sdk_message(fields: dict[str, Any]) -> ServiceBusMessage | AmqpAnnotatedMessage:
    session_id, partition_key = fields.get("session_id"), fields.get("partition_key")
    if session_id is not None and partition_key is not None and session_id != partition_key:
        # the SDK refuses to build this; another client may still send it
        properties = {"message_id": fields["message_id"], "group_id": session_id}
        return AmqpAnnotatedMessage(
            data_body=b"body", properties=properties, annotations={"x-opt-partition-key": partition_key}
        )
    return ServiceBusMessage(b"body", **fields)


def received(client: ServiceBusClient, queue: str, *, complete: bool) -> list[tuple[str, str | None]]:
    mode = ServiceBusReceiveMode.PEEK_LOCK if complete else ServiceBusReceiveMode.RECEIVE_AND_DELETE
    out = []
    with client.get_queue_receiver(queue, receive_mode=mode) as receiver:
        while True:
            batch = receiver.receive_messages(max_message_count=20, max_wait_time=1)
            if not batch:
                return out
            for message in batch:
                out.append(
                    delivered_tuple(
                        {
                            "message_id": message.message_id,
                            "partition_key": message.partition_key,
                            "session_id": message.session_id,
                        }
                    )
                )
                if complete:
                    receiver.complete_message(message)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s["name"] for s in SCENARIOS])
def test_scenario_over_the_wire(clocked: tuple[ServerProcess, TestClock], scenario: dict[str, Any]) -> None:
    server, clock = clocked
    queue = queue_name(scenario)
    start_us = clock.now_us + 1_000_000
    delivered: list[tuple[str, str | None]] = []
    client = ServiceBusClient.from_connection_string(server.connection_string, retry_total=0)
    sender: ServiceBusSender = client.get_queue_sender(queue)
    try:
        for step in scenario["steps"]:
            clock.set(start_us + round(step["at"] * 1_000_000))
            if "restart" in step:
                sender.close()
                client.close()
                server.restart()
                client = ServiceBusClient.from_connection_string(server.connection_string, retry_total=0)
                sender = client.get_queue_sender(queue)
            elif "set_window" in step:
                server.cli("queue", "update", queue, "--window", step["set_window"])
            elif "receive_complete" in step:
                delivered += received(client, queue, complete=True)
            elif "advance" in step:
                pass
            else:
                if "send" in step:
                    payload: Any = sdk_message(step["send"])
                elif "batch" in step:
                    payload = sender.create_message_batch()
                    for fields in step["batch"]:
                        payload.add_message(sdk_message(fields))
                else:
                    payload = sdk_message(step["schedule"])
                if step.get("error"):
                    with pytest.raises(ServiceBusError):
                        sender.send_messages(payload)
                elif "schedule" in step:
                    when = us_to_datetime(start_us) + timedelta(seconds=step["at"] + step["enqueue_after"])
                    sender.schedule_messages(payload, when)
                else:
                    sender.send_messages(payload)
        delivered += received(client, queue, complete=False)
    finally:
        sender.close()
        client.close()
    assert delivered == expected_delivered(scenario)


@pytest.mark.slow
def test_real_twenty_second_window_expires(server: ServerProcess) -> None:
    """No clock tricks: ``oncebus serve`` on the real clock, a PT20S window, a resend after 20 s is new."""
    with ServiceBusClient.from_connection_string(server.connection_string) as client:
        with client.get_queue_sender("window20") as sender:
            sender.send_messages(ServiceBusMessage(b"first", message_id="w"))
            first = time.monotonic()
            sender.send_messages(ServiceBusMessage(b"duplicate", message_id="w"))
            time.sleep(max(0.0, 20.5 - (time.monotonic() - first)))
            sender.send_messages(ServiceBusMessage(b"after the window", message_id="w"))
        assert received(client, "window20", complete=False) == [("w", None), ("w", None)]
