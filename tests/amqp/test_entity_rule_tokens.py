"""Tokens signed with an entity's own shared access rule (oncebus.auth with a namespace's rules attached)."""

from __future__ import annotations

import time

import pytest

from oncebus.auth import KeyRing, SasKey, make_token, verify_token
from oncebus.core.errors import UnauthorizedError

RULES = {
    "events": [("topic-listen", ("p-key", "s-key"), ("Listen",))],
    "orders": [("all", ("o-key", "o2"), ("Manage",))],
}


def _keys() -> KeyRing:
    keys = KeyRing([SasKey("root", "root-key")])

    def lookup(path: str) -> list[tuple[str, tuple[str, str], tuple[str, ...]]]:
        parts = path.split("/")
        for end in range(len(parts), 0, -1):
            if "/".join(parts[:end]) in RULES:
                return RULES["/".join(parts[:end])]
        return []

    keys.attach_entity_rules(lookup)
    return keys


def _token(resource: str, name: str, key: str) -> str:
    return make_token(resource, name, key, int(time.time()) + 600)


def test_a_topic_rule_covers_its_subscriptions_with_its_rights() -> None:
    grant = verify_token(_token("sb://h/events/subscriptions/s1", "topic-listen", "s-key"), _keys())
    assert grant.resource_path == "events/subscriptions/s1" and grant.rights == frozenset({"Listen"})


def test_manage_on_an_entity_rule_brings_send_and_listen() -> None:
    grant = verify_token(_token("sb://h/orders", "all", "o-key"), _keys())
    assert grant.rights == frozenset({"Manage", "Send", "Listen"})


@pytest.mark.parametrize(
    "resource", ["sb://h/", "sb://h/orders", "sb://h/events2", "sb://h/$resources/queues"], ids=str
)
def test_a_rule_is_refused_above_or_beside_its_entity(resource: str) -> None:
    with pytest.raises(UnauthorizedError, match="neither a namespace key nor a rule"):
        verify_token(_token(resource, "topic-listen", "p-key"), _keys())


def test_a_rule_key_that_does_not_sign_is_refused_and_namespace_keys_still_work() -> None:
    with pytest.raises(UnauthorizedError, match="signature does not match"):
        verify_token(_token("sb://h/events", "topic-listen", "root-key"), _keys())
    assert verify_token(_token("sb://h/", "root", "root-key"), _keys()).resource_path == ""
