"""Connections and links open, as the real azure-servicebus SDK opens and closes them."""

from __future__ import annotations

import time
from pathlib import Path

from azure.servicebus import ServiceBusClient, ServiceBusMessage
from prometheus_client.parser import text_string_to_metric_families

from tests.http.observe_server import ObservedBroker, samples


def _gauges(broker: ObservedBroker) -> tuple[float, float]:
    status, _, body = broker.get("/metrics")
    assert status == 200
    got = samples(text_string_to_metric_families(body.decode()))
    return got[("oncebus_connections_open", ())], got[("oncebus_links_open", ())]


def _until(broker: ObservedBroker, check: object, timeout: float = 15.0) -> tuple[float, float]:
    deadline = time.monotonic() + timeout
    while True:
        value = _gauges(broker)
        if check(value) or time.monotonic() > deadline:  # type: ignore[operator]
            return value
        time.sleep(0.05)


def test_connections_and_links_open_follow_the_sdk(tmp_path: Path) -> None:
    with ObservedBroker(tmp_path, amqp=True) as broker:
        broker.call(lambda: broker.ns.create_queue("orders", requires_duplicate_detection=True))
        assert _gauges(broker) == (0, 0)
        with ServiceBusClient.from_connection_string(broker.connection_string) as client:
            with client.get_queue_sender("orders") as sender:
                sender.send_messages(ServiceBusMessage("x", message_id="1"))
                sender.send_messages(ServiceBusMessage("x", message_id="1"))
                connections, links = _gauges(broker)
                assert connections == 1
                assert links >= 3  # the sender link and the $cbs request/response pair
                with client.get_queue_receiver("orders", max_wait_time=1) as receiver:
                    assert [m.message_id for m in receiver.receive_messages(1, max_wait_time=5)] == ["1"]
                    more_connections, more_links = _gauges(broker)
                    assert more_links > links
                    assert more_connections >= 1
        assert _until(broker, lambda v: v == (0, 0)) == (0, 0)
        status, _, body = broker.get("/api/dashboard")
        assert status == 200 and b'"transport": {"connections_open": 0, "links_open": 0}' in body


def test_the_gauges_come_through_the_observation_port(tmp_path: Path) -> None:
    """The AMQP server reports to the namespace it serves (``observer.transport``) while it runs, and stops when it
    closes; ``/metrics`` shows them only then (the observe app knows nothing of AMQP)."""
    with ObservedBroker(tmp_path, amqp=True) as broker:
        assert broker.ns.observer.transport is broker.amqp_server
        assert "oncebus_connections_open" in broker.get("/metrics")[2].decode()
        broker.call(broker.amqp_server.close)
        assert broker.ns.observer.transport is None
        status, _, body = broker.get("/metrics")
        assert status == 200 and b"oncebus_connections_open" not in body and b"oncebus_links_open" not in body
        assert b'"transport": null' in broker.get("/api/dashboard")[2]
