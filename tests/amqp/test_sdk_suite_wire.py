"""What the Python SDK's own data-plane tests (azure-servicebus 7.15.0, ``tests/test_queues.py`` and
``tests/test_sessions.py``) found that oncebus answered differently from Service Bus, each with the SDK (issue 35)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusMessageState, ServiceBusReceiveMode
from azure.servicebus.exceptions import ServiceBusError

from tests.amqp.conftest import ServerProcess, topology

LOCK_TOKEN = b"x-opt-lock-token"
QUEUES: dict[str, dict[str, Any]] = {"annotated": {}, "sessioned": {"RequiresSession": True}, "plain": {}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(tmp_path_factory.mktemp("suite") / "data", topology(QUEUES, {})).start()
    yield process
    process.stop()


def test_a_peek_lock_delivery_carries_its_lock_token_and_the_senders_delivery_annotations(
    server: ServerProcess,
) -> None:
    """test_queues.py: ``message.lock_token == message.message.delivery_annotations.get(b"x-opt-lock-token")``, and a
    sender's delivery annotations come back. Failed before: no delivery annotations on an ordinary delivery."""
    with ServiceBusClient.from_connection_string(server.connection_string) as client:
        message = ServiceBusMessage(b"annotated", message_id="a-1")
        message.raw_amqp_message.delivery_annotations = {b"delivery_annotations": 3}
        with client.get_queue_sender("annotated") as sender:
            sender.send_messages(message)
            sender.send_messages(ServiceBusMessage(b"plain", message_id="a-2"))
        with client.get_queue_receiver("annotated", max_wait_time=5) as receiver:
            got = receiver.receive_messages(max_message_count=2, max_wait_time=5)
            assert [m.message_id for m in got] == ["a-1", "a-2"]
            for received in got:
                annotations = received.raw_amqp_message.delivery_annotations
                assert received.lock_token == annotations.get(LOCK_TOKEN)
                assert received.lock_token == uuid.UUID(bytes_le=received.message.delivery_tag)
            assert got[0].raw_amqp_message.delivery_annotations.get(b"delivery_annotations") == 3
            for received in got:
                receiver.complete_message(received)


def test_a_receive_and_delete_delivery_keeps_the_senders_delivery_annotations(server: ServerProcess) -> None:
    with ServiceBusClient.from_connection_string(server.connection_string) as client:
        message = ServiceBusMessage(b"annotated", message_id="b-1")
        message.raw_amqp_message.delivery_annotations = {b"note": "kept"}
        with client.get_queue_sender("annotated") as sender:
            sender.send_messages(message)
        with client.get_queue_receiver(
            "annotated", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE, max_wait_time=5
        ) as receiver:
            [received] = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            annotations = received.raw_amqp_message.delivery_annotations or {}
            assert annotations.get(b"note") == b"kept" and LOCK_TOKEN not in annotations


def test_a_receiver_without_a_session_on_a_session_queue_is_refused_when_it_opens(server: ServerProcess) -> None:
    """test_sessions.py: ``get_queue_receiver(session_queue)._open_with_retry()`` raises ServiceBusError. Failed
    before: the link was accepted and refused only at its first receive."""
    with ServiceBusClient.from_connection_string(server.connection_string, retry_total=0) as client:
        receiver = client.get_queue_receiver("sessioned", max_wait_time=5)
        with pytest.raises(ServiceBusError) as refused:
            receiver._open_with_retry()
        assert "session" in str(refused.value).lower()
        receiver.close()
        with client.get_queue_receiver("sessioned", session_id="s1", max_wait_time=1) as session_receiver:
            assert session_receiver.receive_messages(max_wait_time=1) == []


def test_a_received_message_sent_again_keeps_its_partition_key(server: ServerProcess) -> None:
    """test_sessions.py (receive_handler_peeklock): a received message is sent again as it is. The SDK's AMQP layer
    reads strings as bytes, so the copy carries ``x-opt-partition-key`` as binary (its UTF-8); Service Bus takes it
    as that string. Failed before: refused ("the partition key ... must be a string, not binary")."""
    with ServiceBusClient.from_connection_string(server.connection_string) as client:
        message = ServiceBusMessage(b"again", message_id="p-1", session_id="s-again")
        message.partition_key = "s-again"
        with client.get_queue_sender("sessioned") as sender:
            sender.send_messages(message)
            with client.get_queue_receiver("sessioned", session_id="s-again", max_wait_time=5) as receiver:
                [received] = receiver.receive_messages(max_wait_time=5)
                assert received.raw_amqp_message.annotations[b"x-opt-partition-key"] == b"s-again"
                receiver.complete_message(received)
                sender.send_messages(received)  # as the SDK's test does
                [again] = receiver.receive_messages(max_wait_time=5)
                assert (again.message_id, again.partition_key, again.session_id) == ("p-1", "s-again", "s-again")
                assert again.sequence_number != received.sequence_number
                receiver.complete_message(again)


def test_deliveries_are_annotated_as_service_bus_annotates_them(server: ServerProcess) -> None:
    """test_message.py (the backcompat tests, which check the encoded size of what Service Bus sends): an active
    message carries no ``x-opt-message-state`` (the SDKs read Active when it is absent; a deferred one carries it),
    and a receive-and-delete delivery has an empty delivery-annotations section and an empty delivery tag (the SDK
    reads ``{}`` and None). Failed before: the state was always there (the peek-lock size was 23 bytes over) and
    receive-and-delete deliveries had no section and a random tag."""
    with ServiceBusClient.from_connection_string(server.connection_string) as client:
        with client.get_queue_sender("plain") as sender:
            sender.send_messages([ServiceBusMessage(b"a", message_id=f"st-{i}") for i in range(3)])
        with client.get_queue_receiver("plain", max_wait_time=5) as receiver:
            first, second = receiver.receive_messages(max_message_count=2, max_wait_time=5)
            assert b"x-opt-message-state" not in first.raw_amqp_message.annotations
            assert first.state == ServiceBusMessageState.ACTIVE
            receiver.defer_message(second)
            [deferred] = receiver.receive_deferred_messages([second.sequence_number])
            assert deferred.raw_amqp_message.annotations[b"x-opt-message-state"] == 1
            assert deferred.state == ServiceBusMessageState.DEFERRED
            receiver.complete_message(first)
            receiver.complete_message(deferred)
        with client.get_queue_receiver(
            "plain", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE, max_wait_time=5
        ) as receiver:
            [taken] = receiver.receive_messages(max_wait_time=5)
            assert taken.raw_amqp_message.delivery_annotations == {}
            assert taken.message.delivery_tag is None
            assert b"x-opt-message-state" not in taken.raw_amqp_message.annotations


def test_a_session_receiver_with_a_session_id_that_is_not_a_string_is_refused(server: ServerProcess) -> None:
    """test_sessions.py (receive_handler_peeklock): ``get_queue_receiver(queue, session_id=1)`` raises ServiceBusError
    when it opens: the SDK sends the int as the session filter and Service Bus refuses it. Failed before: oncebus
    took the session "1"."""
    with ServiceBusClient.from_connection_string(server.connection_string, retry_total=0) as client:
        receiver = client.get_queue_receiver("sessioned", session_id=1, max_wait_time=1)  # type: ignore[arg-type]
        with pytest.raises(ServiceBusError) as refused:
            with receiver:
                pass
        assert "session" in str(refused.value).lower() and "string" in str(refused.value)
        with client.get_queue_receiver("sessioned", session_id="1", max_wait_time=1) as receiver:
            assert receiver.receive_messages(max_wait_time=1) == []
