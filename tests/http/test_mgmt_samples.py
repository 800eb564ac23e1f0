"""Equivalents of azure-servicebus's official management samples, against ``oncebus serve``.

The samples (``samples/sync_samples`` and ``samples/async_samples``: ``mgmt_queue``,
``mgmt_topic``, ``mgmt_subscription``) cannot be fetched at test time (no
network), so these tests make the same calls in the same order, written anew.
Where a sample signs in with ``DefaultAzureCredential`` (topic, subscription),
the printed connection string is used instead; every client is given only
that string and ``connection_verify=<the printed CA file>``. ``mgmt_queue``
uses ``api_version=ApiVersion.V2017_04``, as the sample does. ``mgmt_rule`` is
not here: creating rules needs the rules engine (see ``oncebus/http/rules.py``).
"""

from __future__ import annotations

import asyncio
import datetime

from azure.servicebus.aio.management import ServiceBusAdministrationClient as AsyncAdmin
from azure.servicebus.management import ApiVersion, ServiceBusAdministrationClient

from tests.http.conftest import Served


def test_mgmt_queue_sync(server: Served, name: str) -> None:
    with ServiceBusAdministrationClient.from_connection_string(
        server.connection_string, connection_verify=server.ca_file, api_version=ApiVersion.V2017_04
    ) as client:
        client.create_queue(name, max_delivery_count=10, dead_lettering_on_message_expiration=True)
        assert name in [q.name for q in client.list_queues()]
        queue = client.get_queue(name)
        assert queue.auto_delete_on_idle is not None and queue.default_message_time_to_live is not None
        assert queue.dead_lettering_on_message_expiration is True
        queue.max_delivery_count = 5
        client.update_queue(queue)
        queue = client.get_queue(name)
        assert queue.max_delivery_count == 5
        client.update_queue(queue, max_delivery_count=3)
        assert client.get_queue(name).max_delivery_count == 3
        runtime = client.get_queue_runtime_properties(name)
        assert runtime.name == name and runtime.updated_at_utc is not None
        assert (runtime.size_in_bytes, runtime.total_message_count, runtime.active_message_count) == (0, 0, 0)
        assert (runtime.scheduled_message_count, runtime.dead_letter_message_count) == (0, 0)
        client.delete_queue(name)
        assert name not in [q.name for q in client.list_queues()]


def test_mgmt_topic_sync(server: Served, name: str) -> None:
    with ServiceBusAdministrationClient.from_connection_string(
        server.connection_string, connection_verify=server.ca_file
    ) as client:
        client.create_topic(name)
        assert name in [t.name for t in client.list_topics()]
        topic = client.get_topic(name)
        topic.default_message_time_to_live = datetime.timedelta(minutes=10)
        client.update_topic(topic)
        topic = client.get_topic(name)
        assert topic.default_message_time_to_live == datetime.timedelta(minutes=10)
        client.update_topic(topic, default_message_time_to_live=datetime.timedelta(minutes=15))
        assert client.get_topic(name).default_message_time_to_live == datetime.timedelta(minutes=15)
        assert client.get_topic_runtime_properties(name).name == name
        client.delete_topic(name)
        assert name not in [t.name for t in client.list_topics()]


def test_mgmt_subscription_sync(server: Served, name: str) -> None:
    with ServiceBusAdministrationClient.from_connection_string(
        server.connection_string, connection_verify=server.ca_file
    ) as client:
        client.create_topic(name)  # the sample expects SERVICEBUS_TOPIC_NAME to exist
        client.create_subscription(name, "sb_mgmt_sub")
        assert [s.name for s in client.list_subscriptions(name)] == ["sb_mgmt_sub"]
        subscription = client.get_subscription(name, "sb_mgmt_sub")
        subscription.max_delivery_count = 5
        client.update_subscription(name, subscription)
        subscription = client.get_subscription(name, "sb_mgmt_sub")
        assert subscription.max_delivery_count == 5
        client.update_subscription(name, subscription, max_delivery_count=3)
        assert client.get_subscription(name, "sb_mgmt_sub").max_delivery_count == 3
        assert client.get_subscription_runtime_properties(name, "sb_mgmt_sub").name == "sb_mgmt_sub"
        client.delete_subscription(name, "sb_mgmt_sub")
        assert list(client.list_subscriptions(name)) == []


def test_mgmt_samples_async(server: Served, name: str) -> None:
    async def queue(client: AsyncAdmin) -> None:
        await client.create_queue(name, max_delivery_count=10, dead_lettering_on_message_expiration=True)
        assert name in [q.name async for q in client.list_queues()]
        props = await client.get_queue(name)
        props.max_delivery_count = 5
        await client.update_queue(props)
        props = await client.get_queue(name)
        await client.update_queue(props, max_delivery_count=3)
        assert (await client.get_queue(name)).max_delivery_count == 3
        assert (await client.get_queue_runtime_properties(name)).total_message_count == 0
        await client.delete_queue(name)

    async def topic_and_subscription(client: AsyncAdmin) -> None:
        await client.create_topic(name + "-t")
        assert name + "-t" in [t.name async for t in client.list_topics()]
        props = await client.get_topic(name + "-t")
        props.default_message_time_to_live = datetime.timedelta(minutes=10)
        await client.update_topic(props)
        props = await client.get_topic(name + "-t")
        await client.update_topic(props, default_message_time_to_live=datetime.timedelta(minutes=15))
        assert (await client.get_topic(name + "-t")).default_message_time_to_live == datetime.timedelta(minutes=15)
        assert (await client.get_topic_runtime_properties(name + "-t")).subscription_count == 0

        await client.create_subscription(name + "-t", "sb_mgmt_sub")
        assert [s.name async for s in client.list_subscriptions(name + "-t")] == ["sb_mgmt_sub"]
        sub = await client.get_subscription(name + "-t", "sb_mgmt_sub")
        sub.max_delivery_count = 5
        await client.update_subscription(name + "-t", sub)
        sub = await client.get_subscription(name + "-t", "sb_mgmt_sub")
        await client.update_subscription(name + "-t", sub, max_delivery_count=3)
        assert (await client.get_subscription(name + "-t", "sb_mgmt_sub")).max_delivery_count == 3
        runtime = await client.get_subscription_runtime_properties(name + "-t", "sb_mgmt_sub")
        assert runtime.name == "sb_mgmt_sub"
        await client.delete_subscription(name + "-t", "sb_mgmt_sub")
        await client.delete_topic(name + "-t")

    async def main() -> None:
        async with AsyncAdmin.from_connection_string(
            server.connection_string, connection_verify=server.ca_file, api_version=ApiVersion.V2017_04
        ) as client:
            await queue(client)
        async with AsyncAdmin.from_connection_string(
            server.connection_string, connection_verify=server.ca_file
        ) as client:
            await topic_and_subscription(client)

    asyncio.run(main())
