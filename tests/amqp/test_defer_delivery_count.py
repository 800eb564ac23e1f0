"""A deferral counts as a delivery attempt, as Service Bus counts it: a message deferred (or a deferred one given
back) once its delivery count has reached the entity's MaxDeliveryCount goes to the dead-letter queue with
``MaxDeliveryCountExceeded`` (Azure/azure-service-bus#375: with MaxDeliveryCount 1, ``defer`` dead-letters)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceivedMessage, ServiceBusSubQueue

from tests.amqp.conftest import ServerProcess, topology


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    queues = {"once": {"MaxDeliveryCount": 1}, "twice": {"MaxDeliveryCount": 2}, "abandoned": {"MaxDeliveryCount": 2}}
    process = ServerProcess(tmp_path_factory.mktemp("defer") / "data", topology(queues, {})).start()
    yield process
    process.stop()


def _send(client: ServiceBusClient, queue: str, message_id: str) -> None:
    with client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage("body", message_id=message_id))


def _held(client: ServiceBusClient, queue: str) -> list[ServiceBusReceivedMessage]:
    """What ``queue`` holds, peeked by a receiver of its own (a receiver peeks from what it last received)."""
    with client.get_queue_receiver(queue) as receiver:
        return receiver.peek_messages(max_message_count=10)


def _dead_letters(client: ServiceBusClient, queue: str) -> list[ServiceBusReceivedMessage]:
    with client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as receiver:
        return receiver.peek_messages(max_message_count=10)


def test_a_deferral_at_max_delivery_count_1_dead_letters(server: ServerProcess) -> None:
    with ServiceBusClient.from_connection_string(server.connection_string) as client:
        _send(client, "once", "d1")
        with client.get_queue_receiver("once", max_wait_time=5) as receiver:
            (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            assert message.delivery_count == 0
            receiver.defer_message(message)
            assert _held(client, "once") == []  # not held as deferred
        (dead,) = _dead_letters(client, "once")
        assert dead.message_id == "d1"
        assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"


def test_a_deferred_message_deferred_again_at_max_delivery_count_dead_letters(server: ServerProcess) -> None:
    with ServiceBusClient.from_connection_string(server.connection_string) as client:
        _send(client, "twice", "d2")
        with client.get_queue_receiver("twice", max_wait_time=5) as receiver:
            (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            receiver.defer_message(message)  # its first delivery: deferred
            (held,) = _held(client, "twice")
            assert held.message_id == "d2" and str(held.state).endswith("DEFERRED")
            assert _dead_letters(client, "twice") == []
            (again,) = receiver.receive_deferred_messages([message.sequence_number or 0])
            assert again.delivery_count == 1
            receiver.defer_message(again)  # its second delivery, at MaxDeliveryCount 2: dead-lettered
            assert _held(client, "twice") == []
        (dead,) = _dead_letters(client, "twice")
        assert dead.message_id == "d2"
        assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"


def test_a_deferred_message_abandoned_at_max_delivery_count_dead_letters(server: ServerProcess) -> None:
    with ServiceBusClient.from_connection_string(server.connection_string) as client:
        _send(client, "abandoned", "d3")
        with client.get_queue_receiver("abandoned", max_wait_time=5) as receiver:
            (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            receiver.defer_message(message)
            (again,) = receiver.receive_deferred_messages([message.sequence_number or 0])
            receiver.abandon_message(again)  # given back at its second delivery, MaxDeliveryCount 2
            assert _held(client, "abandoned") == []
        (dead,) = _dead_letters(client, "abandoned")
        assert dead.message_id == "d3"
        assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
