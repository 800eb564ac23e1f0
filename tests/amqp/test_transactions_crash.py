"""``oncebus serve`` killed (SIGKILL) in the middle of a transaction: after the restart all of it is there, or
nothing of it (python-qpid-proton's client; the broker on its SQLite store)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import proton
import pytest
from azure.servicebus import ServiceBusClient

from tests.amqp.conftest import ServerProcess, topology
from tests.amqp.txn_client import TRANSACTIONAL_STATE, TxnClient

QUEUES = {"work": {"RequiresDuplicateDetection": True}, "done": {"RequiresDuplicateDetection": True}}


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ServerProcess]:
    process = ServerProcess(tmp_path / "data", topology(QUEUES, {})).start()
    yield process
    process.stop()


def kill_and_restart(process: ServerProcess) -> None:
    assert process.process is not None
    os.kill(process.pid, signal.SIGKILL)
    process.process.wait()
    process.process = None
    process.start()


def ids(process: ServerProcess, queue: str) -> list[str]:
    """Every message in ``queue``, received and completed with the real SDK."""
    got: list[str] = []
    with ServiceBusClient.from_connection_string(process.connection_string) as sb:
        with sb.get_queue_receiver(queue, max_wait_time=0.5) as receiver:
            while batch := receiver.receive_messages(max_message_count=50, max_wait_time=0.5):
                for message in batch:
                    got.append(str(message.message_id))
                    receiver.complete_message(message)
    return sorted(got)


def prepare(process: ServerProcess, cross_entity: bool = False) -> tuple[TxnClient, bytes]:
    """One message in ``work``; a transaction that completes it and sends three on to ``done`` through it (with
    send-via; ``cross_entity``: to ``done`` itself on the Java SDK's cross-entity session, ``work`` its first
    entity)."""
    client = TxnClient(process.port, cross_entity=cross_entity)
    client.send("work", proton.Message(body="input", id="input"))
    _, delivery = client.receive("work")
    txn = client.declare()
    assert client.settle(delivery, txn).state == TRANSACTIONAL_STATE
    for n in range(3):
        message = proton.Message(body=f"out{n}", id=f"out{n}")
        if cross_entity:
            answer = client.send("done", message, txn)
        else:
            answer = client.send("work", message, txn, via="done")
        assert answer.state == TRANSACTIONAL_STATE, answer
    return client, txn


@pytest.mark.parametrize("cross_entity", [False, True], ids=["send-via", "cross-entity"])
def test_a_crash_before_the_discharge_leaves_nothing_of_the_transaction(
    serve: ServerProcess, cross_entity: bool
) -> None:
    client, _ = prepare(serve, cross_entity)
    kill_and_restart(serve)
    client.close(timeout=0.1)  # the broker it spoke to is gone
    assert ids(serve, "done") == []
    assert ids(serve, "work") == ["input"]  # not completed: available again after the restart


@pytest.mark.parametrize("cross_entity", [False, True], ids=["send-via", "cross-entity"])
def test_a_crash_after_the_commit_keeps_all_of_the_transaction(serve: ServerProcess, cross_entity: bool) -> None:
    client, txn = prepare(serve, cross_entity)
    assert client.discharge(txn).state == proton.Delivery.ACCEPTED  # durable before it is answered
    kill_and_restart(serve)
    client.close(timeout=0.1)  # the broker it spoke to is gone
    assert ids(serve, "done") == ["out0", "out1", "out2"]
    assert ids(serve, "work") == []
    # the dedup keys were committed with the messages: a resend after the restart is a duplicate
    again = TxnClient(serve.port)
    try:
        again.send("done", proton.Message(body="resent", id="out1"))
    finally:
        again.close()
    assert ids(serve, "done") == []


def test_a_crash_while_the_discharge_is_in_flight_keeps_all_or_nothing(serve: ServerProcess) -> None:
    client, txn = prepare(serve)
    client.discharge_unanswered(txn, pump_seconds=0.005)  # on the wire; its commit may or may not have happened
    kill_and_restart(serve)
    client.close(timeout=0.1)  # the broker it spoke to is gone
    done, work = ids(serve, "done"), ids(serve, "work")
    assert (done, work) in ((["out0", "out1", "out2"], []), ([], ["input"])), (done, work)
