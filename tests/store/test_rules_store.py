"""Subscription rules in the store (schema 2): written whole per subscription, deleted with their entity.

Also a file the previous layout (schema 1, before rules were stored) wrote: it
is migrated in place and each of its subscriptions gets the ``$Default`` rule,
which is how every subscription behaved then.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import pytest

from oncebus.broker import ManualClock, Message, Namespace
from oncebus.core.entities import SubscriptionProperties, TopicProperties
from oncebus.core.errors import StoreError
from oncebus.core.rules import CorrelationRuleFilter, RuleProperties, SqlRuleAction, SqlRuleFilter, default_rule
from oncebus.store.base import DeleteEntity, PutEntity, PutRules
from oncebus.store.memory import MemoryStore
from oncebus.store.sqlite import SCHEMA_VERSION, SqliteStore
from tests.store.test_schema import SCHEMA_0, T0

RED = RuleProperties("red", SqlRuleFilter("color = @c", {"@c": "red"}), SqlRuleAction("SET sys.To = 'x'"))
VIP = RuleProperties("vip", CorrelationRuleFilter(label="vip", properties={"tier": 3}))


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path):  # type: ignore[no-untyped-def]
    if request.param == "memory":
        yield MemoryStore()
        return
    opened = SqliteStore(tmp_path / "oncebus.db")
    yield opened
    opened.close()


def test_rules_are_written_whole_and_read_back_in_order(store) -> None:  # type: ignore[no-untyped-def]
    sub = "events/subscriptions/audit"
    store.submit([PutRules(sub, [default_rule().to_dict()])]).result()
    store.submit([PutRules(sub, [VIP.to_dict(), RED.to_dict()])]).result()
    store.submit([PutRules("events/subscriptions/none", [])]).result()
    rules = store.load().rules
    assert [RuleProperties.from_dict(r) for r in rules[sub]] == [VIP, RED]
    assert rules["events/subscriptions/none"] == []  # no rules at all: distinct from "never stored"


def test_rules_go_with_their_subscription_and_topic_only(store) -> None:  # type: ignore[no-untyped-def]
    topic = TopicProperties.create("events")
    ops = [PutEntity("events", "topic", topic.to_dict()), PutEntity("events2", "topic", topic.to_dict())]
    for path in ("events/subscriptions/a", "events/subscriptions/b", "events2/subscriptions/a"):
        ops.append(PutEntity(path, "subscription", SubscriptionProperties.create(path[-1]).to_dict()))
        ops.append(PutRules(path, [RED.to_dict()]))
    store.submit(ops).result()
    store.submit([DeleteEntity("events/subscriptions/a")]).result()
    assert sorted(store.load().rules) == ["events/subscriptions/b", "events2/subscriptions/a"]
    store.submit([DeleteEntity("events")]).result()
    assert sorted(store.load().rules) == ["events2/subscriptions/a"]


# the layout of schema 1, verbatim: schema 0's tables at user_version 1 (rules were not stored)
def _write_schema_1(path: Path) -> None:
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(SCHEMA_0)
    db.execute(
        "INSERT INTO entity VALUES ('events', 'topic', ?)", (json.dumps(TopicProperties.create("events").to_dict()),)
    )
    for name in ("audit", "billing"):
        props = SubscriptionProperties.create(name, max_delivery_count=3)
        db.execute(
            "INSERT INTO entity VALUES (?, 'subscription', ?)",
            (f"events/subscriptions/{name}", json.dumps(props.to_dict())),
        )
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()


def test_a_schema_1_file_is_migrated_and_its_subscriptions_get_the_default_rule(tmp_path: Path) -> None:
    path = tmp_path / "oncebus.db"
    _write_schema_1(path)
    store = SqliteStore(path)
    assert store._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 10
    snapshot = store.load()
    assert sorted(e.path for e in snapshot.entities) == [
        "events",
        "events/subscriptions/audit",
        "events/subscriptions/billing",
    ]
    assert {p: [RuleProperties.from_dict(r) for r in rules] for p, rules in snapshot.rules.items()} == {
        "events/subscriptions/audit": [default_rule()],
        "events/subscriptions/billing": [default_rule()],
    }

    async def through_the_namespace() -> None:
        ns = await Namespace.open(store, ManualClock(T0))
        assert [r.name for r in ns.list_rules("events", "audit")] == ["$Default"]
        await ns.send("events", Message(b"", message_id="m"))  # both subscriptions get it, as before
        assert [len(ns.peek_messages(f"events/Subscriptions/{s}")) for s in ("audit", "billing")] == [1, 1]
        await ns.close()

    asyncio.run(through_the_namespace())
    store.close()
    again = SqliteStore(path)  # reopened: nothing more to do
    assert again._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert len(again.load().rules) == 2
    again.close()


def test_a_failed_migration_from_schema_1_leaves_the_file_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "oncebus.db"
    _write_schema_1(path)

    def failing() -> RuleProperties:
        raise ValueError("simulated failure")

    monkeypatch.setattr("oncebus.store.sqlite_layout.default_rule", failing)
    with pytest.raises(
        StoreError, match=rf"could not migrate .* from store schema 1 to {SCHEMA_VERSION} .*the file is unchanged"
    ):
        SqliteStore(path)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 1
    assert db.execute("SELECT count(*) FROM subscription_rules").fetchone()[0] == 0
    db.close()
