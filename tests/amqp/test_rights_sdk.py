"""Send/Listen rights with the real azure-servicebus SDK: a Send-only key sends and schedules but cannot receive
or peek; a Listen-only key the reverse (the Manage right is tested through the admin client in
tests/http/test_admin_rights.py). Keys come from ONCEBUS_SAS_KEYS, so none shows in the process list."""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterator

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusAuthenticationError, ServiceBusError

from oncebus.auth import make_token
from tests.amqp.conftest import ServerProcess, topology

KEYS = {"sender": "send-secret", "listener": "listen-secret", "admin": "admin-secret"}
ENV = {"ONCEBUS_SAS_KEYS": "sender:Send=send-secret; listener:Listen=listen-secret; admin:Manage=admin-secret"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("rights")
    process = ServerProcess(base / "data", topology({"orders": {}, "orders2": {}}, {}), env=ENV).start()
    yield process
    process.stop()


def client(server: ServerProcess, key_name: str) -> ServiceBusClient:
    text = (
        f"Endpoint=sb://127.0.0.1:{server.port};SharedAccessKeyName={key_name};"
        f"SharedAccessKey={KEYS[key_name]};UseDevelopmentEmulator=true"
    )
    return ServiceBusClient.from_connection_string(text, retry_total=0)


def test_the_printed_connection_string_carries_the_key_with_manage(server: ServerProcess) -> None:
    assert "SharedAccessKeyName=admin;SharedAccessKey=admin-secret" in server.connection_string
    assert not any(secret in " ".join(server.command()) for secret in KEYS.values())


def test_a_send_only_key_sends_and_schedules_but_cannot_receive_or_peek(server: ServerProcess) -> None:
    body = uuid.uuid4().hex
    with client(server, "sender") as sb:
        with sb.get_queue_sender("orders") as sender:
            sender.send_messages(ServiceBusMessage(body, message_id=body))
            later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
            (number,) = sender.schedule_messages(ServiceBusMessage("later"), later)
            sender.cancel_scheduled_messages(number)
        with pytest.raises(ServiceBusError) as refused:
            with sb.get_queue_receiver("orders", max_wait_time=2) as receiver:
                receiver.receive_messages(max_message_count=1, max_wait_time=2)
        assert "'Listen' claim(s) are required" in str(refused.value)
        assert "Resource: 'sb://127.0.0.1/orders'" in str(refused.value)
        with pytest.raises(ServiceBusError) as refused:
            with sb.get_queue_receiver("orders") as receiver:
                receiver.peek_messages(max_message_count=1)
        assert "'Listen' claim(s) are required" in str(refused.value)
    # the message is still there for a key that may listen
    with client(server, "listener") as sb, sb.get_queue_receiver("orders", max_wait_time=5) as receiver:
        got = receiver.receive_messages(max_message_count=10, max_wait_time=5)
        assert body in [str(message) for message in got]
        for message in got:
            receiver.complete_message(message)


def test_a_listen_only_key_receives_and_peeks_but_cannot_send_or_schedule(server: ServerProcess) -> None:
    body = uuid.uuid4().hex
    with client(server, "admin") as sb, sb.get_queue_sender("orders") as sender:  # Manage brings Send
        sender.send_messages(ServiceBusMessage(body, message_id=body))
    with client(server, "listener") as sb:
        with pytest.raises(ServiceBusError) as refused:
            with sb.get_queue_sender("orders") as sender:
                sender.send_messages(ServiceBusMessage("nope"))
        assert "'Send' claim(s) are required" in str(refused.value)
        with pytest.raises(ServiceBusError) as refused:
            with sb.get_queue_sender("orders") as sender:
                later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
                sender.schedule_messages(ServiceBusMessage("later"), later)
        assert "'Send' claim(s) are required" in str(refused.value)
        with sb.get_queue_receiver("orders", max_wait_time=5) as receiver:
            assert body in [str(message) for message in receiver.peek_messages(max_message_count=10)]
            got = receiver.receive_messages(max_message_count=10, max_wait_time=5)
            assert body in [str(message) for message in got]
            for message in got:
                receiver.complete_message(message)


def test_the_emulator_key_is_not_accepted_when_keys_are_configured(server: ServerProcess) -> None:
    text = (
        f"Endpoint=sb://127.0.0.1:{server.port};SharedAccessKeyName=RootManageSharedAccessKey;"
        "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true"
    )
    with ServiceBusClient.from_connection_string(text, retry_total=0) as sb, pytest.raises(ServiceBusError):
        with sb.get_queue_sender("orders") as sender:
            sender.send_messages(ServiceBusMessage("x"))


def _sas_client(server: ServerProcess, resource: str, key_name: str = "admin") -> ServiceBusClient:
    """The SDK with a fixed SharedAccessSignature in its connection string (it puts that token for every link)."""
    token = make_token(resource, key_name, KEYS[key_name], 2**31)
    text = f"Endpoint=sb://127.0.0.1:{server.port};SharedAccessSignature={token};UseDevelopmentEmulator=true"
    return ServiceBusClient.from_connection_string(text, retry_total=0)


def test_a_token_for_one_queue_covers_it_and_not_a_sibling_with_a_common_prefix(server: ServerProcess) -> None:
    with _sas_client(server, f"sb://127.0.0.1:{server.port}/orders") as sb:
        with sb.get_queue_sender("orders") as sender:
            sender.send_messages(ServiceBusMessage("mine"))
        with sb.get_queue_receiver("orders", max_wait_time=5) as receiver:
            got = receiver.receive_messages(max_message_count=10, max_wait_time=5)
            assert "mine" in [str(message) for message in got]
            for message in got:
                receiver.complete_message(message)
        with pytest.raises(ServiceBusAuthenticationError):  # $cbs answered 401 (the SDK shows no text)
            with sb.get_queue_sender("orders2") as sender:
                sender.send_messages(ServiceBusMessage("not mine"))


def test_a_token_made_for_another_host_is_refused(server: ServerProcess) -> None:
    with _sas_client(server, "sb://elsewhere.example/orders") as sb, pytest.raises(ServiceBusAuthenticationError):
        with sb.get_queue_sender("orders") as sender:
            sender.send_messages(ServiceBusMessage("x"))


def test_a_namespace_token_covers_every_queue(server: ServerProcess) -> None:
    with _sas_client(server, f"sb://127.0.0.1:{server.port}/", "sender") as sb:
        for queue in ("orders", "orders2"):
            with sb.get_queue_sender(queue) as sender:
                sender.send_messages(ServiceBusMessage("x"))
