"""The fault duplicate detection exists for: the send is committed, its acknowledgement never reaches the
sender, the sender sends again. The seed scenario of issue 20, end to end with the real SDK."""

from __future__ import annotations

import logging
import urllib.request

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusConnectionError

from oncebus.testing import OncebusServer
from tests.faults.conftest import client, drain

MESSAGES = [f"order-{i}" for i in range(5)]


@pytest.mark.parametrize(("dedup", "how"), [(True, "drop"), (False, "drop"), (True, "detach")], ids=lambda v: str(v))
def test_a_lost_ack_on_the_third_send_is_resent_and_dropped_only_with_duplicate_detection(
    server: OncebusServer, dedup: bool, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    server.create_queue("orders", requires_duplicate_detection=dedup)
    server.arm_fault("lost-ack", "orders", after=2, how=how)  # the third send
    with caplog.at_level(logging.INFO, logger="azure.servicebus"):
        with client(server) as sb, sb.get_queue_sender("orders") as sender:
            for body in MESSAGES:  # the SDK retries the third send on its own: no error reaches this code
                sender.send_messages(ServiceBusMessage(body, message_id=body))
    retries = [r.getMessage() for r in caplog.records if "Retrying" in r.getMessage()]
    assert len(retries) == 1 and "ServiceBusConnectionError" in retries[0]  # the SDK's own retry, once
    assert server.faults() == []  # it fired, once
    stats = server.stats("orders")
    received = drain(server, "orders")
    if dedup:
        assert sorted(received) == MESSAGES  # each exactly once
        assert (stats["accepted"], stats["duplicates_dropped"]) == (5, 1)  # the SDK's resend, dropped
    else:
        assert sorted(received) == sorted([*MESSAGES, "order-2"])  # the resend is a second copy
        assert stats["accepted"] == 6


def test_without_retries_the_sender_sees_the_error_yet_the_message_is_stored(server: OncebusServer) -> None:
    server.create_queue("ledger", requires_duplicate_detection=True)
    fault = server.arm_fault("lost-ack", "ledger", how="close")  # an AMQP close (amqp:connection:forced)
    with client(server, retry_total=0) as sb, sb.get_queue_sender("ledger") as sender:
        with pytest.raises(ServiceBusConnectionError):
            sender.send_messages(ServiceBusMessage("entry-0", message_id="entry-0"))
    assert server.stats("ledger")["active_message_count"] == 1  # committed before the ack was lost
    assert f"fault {fault} (lost-ack) fired on ledger" in server.output()  # in the log
    with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/metrics", timeout=10) as response:
        metrics = response.read().decode()
    assert 'oncebus_faults_fired_total{entity="ledger",kind="lost-ack"} 1.0' in metrics
    with client(server) as sb, sb.get_queue_sender("ledger") as sender:  # the application's own resend
        sender.send_messages(ServiceBusMessage("entry-0", message_id="entry-0"))
    assert server.stats("ledger")["duplicates_dropped"] == 1
    assert drain(server, "ledger") == ["entry-0"]


def test_a_fault_on_one_entity_leaves_the_others_alone(server: OncebusServer) -> None:
    server.create_queue("orders")
    server.create_queue("audit")
    fault = server.arm_fault("lost-ack", "orders")
    with client(server, retry_total=0) as sb, sb.get_queue_sender("audit") as sender:
        sender.send_messages([ServiceBusMessage(f"a{i}") for i in range(3)])
        sender.send_messages(ServiceBusMessage("a3"))
    assert [f["id"] for f in server.faults()] == [fault]  # still armed: nothing was sent to orders
    assert server.stats("audit")["accepted"] == 4
