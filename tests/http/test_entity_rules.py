"""Entity-level shared access rules through the real admin client and SDK: a queue's own rule lets a client in
on that queue, with the rule's rights and either of its keys, and nowhere else; the rules survive a restart."""

from __future__ import annotations

from pathlib import Path

import pytest
from azure.core.exceptions import HttpResponseError
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusError
from azure.servicebus.management import AccessRights, AuthorizationRule, ServiceBusAdministrationClient

from tests.http.conftest import Served, start_server, trust_ca_for_old_sdks


def _client(served: Served, key_name: str, key: str, entity: str) -> ServiceBusClient:
    text = (
        f"Endpoint=sb://127.0.0.1:{served.port};SharedAccessKeyName={key_name};SharedAccessKey={key};"
        f"EntityPath={entity};UseDevelopmentEmulator=true"
    )
    return ServiceBusClient.from_connection_string(text, retry_total=0)


def _send(served: Served, key_name: str, key: str, queue: str, body: str) -> None:
    with _client(served, key_name, key, queue) as sb, sb.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage(body, message_id=body))


def _receive(served: Served, key_name: str, key: str, queue: str) -> list[str]:
    with _client(served, key_name, key, queue) as sb, sb.get_queue_receiver(queue, max_wait_time=3) as receiver:
        got = receiver.receive_messages(max_message_count=10, max_wait_time=3)
        for message in got:
            receiver.complete_message(message)
        return [str(message) for message in got]


def test_a_queue_rule_grants_its_rights_on_that_queue_only_and_survives_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = start_server(tmp_path / "data")
    try:
        trust_ca_for_old_sdks(served.ca_file, monkeypatch)
        with ServiceBusAdministrationClient.from_connection_string(
            served.connection_string, connection_verify=served.ca_file
        ) as admin:
            rules = [
                AuthorizationRule(key_name="app-send", rights=[AccessRights.send], primary_key="send-primary-key"),
                AuthorizationRule(key_name="app-listen", rights=[AccessRights.listen]),  # keys generated
            ]
            admin.create_queue("orders", authorization_rules=rules)
            admin.create_queue("other")
            got = {rule.key_name: rule for rule in admin.get_queue("orders").authorization_rules or []}
            assert set(got) == {"app-send", "app-listen"}
            assert got["app-send"].primary_key == "send-primary-key" and got["app-send"].secondary_key
            assert [str(r) for r in got["app-listen"].rights or []] in (["Listen"], ["AccessRights.LISTEN"])
            listen_key = got["app-listen"].primary_key or ""
            assert len(listen_key) == 44  # 32 random bytes, base64, as Azure generates them
            with pytest.raises(HttpResponseError):  # at most 12 rules per entity
                admin.create_queue(
                    "crowded",
                    authorization_rules=[
                        AuthorizationRule(key_name=f"r{i}", rights=[AccessRights.send]) for i in range(13)
                    ],
                )

        _send(served, "app-send", "send-primary-key", "orders", "one")
        _send(served, "app-send", got["app-send"].secondary_key or "", "orders", "two")  # the secondary key signs too
        with pytest.raises(ServiceBusError) as refused:  # the rule is Send only
            _receive(served, "app-send", "send-primary-key", "orders")
        assert "'Listen' claim(s) are required" in str(refused.value)
        with pytest.raises(ServiceBusError):  # another queue: the rule is not the namespace's
            _send(served, "app-send", "send-primary-key", "other", "nope")
        with pytest.raises(ServiceBusError):  # a wrong key
            _send(served, "app-send", "not-the-key", "orders", "nope")
        served.stop()

        served = start_server(tmp_path / "data")  # the rules are stored with the queue
        assert sorted(_receive(served, "app-listen", listen_key, "orders")) == ["one", "two"]
        _send(served, "app-send", "send-primary-key", "orders", "three")
    finally:
        served.stop()
