"""Faults on cue against a real ``oncebus serve`` (a subprocess, started through ``oncebus.testing``) and the
real azure-servicebus SDK: what the client observed (the exception its SDK raises, the retries it made) and
what the entity holds afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient

from oncebus.testing import OncebusServer, serve

FAST_RETRY = {"retry_backoff_factor": 0.02, "retry_backoff_max": 0.2}


@pytest.fixture(scope="module")
def broker() -> Iterator[OncebusServer]:
    with serve() as server:
        yield server


@pytest.fixture
def server(broker: OncebusServer) -> OncebusServer:
    """The module's broker on a fresh namespace (no entity, no fault armed)."""
    broker.reset()
    return broker


def client(server: OncebusServer, **options: Any) -> ServiceBusClient:
    """An SDK client that retries as the SDK does by default (3 times), with short back-offs (or ``options``)."""
    return ServiceBusClient.from_connection_string(server.connection_string, **{**FAST_RETRY, **options})


def drain(server: OncebusServer, queue: str) -> list[str]:
    """Receive and complete every message the queue holds (the broker's count), as a consumer would."""
    held = int(server.stats(queue)["active_message_count"])
    bodies: list[str] = []
    with client(server) as sb, sb.get_queue_receiver(queue) as receiver:
        while len(bodies) < held:
            batch = receiver.receive_messages(max_message_count=held - len(bodies), max_wait_time=5)
            assert batch, f"{queue} holds {held} messages, {len(bodies)} came"
            for message in batch:
                bodies.append(str(message))
                receiver.complete_message(message)
    assert server.stats(queue)["active_message_count"] == 0
    return bodies
