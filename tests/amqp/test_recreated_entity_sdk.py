"""The Python SDK completes a message whose queue was deleted and created again meanwhile: refused (its lock went
with the old queue), and the new queue's messages are received and completed as usual. The broker keeps what each
path resolved to (``Namespace.receivable``); this is what a user would meet if it kept a stale one."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusError
from azure.servicebus.management import ServiceBusAdministrationClient

from tests.http.conftest import Served, start_server, trust_ca_for_old_sdks


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    server = start_server(tmp_path_factory.mktemp("recreated") / "data")
    yield server
    server.stop()


def test_completing_after_the_queue_was_deleted_and_recreated(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    trust_ca_for_old_sdks(served.ca_file, monkeypatch)
    name = "recreated-" + uuid.uuid4().hex[:8]
    with (
        ServiceBusAdministrationClient.from_connection_string(
            served.connection_string, connection_verify=served.ca_file
        ) as admin,
        ServiceBusClient.from_connection_string(served.connection_string, retry_total=0) as client,
    ):
        admin.create_queue(name)
        with client.get_queue_sender(name) as sender:
            sender.send_messages(ServiceBusMessage(b"old"))
        receiver = client.get_queue_receiver(name, max_wait_time=5)
        with receiver:
            (old,) = receiver.receive_messages(1, max_wait_time=5)
            receiver.complete_message(old)  # warms the path (resolved once for the link)
        with client.get_queue_sender(name) as sender:
            sender.send_messages(ServiceBusMessage(b"old 2"))
        receiver = client.get_queue_receiver(name, max_wait_time=5)
        with receiver:
            (old,) = receiver.receive_messages(1, max_wait_time=5)
            admin.delete_queue(name)
            admin.create_queue(name)
            with client.get_queue_sender(name) as sender:
                sender.send_messages(ServiceBusMessage(b"new"))
            with pytest.raises(ServiceBusError):  # its lock went with the deleted queue
                receiver.complete_message(old)
        with client.get_queue_receiver(name, max_wait_time=5) as receiver:
            got = receiver.receive_messages(5, max_wait_time=5)
            assert [str(m) for m in got] == ["new"]
            receiver.complete_message(got[0])
        assert admin.get_queue_runtime_properties(name).active_message_count == 0
