"""The pytest plugin's ``oncebus_isolated_namespace``: each test its own namespace on the session's broker, run the
way users run it (a generated test file in a fresh pytest process), two tests running at once under asyncio."""

from __future__ import annotations

import pytest


def test_each_test_gets_its_own_namespace(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
import asyncio

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient

SEEN = {}


@pytest.mark.oncebus_entities(queues={"orders": {"requires_duplicate_detection": True}})
@pytest.mark.parametrize("who", ["first", "second"])
def test_isolated(oncebus_isolated_namespace, oncebus_server, who):
    ns = oncebus_isolated_namespace
    assert ns.connection_string.startswith(oncebus_server.connection_string.split("SharedAccessKey=")[0][:-1])
    assert f"SharedAccessKeyName=RootManageSharedAccessKey@{ns.name};" in ns.connection_string
    SEEN[who] = ns.name

    async def work():
        async with ServiceBusClient.from_connection_string(ns.connection_string) as client:
            async with client.get_queue_sender("orders") as sender:
                await sender.send_messages(ServiceBusMessage(who, message_id="same-id"))
                await sender.send_messages(ServiceBusMessage(who, message_id="same-id"))
            async with client.get_queue_receiver("orders", max_wait_time=1) as receiver:
                got = await receiver.receive_messages(max_message_count=5, max_wait_time=1)
                return [str(m) for m in got]

    assert asyncio.run(work()) == [who]
    assert ns.stats("orders")["duplicates_dropped"] == 1
    assert "orders" not in oncebus_server.stats()


def test_namespaces_were_distinct_and_deleted(oncebus_server):
    assert len(set(SEEN.values())) == 2
    assert oncebus_server.namespaces() == []
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--oncebus-mode", "thread", timeout=240)
    result.assert_outcomes(passed=3)
