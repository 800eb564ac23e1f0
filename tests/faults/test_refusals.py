"""Faults that refuse an operation before it is done: server busy, a dropped connection, a detached link.
Nothing of the refused send is stored; the SDK's retry policy sends it again."""

from __future__ import annotations

from datetime import timedelta

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusConnectionError, ServiceBusServerBusyError

from oncebus.testing import OncebusServer
from tests.faults.conftest import client, drain


def test_server_busy_reaches_the_sdk_as_its_own_error_and_stores_nothing(server: OncebusServer) -> None:
    server.create_queue("orders")
    server.arm_fault("server-busy", "orders", count=2)
    with client(server, retry_total=0) as sb, sb.get_queue_sender("orders") as sender:
        with pytest.raises(ServiceBusServerBusyError, match="throttled"):
            sender.send_messages(ServiceBusMessage("o1", message_id="o1"))
        assert server.stats("orders")["active_message_count"] == 0
    with client(server) as sb, sb.get_queue_sender("orders") as sender:  # the second firing, then the retry
        sender.send_messages(ServiceBusMessage("o1", message_id="o1"))
    assert server.faults() == []
    assert drain(server, "orders") == ["o1"]


def test_server_busy_on_a_completion_leaves_the_message_locked_for_a_second_try(server: OncebusServer) -> None:
    server.create_queue("orders")
    with client(server, retry_total=0) as sb:  # with retries, the SDK's own retry completes it
        with sb.get_queue_sender("orders") as sender:
            sender.send_messages(ServiceBusMessage("o1"))
        server.arm_fault("server-busy", "orders")
        with sb.get_queue_receiver("orders") as receiver:
            (message,) = receiver.receive_messages(max_wait_time=5)
            with pytest.raises(ServiceBusServerBusyError):
                receiver.complete_message(message)
            receiver.complete_message(message)  # the fault fired once: the lock is still the receiver's
    assert server.stats("orders")["active_message_count"] == 0


@pytest.mark.parametrize("kind", ["drop-connection", "detach-link"])
def test_a_connection_dropped_or_link_detached_before_the_send_stores_it_once_after_the_retry(
    server: OncebusServer, kind: str
) -> None:
    server.create_queue("orders")  # no duplicate detection: a send stored twice would show
    server.arm_fault(kind, "orders", after=1)  # the second transfer
    with client(server) as sb, sb.get_queue_sender("orders") as sender:
        for i in range(3):
            sender.send_messages(ServiceBusMessage(f"o{i}"))
    assert sorted(drain(server, "orders")) == ["o0", "o1", "o2"]


def test_without_retries_a_dropped_connection_is_a_connection_error(server: OncebusServer) -> None:
    server.create_queue("orders")
    server.arm_fault("drop-connection")  # every entity
    with client(server, retry_total=0) as sb, sb.get_queue_sender("orders") as sender:
        with pytest.raises(ServiceBusConnectionError):
            sender.send_messages(ServiceBusMessage("o1"))
    assert server.stats("orders")["active_message_count"] == 0


def test_a_connection_dropped_while_delivering_leaves_the_message_locked_until_its_lock_expires(
    server: OncebusServer,
) -> None:
    server.create_queue("orders", lock_duration=timedelta(seconds=30))
    with client(server) as sb:
        with sb.get_queue_sender("orders") as sender:
            sender.send_messages(ServiceBusMessage("o1"))
        server.arm_fault("drop-connection", "orders")  # the next transfer on orders: this delivery
        with sb.get_queue_receiver("orders") as receiver:
            assert receiver.receive_messages(max_wait_time=2) == []  # lost on the way; the SDK reconnected
        assert server.faults() == []
        server.advance(timedelta(seconds=31))  # its lock expires, as on Service Bus
        with sb.get_queue_receiver("orders") as receiver:
            (message,) = receiver.receive_messages(max_wait_time=5)
            assert (str(message), message.delivery_count) == ("o1", 1)
            receiver.complete_message(message)
