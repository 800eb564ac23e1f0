"""Entity status with the Python SDK: set by ``ServiceBusAdministrationClient.update_queue``, met by the
``ServiceBusClient`` as ``MessagingEntityDisabledError`` (``com.microsoft:entity-disabled``); a
session-enabled queue that forwards accepted. (The JavaScript SDK's view of the same: tests/js, scenario ``status``.)"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import MessagingEntityDisabledError
from azure.servicebus.management import ServiceBusAdministrationClient

from tests.http.conftest import Served, start_server, trust_ca_for_old_sdks


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    server = start_server(tmp_path_factory.mktemp("status") / "data")
    yield server
    server.stop()


def test_a_status_set_by_the_admin_client_refuses_what_it_says(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """Failed before: update_queue with any status but Active was refused with 400."""
    trust_ca_for_old_sdks(served.ca_file, monkeypatch)
    name = "status-" + uuid.uuid4().hex[:8]
    with (
        ServiceBusAdministrationClient.from_connection_string(
            served.connection_string, connection_verify=served.ca_file
        ) as admin,
        ServiceBusClient.from_connection_string(served.connection_string, retry_total=0) as client,
    ):
        admin.create_queue(name)

        def set_status(status: str) -> str:
            queue = admin.get_queue(name)
            queue.status = status  # type: ignore[assignment]  # the SDK's EntityStatus is a str enum
            admin.update_queue(queue)
            return str(admin.get_queue(name).status)

        sender = client.get_queue_sender(name)
        assert set_status("SendDisabled") == "SendDisabled"
        with pytest.raises(MessagingEntityDisabledError, match="SendDisabled"):
            sender.send_messages(ServiceBusMessage(b"refused"))
        assert set_status("ReceiveDisabled") == "ReceiveDisabled"
        sender.send_messages(ServiceBusMessage(b"kept"))
        with pytest.raises(MessagingEntityDisabledError, match="ReceiveDisabled"):
            with client.get_queue_receiver(name, max_wait_time=1) as receiver:
                receiver.receive_messages(1, max_wait_time=1)
        assert set_status("Active") == "Active"
        with client.get_queue_receiver(name, max_wait_time=2) as receiver:
            assert [str(m) for m in receiver.receive_messages(5, max_wait_time=2)] == ["kept"]
        sender.close()
        # a session-enabled queue may forward, as on Service Bus (tests/http/test_admin_sync.py)
        assert admin.create_queue(name + "-s", requires_session=True, forward_to=name).forward_to
