"""Namespaces created at run time on one broker, reached by the key name alone (``<key>@<namespace>``), driven with
the real Python SDK: messages, duplicate-detection keys and clocks stay in their own namespace."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode
from azure.servicebus.exceptions import ServiceBusAuthenticationError
from azure.servicebus.management import ServiceBusAdministrationClient

from oncebus.testing import IsolatedNamespace, OncebusServer

WINDOW = timedelta(minutes=1)


def send(connection_string: str, queue: str, *message_ids: str, body: str = "x", **client_options: Any) -> None:
    with (
        ServiceBusClient.from_connection_string(connection_string, **client_options) as client,
        client.get_queue_sender(queue) as sender,
    ):
        for message_id in message_ids:
            sender.send_messages(ServiceBusMessage(f"{body}:{message_id}", message_id=message_id))


def receive(connection_string: str, queue: str, count: int = 10, wait: float = 1.0) -> list[str]:
    with (
        ServiceBusClient.from_connection_string(connection_string) as client,
        client.get_queue_receiver(queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as receiver,
    ):
        out: list[str] = []
        while len(out) < count:
            batch = receiver.receive_messages(max_message_count=count - len(out), max_wait_time=wait)
            if not batch:
                break
            out += [str(m) for m in batch]
        return sorted(out)


def test_two_namespaces_at_once_keep_messages_and_dedup_keys_apart(broker: OncebusServer) -> None:
    a, b = broker.create_namespace(), broker.create_namespace()
    for ns in (a, b):
        ns.create_queue("orders", requires_duplicate_detection=True, duplicate_detection_history_time_window=WINDOW)
    received: dict[str, list[str]] = {}
    failures: list[BaseException] = []

    def work(ns: IsolatedNamespace) -> None:  # one test's worth of work: the same entity and message ids
        try:
            send(ns.connection_string, "orders", "m1", "m2", "m1", body=ns.name)
            received[ns.name] = receive(ns.connection_string, "orders", count=3)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(ns,)) for ns in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert failures == []
    # each got its own two (the resend of m1 dropped in its own namespace, the same id accepted in both)
    assert received == {a.name: [f"{a.name}:m1", f"{a.name}:m2"], b.name: [f"{b.name}:m1", f"{b.name}:m2"]}
    for ns in (a, b):
        assert ns.stats("orders")["accepted"] == 2
        assert ns.stats("orders")["duplicates_dropped"] == 1
    assert "orders" not in broker.stats()  # the default namespace never saw any of it


def test_advancing_one_namespace_clock_does_not_expire_the_other_keys(broker: OncebusServer) -> None:
    a, b = broker.create_namespace(), broker.create_namespace()
    for ns in (a, b):
        ns.create_queue("orders", requires_duplicate_detection=True, duplicate_detection_history_time_window=WINDOW)
        send(ns.connection_string, "orders", "k1")
    before_b, before_default = b.now(), broker.now()
    a.advance(WINDOW * 2)  # past a's window only
    assert b.now() - before_b < WINDOW
    assert broker.now() - before_default < WINDOW  # nor did the default namespace's time move
    for ns in (a, b):
        send(ns.connection_string, "orders", "k1")
    assert a.stats("orders")["accepted"] == 2  # a's key expired: the resend is a new message
    assert a.stats("orders")["duplicates_dropped"] == 0
    assert b.stats("orders")["accepted"] == 1  # b's key still held: the resend dropped
    assert b.stats("orders")["duplicates_dropped"] == 1


def test_an_unknown_namespace_is_refused_by_the_sdk(broker: OncebusServer) -> None:
    connection_string = broker.connection_string.replace(
        "SharedAccessKeyName=RootManageSharedAccessKey", "SharedAccessKeyName=RootManageSharedAccessKey@nosuch"
    )
    with pytest.raises(ServiceBusAuthenticationError):  # $cbs answered 401 (the SDK shows no text: see test_refusals)
        send(connection_string, "orders", "m1", retry_total=0)


def _admin(connection_string: str, broker: OncebusServer) -> ServiceBusAdministrationClient:
    return ServiceBusAdministrationClient.from_connection_string(
        connection_string, connection_verify=str(broker.ca_file)
    )


def test_the_admin_client_creates_and_lists_entities_in_its_own_namespace_only(broker: OncebusServer) -> None:
    a, b = broker.create_namespace(), broker.create_namespace()
    broker.create_queue("default-only")
    with _admin(a.connection_string, broker) as admin:
        admin.create_queue("orders", requires_duplicate_detection=True)
        admin.create_topic("events")
        assert [q.name for q in admin.list_queues()] == ["orders"]
        assert admin.get_queue("orders").requires_duplicate_detection is True
    with _admin(b.connection_string, broker) as admin:
        assert [q.name for q in admin.list_queues()] == []
        assert [t.name for t in admin.list_topics()] == []
    with _admin(broker.connection_string, broker) as admin:
        assert [q.name for q in admin.list_queues()] == ["default-only"]
    assert set(a.stats()) == {"orders", "events"}
    broker.delete_queue("default-only")


def test_the_default_namespace_is_untouched_by_created_ones(broker: OncebusServer) -> None:
    broker.create_queue("shared", requires_duplicate_detection=True)
    a = broker.create_namespace()
    a.create_queue("shared", requires_duplicate_detection=True)
    send(broker.connection_string, "shared", "d1", body="default")
    send(a.connection_string, "shared", "d1", body="a")
    assert receive(a.connection_string, "shared", count=1) == ["a:d1"]
    assert receive(broker.connection_string, "shared", count=1) == ["default:d1"]
    assert a.stats("shared")["active_message_count"] == 0 == broker.stats("shared")["active_message_count"]
    a.delete()
    assert a.name not in [n["name"] for n in broker.namespaces()]
    send(broker.connection_string, "shared", "d1")
    assert broker.stats("shared")["duplicates_dropped"] == 1  # its own key survived a's deletion
    broker.delete_queue("shared")


def test_a_fault_armed_in_one_namespace_fires_there_only(broker: OncebusServer) -> None:
    a, b = broker.create_namespace(), broker.create_namespace()
    for ns in (a, b):
        ns.create_queue("orders")
    a.arm_fault("server-busy", "orders", count=1)
    send(b.connection_string, "orders", "b1")  # b's send meets no fault
    assert len(a.control("fault.list")) == 1 and b.control("fault.list") == []
    assert broker.faults() == []  # nor is it armed on the default namespace
    send(a.connection_string, "orders", "a1")  # refused once as busy, retried by the SDK, stored
    assert a.control("fault.list") == []
    assert a.stats("orders")["accepted"] == 1 and b.stats("orders")["accepted"] == 1
