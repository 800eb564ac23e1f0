"""What a client is told when its key name names a namespace it cannot use (raw AMQP, to read $cbs's text, and
HTTP): an unknown namespace, a second namespace on a bound connection, a bad name, creation without Manage."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
import requests
from azure.servicebus._pyamqp.message import Message, Properties

from oncebus.auth import DEFAULT_KEY, make_token
from oncebus.testing import OncebusServer
from tests.amqp.raw import ATTACH, TRANSFER, attach_frame, encoded, flow_frame
from tests.amqp.test_token_scope import Client

HOST = "127.0.0.1"


class CbsClient(Client):
    def put(self, path: str, key_name: str) -> tuple[int, str]:
        """Put a token signed with the default key under ``key_name`` for ``sb://host/path``."""
        if not self.cbs_ready:
            self.send(attach_frame("cbs-sender", 100, "$cbs", sender=True))
            self.send(attach_frame("cbs-receiver", 101, "$cbs", sender=False))
            self.send(flow_frame(101, 100000))
            self.expect(ATTACH)
            self.expect(ATTACH)
            self.cbs_ready = True
        resource = f"sb://{HOST}:{self.port}/{path}"
        token = make_token(resource, key_name, DEFAULT_KEY, int(time.time()) + 3600)
        request = Message(
            value=token,
            properties=Properties(message_id=str(uuid.uuid4()), reply_to="cbs-receiver"),
            application_properties={
                "operation": "put-token",
                "type": "servicebus.windows.net:sastoken",
                "name": resource,
            },
        )
        self.transfer(100, encoded(request))
        props: Any = self.reply(TRANSFER).application_properties
        return int(props[b"status-code"]), bytes(props[b"status-description"]).decode()


def test_an_unknown_namespace_is_refused_naming_it_and_how_to_create_it(broker: OncebusServer) -> None:
    with CbsClient(broker.port) as client:
        client.handshake()
        status, text = client.put("orders", "RootManageSharedAccessKey@nosuch")
    assert status == 401
    assert "no namespace 'nosuch'" in text and "PUT /$namespaces/nosuch" in text


def test_a_token_for_another_namespace_on_a_bound_connection_is_refused(broker: OncebusServer) -> None:
    a, b = broker.create_namespace(), broker.create_namespace()
    with CbsClient(broker.port) as client:
        client.handshake()
        assert client.put("orders", f"RootManageSharedAccessKey@{a.name}")[0] == 202
        assert client.put("other", f"RootManageSharedAccessKey@{a.name}")[0] == 202  # the same namespace: fine
        status, text = client.put("orders", f"RootManageSharedAccessKey@{b.name}")
        assert status == 403
        assert f"bound to namespace {a.name!r}" in text and repr(b.name) in text
        status, text = client.put("orders", "RootManageSharedAccessKey")  # nor the default one
        assert status == 403 and f"bound to namespace {a.name!r}" in text


def test_the_python_sdk_double_encoded_key_name_selects_the_namespace(broker: OncebusServer) -> None:
    a = broker.create_namespace()
    with CbsClient(broker.port) as client:
        client.handshake()
        # azure-servicebus quotes the key name, then url-encodes the token: '@' arrives as %2540
        assert client.put("orders", f"RootManageSharedAccessKey%40{a.name}")[0] == 202


def _auth(broker: OncebusServer, key_name: str = "RootManageSharedAccessKey") -> dict[str, str]:
    resource = f"http://127.0.0.1:{broker.http_port}/"
    return {"Authorization": make_token(resource, key_name, DEFAULT_KEY, int(time.time()) + 600)}


def test_namespaces_over_http_need_a_manage_key_and_a_valid_name(broker: OncebusServer) -> None:
    base = f"http://127.0.0.1:{broker.http_port}/$namespaces"
    with requests.Session() as http:
        assert http.put(f"{base}/web1").status_code == 401  # no key
        refused = http.put(f"{base}/Bad_Name!", headers=_auth(broker))
        assert refused.status_code == 400
        assert "lower-case letters, digits and '-'" in refused.json()["error"]
        made = http.put(f"{base}/web1", headers=_auth(broker))
        assert made.status_code == 201, made.text
        assert made.json()["connection_string"] == broker.connection_string.replace(
            "RootManageSharedAccessKey", "RootManageSharedAccessKey@web1"
        )
        assert http.put(f"{base}/web1", headers=_auth(broker)).status_code == 409
        # a key of a created namespace cannot create namespaces
        assert http.put(f"{base}/web2", headers=_auth(broker, "RootManageSharedAccessKey@web1")).status_code == 401
        assert "web1" in [n["name"] for n in http.get(base, headers=_auth(broker)).json()]
        # the admin API in web1, with web1's key name
        queue = f"http://127.0.0.1:{broker.http_port}/orders"
        body = '<entry xmlns="http://www.w3.org/2005/Atom"><content type="application/xml"><QueueDescription xmlns="http://schemas.microsoft.com/netservices/2010/10/servicebus/connect"/></content></entry>'
        assert http.put(queue, data=body, headers=_auth(broker, "RootManageSharedAccessKey@web1")).status_code == 201
        assert "orders" not in broker.stats()
        assert http.delete(f"{base}/web1", headers=_auth(broker)).status_code == 200
        gone = http.get(queue, headers=_auth(broker, "RootManageSharedAccessKey@web1"))
        assert gone.status_code == 401 and "PUT /$namespaces/web1" in gone.text


def test_namespaces_over_http_with_basic_credentials(broker: OncebusServer) -> None:
    base = f"http://127.0.0.1:{broker.http_port}/$namespaces"
    made = requests.put(f"{base}/basic1", auth=("RootManageSharedAccessKey", DEFAULT_KEY), timeout=10)
    assert made.status_code == 201, made.text
    wrong = requests.put(f"{base}/basic2", auth=("RootManageSharedAccessKey", "wrong"), timeout=10)
    assert wrong.status_code == 401
    assert requests.delete(f"{base}/basic1", auth=("RootManageSharedAccessKey", DEFAULT_KEY), timeout=10).ok


def test_the_cap_on_namespaces() -> None:
    import asyncio

    from oncebus.auth import DEFAULT_KEYS, KeyRing
    from oncebus.broker import Namespace
    from oncebus.core.errors import QuotaExceededError
    from oncebus.server.namespaces import MAX_NAMESPACES, Namespaces
    from oncebus.store.memory import MemoryStore

    async def run() -> None:
        registry = Namespaces(await Namespace.open(MemoryStore()), KeyRing.of(DEFAULT_KEYS))
        assert registry.max_namespaces == MAX_NAMESPACES == 1000
        capped = Namespaces(registry.default, registry.keys, max_namespaces=2)
        await capped.create("a")
        await capped.create("b")
        with pytest.raises(QuotaExceededError, match=r"at most 2 created namespaces.*ONCEBUS_MAX_NAMESPACES"):
            await capped.create("c")
        await capped.delete("a")
        await capped.create("c")  # room again
        assert capped.names() == ["b", "c"]
        await capped.close()
        await registry.close()

    asyncio.run(run())


def test_the_rest_data_plane_and_the_faults_door_resolve_the_key_name(broker: OncebusServer) -> None:
    ns = broker.create_namespace()
    ns.create_queue("rest")
    base = f"http://127.0.0.1:{broker.http_port}"
    key_name = f"RootManageSharedAccessKey@{ns.name}"
    sent = requests.post(f"{base}/rest/messages", data=b"hello", headers=_auth(broker, key_name), timeout=10)
    assert sent.status_code == 201, sent.text
    assert ns.stats("rest")["accepted"] == 1
    assert "rest" not in broker.stats()  # the default namespace has no such queue
    refused = requests.post(f"{base}/rest/messages", data=b"x", headers=_auth(broker), timeout=10)
    assert refused.status_code in (404, 410)  # the default namespace's answer: no queue 'rest' there
    armed = requests.post(
        f"{base}/$faults", json={"kind": "server-busy", "entity": "rest"}, auth=(key_name, DEFAULT_KEY), timeout=10
    )
    assert armed.status_code == 201, armed.text
    assert [f["kind"] for f in ns.control("fault.list")] == ["server-busy"]
    assert broker.faults() == []
    assert requests.delete(f"{base}/$faults", auth=(key_name, DEFAULT_KEY), timeout=10).ok
    ns.delete()
