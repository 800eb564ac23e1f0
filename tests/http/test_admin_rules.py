"""Subscription rules through the real ServiceBusAdministrationClient (sync and aio) against ``oncebus serve``.

``test_mgmt_rule_sample_*`` make the calls of azure-servicebus's official
``mgmt_rule`` sample (``samples/sync_samples/mgmt_rule.py`` and its async twin)
in the same order, written anew: the sample signs in with
``DefaultAzureCredential``; here the printed connection string is used instead.
The rest: an invalid SQL text is refused with 400 naming where, and nothing is
stored; rules created through the admin client route what the data-plane
client sends to exactly the matching subscriptions, actions applied; a
duplicate dropped at the topic reaches no subscription.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceNotFoundError
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.aio.management import ServiceBusAdministrationClient as AsyncAdmin
from azure.servicebus.management import (
    CorrelationRuleFilter,
    FalseRuleFilter,
    ServiceBusAdministrationClient,
    SqlRuleAction,
    SqlRuleFilter,
    TrueRuleFilter,
)

from tests.http.conftest import Served


@pytest.fixture
def admin(server: Served) -> Iterator[ServiceBusAdministrationClient]:
    with ServiceBusAdministrationClient.from_connection_string(
        server.connection_string, connection_verify=server.ca_file
    ) as client:
        yield client


def _params(rule: object) -> dict[str, object]:
    return dict(rule.filter.parameters)  # type: ignore[attr-defined]


def test_mgmt_rule_sample_sync(admin: ServiceBusAdministrationClient, name: str) -> None:
    topic, subscription = name, "sub"
    admin.create_topic(topic)
    admin.create_subscription(topic, subscription)
    rule_name = "sb_mgmt_rule" + str(uuid.uuid4())
    sql_rule_name = "sb_sql_rule" + str(uuid.uuid4())

    # create_rule
    admin.create_rule(topic, subscription, rule_name)
    sql_filter_parametrized = SqlRuleFilter(
        "property1 = @param1 AND property2 = @param2", parameters={"@param1": "value", "@param2": 1}
    )
    admin.create_rule(topic, subscription, sql_rule_name, filter=sql_filter_parametrized)
    # list_rules
    assert [r.name for r in admin.list_rules(topic, subscription)] == ["$Default", rule_name, sql_rule_name]
    got_sql = admin.get_rule(topic, subscription, sql_rule_name)
    assert got_sql.filter.sql_expression == "property1 = @param1 AND property2 = @param2"
    assert _params(got_sql) == {"@param1": "value", "@param2": 1}
    # get_and_update_rule
    rule_properties = admin.get_rule(topic, subscription, rule_name)
    assert rule_properties.name == rule_name and isinstance(rule_properties.filter, TrueRuleFilter)
    assert rule_properties.created_at_utc is not None
    rule_properties.filter = SqlRuleFilter(
        "property1 = @param1 AND property2 = @param2", parameters={"@param1": "value2", "@param2": 2}
    )
    admin.update_rule(topic, subscription, rule_properties)
    assert _params(admin.get_rule(topic, subscription, rule_name)) == {"@param1": "value2", "@param2": 2}
    rule_properties = admin.get_rule(topic, subscription, rule_name)
    admin.update_rule(
        topic,
        subscription,
        rule_properties,
        filter=SqlRuleFilter(
            "property1 = @param1 AND property2 = @param2", parameters={"@param1": "value3", "@param2": 3}
        ),
    )
    # azure-servicebus 7.15 serializes the parameters of the rule object it is given, not those of the
    # filter= keyword (update_rule: serialize_rule_key_values(request_body, rule)); oncebus stores what is sent
    assert _params(admin.get_rule(topic, subscription, rule_name)) == {"@param1": "value2", "@param2": 2}
    admin.update_rule(
        topic, subscription, admin.get_rule(topic, subscription, rule_name), filter=SqlRuleFilter("x = 1")
    )
    assert admin.get_rule(topic, subscription, rule_name).filter.sql_expression == "x = 1"
    # delete_rule
    admin.delete_rule(topic, subscription, rule_name)
    admin.delete_rule(topic, subscription, sql_rule_name)
    assert [r.name for r in admin.list_rules(topic, subscription)] == ["$Default"]
    admin.delete_topic(topic)


def test_mgmt_rule_sample_async(server: Served, name: str) -> None:
    async def sample() -> None:
        async with AsyncAdmin.from_connection_string(
            server.connection_string, connection_verify=server.ca_file
        ) as admin:
            topic, subscription = name, "sub"
            await admin.create_topic(topic)
            await admin.create_subscription(topic, subscription)
            rule_name = "sb_mgmt_rule" + str(uuid.uuid4())
            sql_rule_name = "sb_sql_rule" + str(uuid.uuid4())
            await admin.create_rule(topic, subscription, rule_name)
            await admin.create_rule(
                topic,
                subscription,
                sql_rule_name,
                filter=SqlRuleFilter(
                    "property1 = @param1 AND property2 = @param2", parameters={"@param1": "value", "@param2": 1}
                ),
            )
            assert [r.name async for r in admin.list_rules(topic, subscription)] == [
                "$Default",
                rule_name,
                sql_rule_name,
            ]
            rule_properties = await admin.get_rule(topic, subscription, rule_name)
            rule_properties.filter = SqlRuleFilter(
                "property1 = @param1 AND property2 = @param2", parameters={"@param1": "value2", "@param2": 2}
            )
            await admin.update_rule(topic, subscription, rule_properties)
            assert _params(await admin.get_rule(topic, subscription, rule_name)) == {"@param1": "value2", "@param2": 2}
            rule_properties = await admin.get_rule(topic, subscription, rule_name)
            await admin.update_rule(
                topic,
                subscription,
                rule_properties,
                filter=SqlRuleFilter(
                    "property1 = @param1 AND property2 = @param2", parameters={"@param1": "value3", "@param2": 3}
                ),
            )
            # the SDK sends the rule object's parameters, not the filter keyword's (see the sync test)
            assert _params(await admin.get_rule(topic, subscription, rule_name)) == {"@param1": "value2", "@param2": 2}
            await admin.delete_rule(topic, subscription, rule_name)
            await admin.delete_rule(topic, subscription, sql_rule_name)
            assert [r.name async for r in admin.list_rules(topic, subscription)] == ["$Default"]
            await admin.delete_topic(topic)

    asyncio.run(sample())


def test_rule_refusals_name_what_is_wrong_and_store_nothing(admin: ServiceBusAdministrationClient, name: str) -> None:
    admin.create_topic(name)
    admin.create_subscription(name, "s")
    with pytest.raises(HttpResponseError) as bad:
        admin.create_rule(name, "s", "bad", filter=SqlRuleFilter("color = = 'red'"))
    assert bad.value.status_code == 400
    assert "rule 'bad': invalid SQL filter at line 1, column 9" in str(bad.value)
    with pytest.raises(HttpResponseError) as bad_action:
        admin.create_rule(name, "s", "bad", filter=TrueRuleFilter(), action=SqlRuleAction("SET = 1"))
    assert bad_action.value.status_code == 400 and "invalid SQL action" in str(bad_action.value)
    assert [r.name for r in admin.list_rules(name, "s")] == ["$Default"]  # nothing was stored

    admin.create_rule(name, "s", "ok", filter=SqlRuleFilter("a = 1"))
    with pytest.raises(ResourceExistsError):
        admin.create_rule(name, "s", "OK", filter=SqlRuleFilter("a = 2"))  # names ignore case
    ok = admin.get_rule(name, "s", "ok")
    ok.filter = SqlRuleFilter("a = = 2")
    with pytest.raises(HttpResponseError) as bad_update:
        admin.update_rule(name, "s", ok)
    assert bad_update.value.status_code == 400 and "column 5" in str(bad_update.value)
    assert admin.get_rule(name, "s", "ok").filter.sql_expression == "a = 1"  # unchanged
    with pytest.raises(ResourceNotFoundError):
        admin.get_rule(name, "s", "missing")
    with pytest.raises(ResourceNotFoundError):
        admin.delete_rule(name, "s", "missing")
    with pytest.raises(ResourceNotFoundError):
        admin.create_rule(name, "missing-sub", "r")
    admin.delete_topic(name)


def _drain(client: ServiceBusClient, topic: str, subscription: str) -> list[tuple[str, str | None, dict[str, object]]]:
    out = []
    with client.get_subscription_receiver(topic, subscription, max_wait_time=1) as receiver:
        while batch := receiver.receive_messages(20, max_wait_time=1):
            for message in batch:
                properties = {
                    k.decode() if isinstance(k, bytes) else k: v
                    for k, v in (message.application_properties or {}).items()
                }
                properties = {k: v.decode() if isinstance(v, bytes) else v for k, v in properties.items()}
                out.append((str(message.message_id), message.subject, properties))
                receiver.complete_message(message)
    return out


def test_rules_made_with_the_admin_client_route_sdk_sends(
    admin: ServiceBusAdministrationClient, server: Served, name: str
) -> None:
    admin.create_topic(name, requires_duplicate_detection=True)
    for sub in ("all", "red", "vip", "nothing", "never"):
        admin.create_subscription(name, sub)
    admin.delete_rule(name, "red", "$Default")
    admin.create_rule(
        name,
        "red",
        "red",
        filter=SqlRuleFilter("color = @c", parameters={"@c": "red"}),
        action=SqlRuleAction("SET sys.Label = 'hot'; SET n = n * 10; REMOVE color"),
    )
    admin.delete_rule(name, "vip", "$Default")
    admin.create_rule(name, "vip", "vip", filter=CorrelationRuleFilter(label="order", properties={"n": 3}))
    admin.delete_rule(name, "nothing", "$Default")  # no rules at all: receives nothing
    admin.delete_rule(name, "never", "$Default")
    admin.create_rule(name, "never", "false", filter=FalseRuleFilter())

    with ServiceBusClient.from_connection_string(server.connection_string) as client:
        with client.get_topic_sender(name) as sender:
            sender.send_messages(
                ServiceBusMessage("1", message_id="a", subject="order", application_properties={"color": "red", "n": 3})
            )
            sender.send_messages(
                ServiceBusMessage(
                    "2", message_id="b", subject="order", application_properties={"color": "blue", "n": 3}
                )
            )
            sender.send_messages(
                ServiceBusMessage("3", message_id="c", application_properties={"color": "red", "n": 1})
            )
            # a duplicate of a: dropped at the topic, it reaches no subscription (even with other properties)
            sender.send_messages(
                ServiceBusMessage(
                    "4", message_id="a", subject="order", application_properties={"color": "blue", "n": 3}
                )
            )
        got = {sub: _drain(client, name, sub) for sub in ("all", "red", "vip", "nothing", "never")}
    assert [m[0] for m in got["all"]] == ["a", "b", "c"]
    assert got["red"] == [
        ("a", "hot", {"n": 30, "RuleName": "red"}),
        ("c", "hot", {"n": 10, "RuleName": "red"}),
    ]
    assert got["vip"] == [("a", "order", {"color": "red", "n": 3}), ("b", "order", {"color": "blue", "n": 3})]
    assert got["nothing"] == [] and got["never"] == []
    runtime = admin.get_topic_runtime_properties(name)
    assert runtime.subscription_count == 5
    admin.delete_topic(name)


def test_forwarding_auto_delete_and_filter_exception_settings_round_trip(
    admin: ServiceBusAdministrationClient, name: str
) -> None:
    admin.create_queue(name + "-end")
    queue = admin.create_queue(
        name,
        forward_to=name + "-end",
        forward_dead_lettered_messages_to=name + "-end",
        auto_delete_on_idle=timedelta(minutes=7),
    )
    assert queue.forward_to is not None and queue.forward_to.endswith("/" + name + "-end")  # as Azure: sb://host/name
    assert queue.forward_dead_lettered_messages_to.endswith("/" + name + "-end")  # type: ignore[union-attr]
    assert admin.get_queue(name).auto_delete_on_idle == timedelta(minutes=7)
    with pytest.raises(HttpResponseError) as loop:
        admin.update_queue(admin.get_queue(name + "-end"), forward_to=name)
    assert loop.value.status_code == 400 and "loop" in str(loop.value)
    with pytest.raises(ResourceNotFoundError):
        admin.create_queue(name + "-x", forward_to=name + "-nowhere")
    with pytest.raises(HttpResponseError) as short:
        admin.create_queue(name + "-y", auto_delete_on_idle=timedelta(minutes=1))
    assert short.value.status_code == 400 and "at least 5 minutes" in str(short.value)

    admin.create_topic(name + "-t", auto_delete_on_idle=timedelta(hours=1))
    assert admin.get_topic(name + "-t").auto_delete_on_idle == timedelta(hours=1)
    sub = admin.create_subscription(
        name + "-t", "s", forward_to=name + "-end", dead_lettering_on_filter_evaluation_exceptions=False
    )
    assert sub.dead_lettering_on_filter_evaluation_exceptions is False and sub.forward_to.endswith(name + "-end")  # type: ignore[union-attr]
    got = admin.get_subscription(name + "-t", "s")
    got.dead_lettering_on_filter_evaluation_exceptions = True
    admin.update_subscription(name + "-t", got)
    assert admin.get_subscription(name + "-t", "s").dead_lettering_on_filter_evaluation_exceptions is True
    for entity in (name + "-t",):
        admin.delete_topic(entity)
    for entity in (name, name + "-end"):
        admin.delete_queue(entity)
