"""Issue 19, item 5, where a user meets it: the real azure-servicebus SDK against ``oncebus serve`` on a
Standard namespace (the default) and on one started with ``--tier premium``.

A 5 MiB message is refused on Standard with the SDK's ``MessageSizeExceededError`` (the message limit is
256 KB, whatever the entity's setting) and goes through on Premium (the entity's setting, up to 100 MB);
the administration client's ``get_namespace_properties`` reports the tier chosen.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from azure.core.exceptions import HttpResponseError
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode
from azure.servicebus.exceptions import MessageSizeExceededError, ServiceBusServerBusyError
from azure.servicebus.management import ServiceBusAdministrationClient

from tests.amqp.conftest import ServerProcess, topology

KB = 1024
MIB = 1024 * 1024
QUEUES = {"q": {"RequiresDuplicateDetection": True}}
TOPICS = {"t": ({}, {"a": {}, "b": {}})}
# counts made small to meet them cheaply (Azure's figures are the defaults: tests/core/test_tiers.py)
SMALL_COUNTS = {"ONCEBUS_QUOTA_MAX_CONCURRENT_RECEIVES": "2", "ONCEBUS_QUOTA_MAX_ENTITIES": "3"}


class PremiumServer(ServerProcess):
    def command(self) -> list[str]:
        return [*super().command(), "--tier", "premium"]


def _ca_file(server: ServerProcess) -> str:
    line = next(line for line in server.output if line.startswith("CA certificate: "))
    return line.split(": ", 1)[1].split(" (", 1)[0]


@pytest.fixture(scope="module")
def standard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("standard")
    server = ServerProcess(base / "data", topology(QUEUES, TOPICS), env=SMALL_COUNTS).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def premium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("premium")
    server = PremiumServer(base / "data", topology(QUEUES, {})).start()
    yield server
    server.stop()


def _admin(server: ServerProcess) -> ServiceBusAdministrationClient:
    return ServiceBusAdministrationClient.from_connection_string(
        server.connection_string, connection_verify=_ca_file(server)
    )


def _received(server: ServerProcess) -> list[tuple[str, int]]:
    with ServiceBusClient.from_connection_string(server.connection_string) as client:
        with client.get_queue_receiver("q", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as receiver:
            got = receiver.receive_messages(max_message_count=10, max_wait_time=1)
            return [(str(m.message_id), len(b"".join(m.body))) for m in got]


def test_standard_refuses_a_5_mib_message_and_a_larger_setting(standard: ServerProcess) -> None:
    with _admin(standard) as admin:
        props = admin.get_namespace_properties()
        assert (props.messaging_sku, props.messaging_units) == ("Standard", None)
        assert admin.get_queue("q").max_message_size_in_kilobytes == 256
        with pytest.raises(HttpResponseError, match="'MaxMessageSizeInKilobytes'") as refused:
            admin.create_queue("bigger", max_message_size_in_kilobytes=6 * 1024)
        assert refused.value.status_code == 400
    with ServiceBusClient.from_connection_string(standard.connection_string, retry_total=0) as client:
        with client.get_queue_sender("q") as sender:
            assert sender.create_message_batch().max_size_in_bytes == 256 * KB
            sender.send_messages(ServiceBusMessage(b"s" * 250 * KB, message_id="fits"))
            with pytest.raises(MessageSizeExceededError):
                sender.send_messages(ServiceBusMessage(b"x" * 5 * MIB, message_id="big"))
            with pytest.raises(MessageSizeExceededError):
                sender.send_messages(ServiceBusMessage(b"x" * (256 * KB + 1), message_id="over"))
            # a message's properties: 64 KB at most (each at most 32 KB), refused by the broker, not the SDK
            fits = {"a": "p" * 30 * KB, "b": "p" * 30 * KB, "c": "p" * 3 * KB}
            sender.send_messages(ServiceBusMessage(b"h", message_id="props", application_properties=fits))
            properties = {"a": "p" * 30 * KB, "b": "p" * 30 * KB, "c": "p" * 5 * KB}
            with pytest.raises(MessageSizeExceededError):
                sender.send_messages(ServiceBusMessage(b"h", message_id="header", application_properties=properties))
    assert _received(standard) == [("fits", 250 * KB), ("props", 1)]


def test_premium_takes_a_5_mib_message_when_the_entity_allows_it(premium: ServerProcess) -> None:
    with _admin(premium) as admin:
        props = admin.get_namespace_properties()
        assert (props.messaging_sku, props.messaging_units) == ("Premium", 1)
        queue = admin.get_queue("q")
        assert queue.max_message_size_in_kilobytes == 1024  # Premium's default
        queue.max_message_size_in_kilobytes = 6 * 1024
        admin.update_queue(queue)
    with ServiceBusClient.from_connection_string(premium.connection_string, retry_total=0) as client:
        with client.get_queue_sender("q") as sender:
            assert sender.create_message_batch().max_size_in_bytes == MIB  # Premium's batches: 1 MB
            sender.send_messages(ServiceBusMessage(b"x" * 5 * MIB, message_id="big"))
            with pytest.raises(MessageSizeExceededError):
                sender.send_messages(ServiceBusMessage(b"y" * 7 * MIB, message_id="too-big"))
    assert _received(premium) == [("big", 5 * MIB)]


def test_concurrent_receivers_and_entities_meet_their_quotas(standard: ServerProcess) -> None:
    with ServiceBusClient.from_connection_string(standard.connection_string, retry_total=0) as client:
        with client.get_subscription_receiver("t", "a") as first, client.get_subscription_receiver("t", "b"):
            assert first.receive_messages(max_wait_time=0.2) == []
            with pytest.raises(ServiceBusServerBusyError, match="across its subscriptions"):
                with client.get_subscription_receiver("t", "a") as third:
                    third.receive_messages(max_wait_time=0.2)
        with client.get_subscription_receiver("t", "a") as again:  # the first two closed: room again
            assert again.receive_messages(max_wait_time=0.2) == []
    with _admin(standard) as admin:
        admin.create_queue("third")  # q, t and this one: the limit
        with pytest.raises(HttpResponseError, match="maximum number of queues and topics") as refused:
            admin.create_topic("fourth")
        assert refused.value.status_code == 403
        admin.delete_queue("third")
