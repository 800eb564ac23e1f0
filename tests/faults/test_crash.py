"""``OncebusServer.crash()``: the broker killed (SIGKILL) and started again on the same data directory and port."""

from __future__ import annotations

from azure.servicebus import ServiceBusMessage

from oncebus.testing import OncebusServer
from tests.faults.conftest import client, drain


def test_after_a_crash_what_was_acknowledged_is_there_and_resends_are_still_duplicates(
    server: OncebusServer,
) -> None:
    server.create_queue("orders", requires_duplicate_detection=True)
    bodies = ["o0", "o1", "o2"]
    with client(server) as sb:
        with sb.get_queue_sender("orders") as sender:
            sender.send_messages([ServiceBusMessage(b, message_id=b) for b in bodies])
        with sb.get_queue_receiver("orders") as receiver:
            (first,) = receiver.receive_messages(max_wait_time=5)
            receiver.complete_message(first)
    server.arm_fault("lost-ack", "orders", count=5)
    pid = server.info["pid"]
    server.crash()
    assert server.info["pid"] != pid and server.alive
    assert server.faults() == []  # faults live in the broker's memory only
    with client(server) as sb, sb.get_queue_sender("orders") as sender:  # the same connection string
        sender.send_messages([ServiceBusMessage(b, message_id=b) for b in bodies])  # the application resends all
    stats = server.stats("orders")
    assert (stats["active_message_count"], stats["duplicates_dropped"]) == (2, 3)
    assert sorted(drain(server, "orders")) == ["o1", "o2"]
