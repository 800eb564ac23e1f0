"""A lock that a stop of ``oncebus serve`` ends counts as the delivery attempt it was, as a lock that expired does.

Messages received under a lock and neither settled nor abandoned when the server stops come back after the restart
with their delivery counted (the SDK shows 1 after one such delivery), and those whose delivery was their
entity's last (MaxDeliveryCount) go to the dead letters with ``MaxDeliveryCountExceeded``, as on lock expiry.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceivedMessage, ServiceBusSubQueue

from tests.amqp.conftest import ServerProcess, topology


@pytest.fixture()
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(tmp_path_factory.mktemp("restart") / "data", topology({"q": {"MaxDeliveryCount": 2}}, {}))
    yield process.start()
    process.stop()


def _receive_and_keep(server: ServerProcess, count: int) -> list[ServiceBusReceivedMessage]:
    """``count`` messages received under a lock and left locked while the server stops."""
    client = ServiceBusClient.from_connection_string(server.connection_string)
    receiver = client.get_queue_receiver("q", max_wait_time=5)
    got: list[ServiceBusReceivedMessage] = []
    while len(got) < count:
        batch = receiver.receive_messages(max_message_count=count - len(got), max_wait_time=5)
        assert batch, f"received {len(got)} of {count}"
        got += batch
    server.stop()  # the client still holds its locks
    client.close()
    return got


def test_a_lock_ended_by_a_stop_counts_as_a_delivery(server: ServerProcess) -> None:
    with ServiceBusClient.from_connection_string(server.connection_string) as client:
        with client.get_queue_sender("q") as sender:
            sender.send_messages([ServiceBusMessage("a", message_id="a"), ServiceBusMessage("b", message_id="b")])
    first = _receive_and_keep(server, 2)
    assert sorted(m.delivery_count or 0 for m in first) == [0, 0]
    server.start()
    second = _receive_and_keep(server, 2)
    assert sorted((str(m.message_id), m.delivery_count) for m in second) == [("a", 1), ("b", 1)]
    server.start()  # both deliveries were their last (MaxDeliveryCount 2): dead-lettered, as at lock expiry
    with ServiceBusClient.from_connection_string(server.connection_string) as client:
        with client.get_queue_receiver("q") as receiver:
            assert receiver.peek_messages(max_message_count=10) == []
        with client.get_queue_receiver("q", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as receiver:
            dead = receiver.peek_messages(max_message_count=10)
    assert sorted(str(m.message_id) for m in dead) == ["a", "b"]
    assert {m.dead_letter_reason for m in dead} == {"MaxDeliveryCountExceeded"}
