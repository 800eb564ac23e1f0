"""The real ServiceBusAdministrationClient (aio) against ``oncebus serve``."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
)
from azure.servicebus import __version__ as sdk_version
from azure.servicebus.aio.management import ServiceBusAdministrationClient

from tests.http.conftest import Served


def _client(server: Served, connection_string: str | None = None) -> ServiceBusAdministrationClient:
    return ServiceBusAdministrationClient.from_connection_string(
        connection_string or server.connection_string, connection_verify=server.ca_file
    )


pytestmark = pytest.mark.skipif(
    tuple(int(part) for part in sdk_version.split(".")[:2]) < (7, 15),
    reason="azure-servicebus 7.14's aio admin client drops connection_verify, and aiohttp reads the CA "
    "environment only when it is imported: trust the CA with SSL_CERT_FILE set before Python starts",
)


def test_aio_lifecycle_refusals_and_paging(server: Served, name: str) -> None:
    async def scenario() -> None:
        async with _client(server) as admin:
            created = await admin.create_queue(
                name, requires_duplicate_detection=True, duplicate_detection_history_time_window="PT30S"
            )
            assert created.duplicate_detection_history_time_window == timedelta(seconds=30)
            queue = await admin.get_queue(name)
            queue.duplicate_detection_history_time_window = timedelta(minutes=5)
            await admin.update_queue(queue)
            assert (await admin.get_queue(name)).duplicate_detection_history_time_window == timedelta(minutes=5)
            runtime = await admin.get_queue_runtime_properties(name)
            assert runtime.active_message_count == 0 and runtime.total_message_count == 0

            with pytest.raises(ResourceExistsError):
                await admin.create_queue(name)
            with pytest.raises(HttpResponseError) as short:
                await admin.create_queue(name + "-x", duplicate_detection_history_time_window="PT5S")
            assert short.value.status_code == 400 and "00:00:20" in str(short.value)
            with pytest.raises(HttpResponseError) as switch:
                await admin.update_queue(await admin.get_queue(name), requires_duplicate_detection=False)
            assert switch.value.status_code == 400 and "SubCode=40000" in str(switch.value)
            with pytest.raises(ResourceNotFoundError):
                await admin.get_queue(name + "-missing")

            await admin.create_topic(name + "-t", requires_duplicate_detection=True)
            for i in range(102):
                await admin.create_subscription(name + "-t", f"s{i:03d}")
            names = [s.name async for s in admin.list_subscriptions(name + "-t")]
            assert names == [f"s{i:03d}" for i in range(102)]
            runtime_names = [s.name async for s in admin.list_subscriptions_runtime_properties(name + "-t")]
            assert len(runtime_names) == 102
            assert (await admin.get_topic_runtime_properties(name + "-t")).subscription_count == 102
            sub = await admin.get_subscription(name + "-t", "s001")
            await admin.update_subscription(name + "-t", sub, max_delivery_count=2)
            assert (await admin.get_subscription(name + "-t", "s001")).max_delivery_count == 2
            assert [r.name async for r in admin.list_rules(name + "-t", "s001")] == ["$Default"]
            assert name in [q.name async for q in admin.list_queues()]
            assert name + "-t" in [t.name async for t in admin.list_topics()]
            await admin.delete_topic(name + "-t")
            await admin.delete_queue(name)
            with pytest.raises(ResourceNotFoundError):
                await admin.get_topic(name + "-t")
            assert (await admin.get_namespace_properties()).name == "oncebus"

        wrong = server.connection_string.replace("SAS_KEY_VALUE", "wrong")
        async with _client(server, wrong) as admin:
            with pytest.raises(ClientAuthenticationError):
                await admin.get_queue(name)

    asyncio.run(scenario())
