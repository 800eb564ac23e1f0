"""A transaction's commit meets the acknowledgement faults (``lost-ack``, ``slow-ack``) as a send does, and a crash
between the commit and its reply: the client never hears of the commit, and all of it is there."""

from __future__ import annotations

import time

import proton

from oncebus.testing import OncebusServer
from tests.amqp.txn_client import TRANSACTIONAL_STATE, TxnClient
from tests.faults.conftest import drain


def _prepare(server: OncebusServer) -> tuple[TxnClient, bytes]:
    """``work`` holds one message; a transaction completes it and sends three through ``work`` to ``done``."""
    server.create_queue("work", requires_duplicate_detection=True)
    server.create_queue("done", requires_duplicate_detection=True)
    client = TxnClient(int(server.info["amqp_port"]))
    client.send("work", proton.Message(body="input", id="input"))
    _, delivery = client.receive("work")
    txn = client.declare()
    assert client.settle(delivery, txn).state == TRANSACTIONAL_STATE
    for n in range(3):
        answer = client.send("work", proton.Message(body=f"out{n}", id=f"out{n}"), txn, via="done")
        assert answer.state == TRANSACTIONAL_STATE, answer
    return client, txn


def test_a_lost_acknowledgement_of_a_commit_leaves_the_transaction_stored(server: OncebusServer) -> None:
    client, txn = _prepare(server)
    server.arm_fault("lost-ack", "work", count=1)
    try:
        client.discharge(txn)
        raise AssertionError("the discharge was answered; the lost-ack fault should have cut the connection")
    except proton.ConnectionException:
        pass  # the client does not know whether it committed
    finally:
        client.close(timeout=0.5)
    assert sorted(drain(server, "done")) == ["b'out0'", "b'out1'", "b'out2'"]  # the SDK's str of a value body
    assert server.stats("work")["active_message_count"] == 0


def test_a_crash_between_the_commit_and_its_reply_keeps_all_of_the_transaction(server: OncebusServer) -> None:
    client, txn = _prepare(server)
    server.arm_fault("slow-ack", "work", count=1, seconds=60)  # the reply is held after the commit
    client.discharge_unanswered(txn, pump_seconds=0.3)  # written out; its reply is held 60 s
    deadline = time.monotonic() + 10
    while server.stats("done")["active_message_count"] < 3:  # committed: counted once durable
        assert time.monotonic() < deadline, "the commit did not happen"
        time.sleep(0.02)
    server.crash()  # SIGKILL: the reply was never sent
    client.close(timeout=0.1)
    assert sorted(drain(server, "done")) == ["b'out0'", "b'out1'", "b'out2'"]  # the SDK's str of a value body
    assert server.stats("work")["active_message_count"] == 0
