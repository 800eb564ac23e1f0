"""Faults on the way out: a lock lost before the client settles, a slow broker."""

from __future__ import annotations

import threading
import time

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus.exceptions import MessageLockLostError, SessionLockLostError

from oncebus.testing import OncebusServer
from tests.faults.conftest import client


def test_a_lost_lock_fails_the_completion_and_the_message_comes_again(server: OncebusServer) -> None:
    server.create_queue("orders")
    with client(server) as sb:
        with sb.get_queue_sender("orders") as sender:
            sender.send_messages(ServiceBusMessage("o1"))
        server.arm_fault("lock-lost", "orders")
        with sb.get_queue_receiver("orders") as receiver:
            (first,) = receiver.receive_messages(max_wait_time=5)
            with pytest.raises(MessageLockLostError):
                receiver.complete_message(first)
            (again,) = receiver.receive_messages(max_wait_time=5)
            assert (str(again), again.delivery_count) == ("o1", 1)
            receiver.complete_message(again)
    assert server.stats("orders")["active_message_count"] == 0


def test_a_lost_session_lock_fails_the_completion_with_session_lock_lost(server: OncebusServer) -> None:
    server.create_queue("carts", requires_session=True)
    with client(server, retry_total=0) as sb:
        with sb.get_queue_sender("carts") as sender:
            sender.send_messages(ServiceBusMessage("c1", session_id="cart-1"))
        server.arm_fault("session-lock-lost", "carts")
        with sb.get_queue_receiver("carts", session_id="cart-1") as receiver:
            (message,) = receiver.receive_messages(max_wait_time=5)
            with pytest.raises(SessionLockLostError):
                receiver.complete_message(message)
    with client(server) as sb, sb.get_queue_receiver("carts", session_id="cart-1") as receiver:
        (again,) = receiver.receive_messages(max_wait_time=5)  # the session can be taken again
        receiver.complete_message(again)


def test_a_slow_ack_holds_back_that_entity_only(server: OncebusServer) -> None:
    server.create_queue("slow")
    server.create_queue("fast")
    server.arm_fault("slow-ack", "slow", seconds=1.0)
    took: dict[str, float] = {}
    with client(server) as sb, sb.get_queue_sender("slow") as slow, client(server) as other:
        with other.get_queue_sender("fast") as fast:
            fast.send_messages(ServiceBusMessage("warm-up"))

            def send_slow() -> None:
                started = time.monotonic()
                slow.send_messages(ServiceBusMessage("s"))
                took["slow"] = time.monotonic() - started

            thread = threading.Thread(target=send_slow)
            thread.start()
            time.sleep(0.2)  # the slow send waits for its acknowledgement now
            started = time.monotonic()
            fast.send_messages(ServiceBusMessage("f"))
            took["fast"] = time.monotonic() - started
            thread.join()
    assert took["slow"] >= 1.0
    assert took["fast"] < 0.5  # the broker's loop was not held up
    assert server.stats("slow")["active_message_count"] == 1


def test_a_slow_delivery_holds_the_message_back(server: OncebusServer) -> None:
    server.create_queue("orders")
    with client(server) as sb:
        with sb.get_queue_sender("orders") as sender:
            sender.send_messages(ServiceBusMessage("o1"))
        server.arm_fault("slow-delivery", "orders", seconds=1.0)
        with sb.get_queue_receiver("orders") as receiver:
            started = time.monotonic()
            assert receiver.receive_messages(max_wait_time=0.5) == []  # not within half a second
            (message,) = receiver.receive_messages(max_wait_time=5)
            assert time.monotonic() - started >= 1.0
            receiver.complete_message(message)
    assert server.stats("orders")["active_message_count"] == 0
