"""What the Python SDK's own administration tests (azure-servicebus 7.15.0, ``tests/mgmt_tests``) found that
oncebus answered differently from Service Bus, each at the administration client's level (issue 35)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.servicebus.management import ServiceBusAdministrationClient

from tests.http.conftest import Served, trust_ca_for_old_sdks


@pytest.fixture(autouse=True)
def _old_sdks_trust_the_ca_by_environment(server: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    trust_ca_for_old_sdks(server.ca_file, monkeypatch)


@pytest.fixture
def admin(server: Served) -> Iterator[ServiceBusAdministrationClient]:
    with ServiceBusAdministrationClient.from_connection_string(
        server.connection_string, connection_verify=server.ca_file
    ) as client:
        yield client


def test_forwarding_set_to_none_on_an_update_is_cleared(admin: ServiceBusAdministrationClient, name: str) -> None:
    """test_mgmt_queues.py: failed before, the forwarding stayed set after an update with None."""
    admin.create_topic(f"{name}-t")
    admin.create_queue(name, forward_to=f"{name}-t", forward_dead_lettered_messages_to=f"{name}-t")
    queue = admin.get_queue(name)
    assert queue.forward_to is not None and queue.forward_to.endswith(f"/{name}-t")
    queue.forward_to = None
    queue.forward_dead_lettered_messages_to = None
    admin.update_queue(queue)
    cleared = admin.get_queue(name)
    assert cleared.forward_to is None and cleared.forward_dead_lettered_messages_to is None
    admin.create_subscription(f"{name}-t", "s", forward_to=name)
    subscription = admin.get_subscription(f"{name}-t", "s")
    subscription.forward_to = None
    admin.update_subscription(f"{name}-t", subscription)
    assert admin.get_subscription(f"{name}-t", "s").forward_to is None


def test_an_empty_entity_name_is_an_api_error(admin: ServiceBusAdministrationClient) -> None:
    """test_mgmt_queues.py: failed before, get_queue_runtime_properties('') read the dashboard page (200)."""
    with pytest.raises(HttpResponseError) as raised:
        admin.get_queue_runtime_properties("")
    assert not isinstance(raised.value, ResourceNotFoundError) or raised.value.status_code == 404
    assert raised.value.status_code is not None and 400 <= raised.value.status_code < 500
    with pytest.raises(ResourceNotFoundError):
        admin.get_queue_runtime_properties("non_existing_queue")


def test_a_subscription_may_forward_to_its_own_topic(admin: ServiceBusAdministrationClient, name: str) -> None:
    """The SDK repository's recording of test_mgmt_subscription_update_success shows Service Bus accepting it
    (200); failed before: refused as a loop."""
    admin.create_topic(name)
    admin.create_subscription(name, "s")
    subscription = admin.get_subscription(name, "s")
    subscription.forward_to = name
    admin.update_subscription(name, subscription)
    assert admin.get_subscription(name, "s").forward_to.endswith(f"/{name}")


def test_express_is_accepted_and_said(admin: ServiceBusAdministrationClient, name: str) -> None:
    """enable_express: Service Bus keeps an express entity's messages in memory first; oncebus accepts the setting
    (5 tests of the suite create express entities) and keeps full durability, reading it back as set."""
    queue = admin.create_queue(name, enable_express=True)
    assert queue.enable_express is True and admin.get_queue(name).enable_express is True
    topic = admin.create_topic(f"{name}-t", enable_express=True)
    assert topic.enable_express is True


def test_a_topics_runtime_properties_count_its_filters(admin: ServiceBusAdministrationClient, name: str) -> None:
    """Failed before: SqlFilterCount and CorrelationFilterCount were not written (the SDK read None)."""
    from azure.servicebus.management import CorrelationRuleFilter, SqlRuleFilter

    admin.create_topic(name)
    admin.create_subscription(name, "s")  # $Default: a TrueFilter, which Service Bus counts as a SQL filter
    admin.create_rule(name, "s", "red", filter=SqlRuleFilter("color = 'red'"))
    admin.create_rule(name, "s", "vip", filter=CorrelationRuleFilter(label="vip"))
    runtime = admin.get_topic_runtime_properties(name)
    assert runtime.subscription_count == 1
    assert (runtime.sql_filter_count, runtime.correlation_filter_count) == (2, 1)
