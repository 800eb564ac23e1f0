"""Links attached to a queue, topic or subscription that is then deleted are detached at once with
``amqp:not-found`` naming the entity, as Service Bus detaches them: a receiver with no credit (idle between two
receives of a prefetch-0 SDK receiver) and a sender that sends nothing are told now, not at their next transfer
or flow. Other clients keep working."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusError
from azure.servicebus.management import ServiceBusAdministrationClient

from tests.amqp.raw import ATTACH, DETACH, RawClient, attach_frame, error_of
from tests.http.conftest import Served, start_server, trust_ca_for_old_sdks

DETACH_WITHIN = 5.0  # seconds: the detach follows the deletion at once; this only bounds a failing run


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    server = start_server(tmp_path_factory.mktemp("deleted") / "data")
    yield server
    server.stop()


@pytest.fixture
def admin(served: Served, monkeypatch: pytest.MonkeyPatch) -> Iterator[ServiceBusAdministrationClient]:
    trust_ca_for_old_sdks(served.ca_file, monkeypatch)
    with ServiceBusAdministrationClient.from_connection_string(
        served.connection_string, connection_verify=served.ca_file
    ) as client:
        yield client


def _attach(client: RawClient, name: str, handle: int, address: str, *, sender: bool) -> int:
    """Attach a link; the handle the server gave it (what its detach names)."""
    client.send(attach_frame(name, handle, address, sender=sender))
    got = client.expect(ATTACH)  # (a receiver gets no credit from us, and gives none)
    assert got.fields[0] in (name, name.encode())
    return int(got.fields[1])


def _detached(client: RawClient, handle: int) -> tuple[str, str]:
    got = client.expect(DETACH, timeout=DETACH_WITHIN)
    assert got.fields[0] == handle
    assert got.fields[1] is True  # closed, not merely detached
    return error_of(got)


def _still_works(served: Served, queue: str) -> None:
    with ServiceBusClient.from_connection_string(served.connection_string, retry_total=0) as client:
        with client.get_queue_sender(queue) as sender:
            sender.send_messages(ServiceBusMessage(b"still here"))
        with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
            got = receiver.receive_messages(1, max_wait_time=5)
            assert [str(m) for m in got] == ["still here"]
            receiver.complete_message(got[0])


@pytest.mark.parametrize("sender", [False, True], ids=["receiver-without-credit", "idle-sender"])
def test_a_link_to_a_deleted_queue_is_detached_at_once(
    served: Served, admin: ServiceBusAdministrationClient, sender: bool
) -> None:
    name = "gone-" + uuid.uuid4().hex[:8]
    other = "kept-" + uuid.uuid4().hex[:8]
    admin.create_queue(name)
    admin.create_queue(other)
    with RawClient(served.port) as client:
        client.handshake()
        assert client.put_token(name) == 202
        handle = _attach(client, "link-1", 1, name, sender=sender)
        admin.delete_queue(name)
        condition, description = _detached(client, handle)
    assert condition == "amqp:not-found"
    assert name in description
    _still_works(served, other)


def test_a_receiver_of_a_deleted_subscription_and_topic_is_detached(
    served: Served, admin: ServiceBusAdministrationClient
) -> None:
    topic = "topic-" + uuid.uuid4().hex[:8]
    admin.create_topic(topic)
    admin.create_subscription(topic, "a")
    admin.create_subscription(topic, "b")
    with RawClient(served.port) as client:
        client.handshake()
        assert client.put_token(topic) == 202
        subscription = _attach(client, "sub-a", 1, f"{topic}/Subscriptions/a", sender=False)
        dead_letters = _attach(client, "sub-b-dlq", 2, f"{topic}/Subscriptions/b/$DeadLetterQueue", sender=False)
        sender = _attach(client, "topic-sender", 3, topic, sender=True)
        admin.delete_subscription(topic, "a")
        condition, description = _detached(client, subscription)
        assert condition == "amqp:not-found"
        assert f"{topic}/Subscriptions/a" in description
        admin.delete_topic(topic)
        detached = {}
        for _ in range(2):
            got = client.expect(DETACH, timeout=DETACH_WITHIN)
            detached[got.fields[0]] = error_of(got)
    assert sorted(detached) == sorted([dead_letters, sender])
    for condition, description in detached.values():
        assert condition == "amqp:not-found"
        assert topic in description


def test_an_idle_prefetch_0_sdk_receiver_of_a_deleted_queue_fails_its_next_receive(
    served: Served, admin: ServiceBusAdministrationClient
) -> None:
    name = "sdk-gone-" + uuid.uuid4().hex[:8]
    other = "sdk-kept-" + uuid.uuid4().hex[:8]
    admin.create_queue(name)
    admin.create_queue(other)
    with ServiceBusClient.from_connection_string(served.connection_string, retry_total=0) as client:
        with client.get_queue_receiver(name, prefetch_count=0, max_wait_time=1) as receiver:
            assert receiver.receive_messages(1, max_wait_time=1) == []  # idle: its credit is drained
            admin.delete_queue(name)
            started = time.monotonic()
            with pytest.raises(ServiceBusError):
                receiver.receive_messages(1, max_wait_time=5)
            assert time.monotonic() - started < DETACH_WITHIN
    _still_works(served, other)
