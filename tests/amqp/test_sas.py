"""SAS token verification and the $cbs put-token judgement (no server)."""

from __future__ import annotations

from urllib.parse import quote_plus

import pytest
from azure.servicebus._pyamqp.utils import generate_sas_token

from oncebus.amqp import cbs, sas
from oncebus.core.errors import UnauthorizedError

NOW = 1_800_000_000.0
KEYS = {"RootManageSharedAccessKey": "SAS_KEY_VALUE", "sender": "s3cr3t"}


def sdk_token(resource: str, key_name: str = "RootManageSharedAccessKey", key: str = "SAS_KEY_VALUE") -> str:
    """A token exactly as the azure-servicebus SDK builds it."""
    return str(generate_sas_token(resource, key_name, key, int(NOW) + 3600))


def test_sdk_token_verifies_and_grants_its_resource() -> None:
    grant = sas.verify_token(sdk_token("sb://127.0.0.1:5672/Orders"), KEYS, NOW)
    assert grant.resource_path == "orders"
    assert grant.key_name == "RootManageSharedAccessKey"
    assert grant.expires_at == NOW + 3600
    assert grant.covers("orders", NOW)
    assert grant.covers("ORDERS/$DeadLetterQueue", NOW)
    assert grant.covers("orders/$management", NOW)
    assert not grant.covers("orders2", NOW)
    assert not grant.covers("orders", NOW + 3600)


def test_a_verified_token_carries_its_keys_rights_and_host() -> None:
    ring = sas.KeyRing([sas.SasKey("sender", "s3cr3t", frozenset({sas.SEND}))])
    grant = sas.verify_token(sdk_token("sb://Host.Example:5671/q", "sender", "s3cr3t"), ring, NOW)
    assert (grant.rights, grant.host) == ({sas.SEND}, "host.example")
    assert sas.verify_token(sdk_token("sb://h/q"), KEYS, NOW).rights == sas.ALL_RIGHTS  # a plain mapping: all


@pytest.mark.parametrize("expiry", ["1" + "0" * 400, "253402300800", "99999999999999999999999"])
def test_an_expiry_past_year_9999_is_refused_not_overflowed(expiry: str) -> None:
    token = sas.make_token("sb://h/q", "sender", "s3cr3t", int(expiry))
    with pytest.raises(UnauthorizedError, match="9999"):
        sas.verify_token(token, KEYS, NOW)


def test_namespace_token_covers_everything() -> None:
    grant = sas.verify_token(sdk_token("sb://localhost/"), KEYS, NOW)
    assert grant.covers("anything/Subscriptions/sub", NOW)


def test_make_token_matches_the_sdk() -> None:
    ours = sas.make_token("sb://h/q", "sender", "s3cr3t", int(NOW) + 3600)
    assert ours == sdk_token("sb://h/q", "sender", "s3cr3t")


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        (sdk_token("sb://h/q", key="wrong"), "signature"),
        (sdk_token("sb://h/q", key_name="nobody"), "unknown shared access key name"),
        (sdk_token("sb://h/q").replace(str(int(NOW) + 3600), str(int(NOW) + 7200)), "signature"),
        (sdk_token("sb://h/q").replace(quote_plus("sb://h/q"), quote_plus("sb://h/other")), "signature"),
        ("Bearer abc", "not a shared access signature"),
        ("SharedAccessSignature sr=x&se=1", "lacks sig, skn"),
        ("SharedAccessSignature sr=x&sig=y&se=soon&skn=RootManageSharedAccessKey", "whole number"),
    ],
)
def test_bad_tokens_are_refused(token: str, reason: str) -> None:
    with pytest.raises(UnauthorizedError, match=reason):
        sas.verify_token(token, KEYS, NOW)


def test_expired_token_is_refused() -> None:
    token = str(generate_sas_token("sb://h/q", "sender", "s3cr3t", int(NOW) - 1))
    with pytest.raises(UnauthorizedError, match="expired"):
        sas.verify_token(token, KEYS, NOW)


def test_authorize_checks_the_audience_is_covered() -> None:
    token = sdk_token("sb://h/orders")
    assert sas.authorize(token, "sb://h/orders/Subscriptions/x", KEYS, NOW).resource_path == "orders/subscriptions/x"
    with pytest.raises(UnauthorizedError, match="does not cover"):
        sas.authorize(token, "sb://h/payments", KEYS, NOW)


def test_parse_keys_and_connection_string() -> None:
    assert dict(sas.parse_keys("a=1,2; b=x=y\n# a comment\nc:Send,listen=k:e,y")) == {
        "a": "1,2",
        "b": "x=y",
        "c": "k:e,y",
    }
    ring = sas.parse_keys("a=1;b:Send=2;c:Manage=3;d:listen,SEND=4")
    assert ring.rights("a") == ring.rights("c") == sas.ALL_RIGHTS  # Manage brings Send and Listen
    assert ring.rights("b") == {sas.SEND} and ring.rights("d") == {sas.SEND, sas.LISTEN}
    with pytest.raises(ValueError, match="NAME=KEY or NAME:RIGHTS=KEY"):
        sas.parse_keys("nokey")
    with pytest.raises(ValueError, match="'Read' is not a right; use a comma-separated list of Send, Listen, Manage"):
        sas.parse_keys("a:Read=secret")
    with pytest.raises(ValueError, match="given twice"):
        sas.parse_keys("a=1;a=2")
    with pytest.raises(ValueError) as refused:
        sas.parse_keys("bad name=topsecret")
    assert "topsecret" not in str(refused.value)  # an error never shows the key
    text = sas.connection_string("127.0.0.1", 5999)
    assert text == (
        "Endpoint=sb://127.0.0.1:5999;SharedAccessKeyName=RootManageSharedAccessKey;"
        "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true"
    )


def test_put_token_statuses() -> None:
    props = {"operation": "put-token", "type": "servicebus.windows.net:sastoken", "name": "sb://h/q"}
    ok = cbs.put_token(props, sdk_token("sb://h/q"), KEYS, NOW)
    assert (ok.status_code, ok.grant is not None) == (202, True)
    bad = cbs.put_token(props, sdk_token("sb://h/q", key="wrong"), KEYS, NOW)
    assert (bad.status_code, bad.grant) == (401, None)
    assert cbs.put_token({**props, "operation": "delete-token"}, "x", KEYS, NOW).status_code == 400
    assert cbs.put_token({"operation": "put-token"}, "x", KEYS, NOW).status_code == 400
