"""The REST data plane (Azure's Send Message, Send Message Batch, Peek-Lock, Unlock, Delete, Renew Lock and
Receive-and-Delete) with a real HTTP client (requests) against ``oncebus serve``, and its messages seen by the SDK."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from email.utils import parsedate_to_datetime

import pytest
import requests
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.management import AccessRights, AuthorizationRule, ServiceBusAdministrationClient

from oncebus.auth import make_token
from tests.http.conftest import Served

ROOT = ("RootManageSharedAccessKey", "SAS_KEY_VALUE")


@pytest.fixture(scope="module")
def admin(server: Served) -> Iterator[ServiceBusAdministrationClient]:
    with ServiceBusAdministrationClient.from_connection_string(
        server.connection_string, connection_verify=server.ca_file
    ) as client:
        yield client


def url(server: Served, path: str) -> str:
    return f"http://127.0.0.1:{server.http_port}/{path}"


def auth(server: Served, key: tuple[str, str] = ROOT, resource: str = "") -> dict[str, str]:
    return {"Authorization": make_token(url(server, resource), key[0], key[1], int(time.time()) + 600)}


def send(server: Served, entity: str, body: bytes, broker: dict[str, object] | None = None, **headers: str) -> int:
    h = {**auth(server), **headers}
    if broker is not None:
        h["BrokerProperties"] = json.dumps(broker)
    return requests.post(url(server, f"{entity}/messages"), data=body, headers=h, timeout=10).status_code


def lock(server: Served, entity: str, timeout: int = 0) -> requests.Response:
    return requests.post(url(server, f"{entity}/messages/head?timeout={timeout}"), headers=auth(server), timeout=10)


def take(server: Served, entity: str, timeout: int = 0) -> requests.Response:
    return requests.delete(url(server, f"{entity}/messages/head?timeout={timeout}"), headers=auth(server), timeout=10)


def test_send_with_a_message_id_twice_stores_one_with_its_properties(
    server: Served, admin: ServiceBusAdministrationClient, name: str
) -> None:
    admin.create_queue(name, requires_duplicate_detection=True)
    broker = {"MessageId": "order-1", "CorrelationId": "c-7", "Label": "new", "TimeToLive": 300, "SessionId": None}
    for _ in range(2):
        reply = send(server, name, b"hello", broker, Priority='"High"', Count="3", **{"Content-Type": "text/plain"})
        assert reply == 201
    got = lock(server, name)
    assert got.status_code == 201, got.text
    props = json.loads(got.headers["BrokerProperties"])
    assert got.content == b"hello"
    assert props["MessageId"] == "order-1" and props["CorrelationId"] == "c-7" and props["Label"] == "new"
    assert props["TimeToLive"] == 300 and props["DeliveryCount"] == 1 and props["SequenceNumber"] >= 1
    assert parsedate_to_datetime(props["EnqueuedTimeUtc"]).tzinfo is not None  # RFC 1123
    assert got.headers["Priority"] == '"High"' and got.headers["Count"] == "3"
    assert got.headers["Content-Type"] == "text/plain"
    assert got.headers["Location"].endswith(f"/{name}/messages/{props['SequenceNumber']}/{props['LockToken']}")
    assert requests.delete(got.headers["Location"], headers=auth(server), timeout=10).status_code == 200
    assert take(server, name).status_code == 204  # the duplicate was not stored


def test_batch_then_receive_and_delete(server: Served, admin: ServiceBusAdministrationClient, name: str) -> None:
    admin.create_queue(name)
    batch = [
        {"Body": "one", "BrokerProperties": {"MessageId": "m1", "Label": "a"}},
        {"Body": "two", "UserProperties": {"Priority": "Low", "n": 2}},
    ]
    headers = {**auth(server), "Content-Type": "application/vnd.microsoft.servicebus.json"}
    reply = requests.post(url(server, f"{name}/messages"), data=json.dumps(batch), headers=headers, timeout=10)
    assert reply.status_code == 201, reply.text
    first, second = take(server, name), take(server, name)
    assert (first.status_code, first.content) == (200, b"one")
    assert json.loads(first.headers["BrokerProperties"])["Label"] == "a"
    assert "Location" not in first.headers
    assert (second.status_code, second.content) == (200, b"two")
    assert second.headers["Priority"] == '"Low"' and second.headers["n"] == "2"
    assert take(server, name).status_code == 204


def test_unlock_redelivers_with_delivery_count_2_and_renew(
    server: Served, admin: ServiceBusAdministrationClient, name: str
) -> None:
    admin.create_queue(name)
    assert send(server, name, b"x") == 201
    first = lock(server, name)
    where = first.headers["Location"]
    renewed = requests.post(where, headers=auth(server), timeout=10)
    assert renewed.status_code == 200 and "LockedUntilUtc" in json.loads(renewed.headers["BrokerProperties"])
    assert requests.put(where, headers=auth(server), timeout=10).status_code == 200
    assert requests.put(where, headers=auth(server), timeout=10).status_code == 404  # the lock is gone
    again = lock(server, name)
    assert again.status_code == 201
    assert json.loads(again.headers["BrokerProperties"])["DeliveryCount"] == 2
    assert requests.delete(again.headers["Location"], headers=auth(server), timeout=10).status_code == 200
    assert lock(server, name).status_code == 204


def test_a_subscription_receives_over_rest(server: Served, admin: ServiceBusAdministrationClient, name: str) -> None:
    admin.create_topic(name)
    admin.create_subscription(name, "audit")
    assert send(server, name, b"event", {"MessageId": "e1"}) == 201
    got = lock(server, f"{name}/subscriptions/audit")
    assert got.status_code == 201 and got.content == b"event"
    assert f"/{name}/subscriptions/audit/messages/" in got.headers["Location"]
    assert requests.delete(got.headers["Location"], headers=auth(server), timeout=10).status_code == 200
    to_sub = requests.post(url(server, f"{name}/subscriptions/audit/messages"), headers=auth(server), timeout=10)
    assert to_sub.status_code == 400 and "not to a subscription" in to_sub.text


def test_refusals_name_what_was_wrong_and_store_nothing(
    server: Served, admin: ServiceBusAdministrationClient, name: str
) -> None:
    rules = [AuthorizationRule(key_name="only-listen", rights=[AccessRights.listen], primary_key="listen-key-1")]
    admin.create_queue(name, authorization_rules=rules)  # Standard: 256 KB a message
    where = url(server, f"{name}/messages")
    no_key = requests.post(where, data=b"x", timeout=10)
    assert no_key.status_code == 401 and "Authorization" in no_key.text
    wrong = requests.post(where, data=b"x", headers=auth(server, (ROOT[0], "not-the-key")), timeout=10)
    assert wrong.status_code == 401
    listen = auth(server, ("only-listen", "listen-key-1"), name)
    refused = requests.post(where, data=b"x", headers=listen, timeout=10)
    assert refused.status_code == 401 and "Send" in refused.text
    bad_json = requests.post(where, data=b"x", headers={**auth(server), "BrokerProperties": "{nope"}, timeout=10)
    assert bad_json.status_code == 400 and "BrokerProperties" in bad_json.text
    bad_ttl = send(server, name, b"x", {"TimeToLive": "soon"})
    assert bad_ttl == 400
    bad_date = requests.post(
        where, headers={**auth(server), "BrokerProperties": '{"ScheduledEnqueueTimeUtc": "tomorrow"}'}, timeout=10
    )
    assert bad_date.status_code == 400 and "RFC 1123" in bad_date.text
    assert send(server, "no-such-queue-here", b"x") == 410
    assert lock(server, "no-such-queue-here").status_code == 410
    bad_token = requests.delete(url(server, f"{name}/messages/1/not-a-token"), headers=auth(server), timeout=10)
    assert bad_token.status_code == 404 and "lock token" in bad_token.text
    unknown = requests.delete(
        url(server, f"{name}/messages/1/00000000-0000-0000-0000-000000000001"), headers=auth(server), timeout=10
    )
    assert unknown.status_code == 404
    assert take(server, name).status_code == 204  # nothing of the above was stored
    # the Listen-only key receives
    got = requests.delete(url(server, f"{name}/messages/head?timeout=0"), headers=listen, timeout=10)
    assert got.status_code == 204
    admin.create_queue(name + "-s", requires_session=True)  # sessions are not received over REST
    in_session = lock(server, name + "-s")
    assert in_session.status_code == 400 and "requires sessions" in in_session.text


def test_oversize_body_is_refused_with_403(server: Served, admin: ServiceBusAdministrationClient, name: str) -> None:
    admin.create_queue(name)  # 256 KB
    reply = requests.post(url(server, f"{name}/messages"), data=b"x" * (300 * 1024), headers=auth(server), timeout=10)
    assert reply.status_code == 403, reply.text
    assert "size" in reply.text.lower()
    assert take(server, name).status_code == 204


def test_rest_and_the_sdk_see_each_others_messages(
    server: Served, admin: ServiceBusAdministrationClient, name: str
) -> None:
    admin.create_queue(name)
    assert send(server, name, b"from-rest", {"MessageId": "r1", "CorrelationId": "c1", "Label": "L"}, Kind='"k"') == 201
    with ServiceBusClient.from_connection_string(server.connection_string) as sb:
        with sb.get_queue_receiver(name, max_wait_time=5) as receiver:
            (got,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            assert b"".join(got.body) == b"from-rest"
            assert (got.message_id, got.correlation_id, got.subject) == ("r1", "c1", "L")
            assert got.application_properties == {b"kind": b"k"} or got.application_properties == {"kind": "k"}
            receiver.complete_message(got)
        with sb.get_queue_sender(name) as sender:
            message = ServiceBusMessage(b"from-sdk", message_id="s1", subject="S", application_properties={"n": 5})
            sender.send_messages(message)
    reply = take(server, name, timeout=5)
    assert reply.status_code == 200 and reply.content == b"from-sdk"
    props = json.loads(reply.headers["BrokerProperties"])
    assert props["MessageId"] == "s1" and props["Label"] == "S"
    assert reply.headers["n"] == "5"


BATCH = "application/vnd.microsoft.servicebus.json"


def post(server: Served, entity: str, body: bytes, **headers: str) -> requests.Response:
    return requests.post(url(server, f"{entity}/messages"), data=body, headers={**auth(server), **headers}, timeout=10)


def test_an_integer_property_past_64_bits_is_refused_and_the_queue_still_delivers(
    server: Served, admin: ServiceBusAdministrationClient, name: str
) -> None:
    """Issue 33 item 2: it was answered 201, and AMQP receivers of the queue got nothing from then on."""
    admin.create_queue(name)
    assert post(server, name, b"before").status_code == 201
    big = post(server, name, b"big", **{"X-Big": "1000000000000000000000000000000"})
    assert big.status_code == 400, big.text
    assert "x-big" in big.text.lower() and "1000000000000000000000000000000" in big.text
    assert "-2**63 to 2**64 - 1" in big.text  # the range allowed
    negative = post(server, name, b"negative", **{"X-Low": str(-(2**63) - 1)})
    assert negative.status_code == 400 and "x-low" in negative.text.lower()
    batch = [{"Body": "one", "UserProperties": {"n": 1}}, {"Body": "two", "UserProperties": {"Big": 10**30}}]
    refused = post(server, name, json.dumps(batch).encode(), **{"Content-Type": BATCH})
    assert refused.status_code == 400, refused.text
    assert "message 2 of 2" in refused.text and "'Big'" in refused.text and "2**64 - 1" in refused.text
    nested = [{"Body": "one", "UserProperties": {"tags": ["a", "b"]}}]
    listed = post(server, name, json.dumps(nested).encode(), **{"Content-Type": BATCH})
    assert listed.status_code == 400 and "'tags' is a list" in listed.text, listed.text
    # the widest integers AMQP carries are kept, as a long and as a ulong
    edges = {"X-Min": str(-(2**63)), "X-Max": str(2**64 - 1)}
    assert post(server, name, b"edges", **edges).status_code == 201
    assert post(server, name, b"after").status_code == 201
    with ServiceBusClient.from_connection_string(server.connection_string) as sb:
        with sb.get_queue_receiver(name, max_wait_time=5) as receiver:
            got = receiver.receive_messages(max_message_count=10, max_wait_time=5)
            while len(got) < 3 and (more := receiver.receive_messages(max_message_count=10, max_wait_time=2)):
                got += more
            assert [b"".join(m.body) for m in got] == [b"before", b"edges", b"after"]  # none of the refused
            properties = {
                str(k, "utf-8") if isinstance(k, bytes) else k: v for k, v in got[1].application_properties.items()
            }
            assert properties == {"x-min": -(2**63), "x-max": 2**64 - 1}
            for message in got:
                receiver.complete_message(message)


def test_deep_json_is_a_400_naming_where_it_was(
    server: Served, admin: ServiceBusAdministrationClient, name: str
) -> None:
    """Issue 33 item 5: 15,000 "[" in BrokerProperties or a property header, 400,000 in a batch: 500 and a
    RecursionError in the log."""
    admin.create_queue(name)
    deep = "[" * 15_000
    broker = post(server, name, b"x", BrokerProperties=deep)
    assert broker.status_code == 400 and "BrokerProperties" in broker.text and "nested too deeply" in broker.text
    closed = post(server, name, b"x", BrokerProperties=deep + "]" * 15_000)
    assert closed.status_code == 400 and "BrokerProperties" in closed.text
    header = post(server, name, b"x", **{"X-Deep": deep})
    assert header.status_code == 400 and "x-deep" in header.text.lower(), header.text
    array = post(server, name, b"x", **{"X-Tags": '["a", "b"]'})
    assert array.status_code == 400 and "x-tags" in array.text.lower() and "JSON array" in array.text
    batch = post(server, name, b"[" * 400_000, **{"Content-Type": BATCH})
    assert batch.status_code == 400 and "batch" in batch.text and "nested too deeply" in batch.text
    in_batch = post(
        server, name, b'[{"Body": "x", "UserProperties": ' + b"[" * 20_000 + b"]", **{"Content-Type": BATCH}
    )
    assert in_batch.status_code == 400 and "batch" in in_batch.text
    text = post(server, name, b"kept", **{"X-Note": "[draft] not JSON, kept as text"})
    assert text.status_code == 201
    got = take(server, name)
    assert got.status_code == 200 and got.content == b"kept"  # nothing of the refused ones was stored
    assert json.loads(got.headers["X-Note"]) == "[draft] not JSON, kept as text"
    assert take(server, name).status_code == 204
    assert not [line for line in server.output if "RecursionError" in line or "Traceback" in line]


def test_a_disabled_entity_is_a_403_naming_its_status(
    server: Served, admin: ServiceBusAdministrationClient, name: str
) -> None:
    """Issue 33 item 5: a send to a SendDisabled queue, a receive from a ReceiveDisabled one: 500."""
    admin.create_queue(name + "-s", status="SendDisabled")
    admin.create_queue(name + "-r", status="ReceiveDisabled")
    admin.create_queue(name + "-d", status="Disabled")
    refused = post(server, name + "-s", b"x")
    assert refused.status_code == 403 and "SendDisabled" in refused.text and "refuses sends" in refused.text
    assert lock(server, name + "-s").status_code == 204  # it still receives (nothing there)
    assert post(server, name + "-r", b"x").status_code == 201  # it still takes sends
    for answer in (lock(server, name + "-r"), take(server, name + "-r")):
        assert answer.status_code == 403 and "ReceiveDisabled" in answer.text and "refuses receives" in answer.text
    assert post(server, name + "-d", b"x").status_code == 403
    assert lock(server, name + "-d").status_code == 403
    queue = admin.get_queue(name + "-r")
    queue.status = "Active"
    admin.update_queue(queue)
    got = take(server, name + "-r")
    assert got.status_code == 200 and got.content == b"x"  # the message sent while receives were refused
