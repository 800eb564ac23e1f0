"""An entity's created and updated times: set by the broker, kept across a restart, shown as runtime properties."""

from __future__ import annotations

import json
import sqlite3

import pytest

from oncebus.broker import ManualClock, Namespace
from oncebus.broker.runtime_properties import (
    UNKNOWN_TIME,
    queue_runtime_properties,
    subscription_runtime_properties,
    topic_runtime_properties,
)
from oncebus.core.entities import QueueProperties
from oncebus.core.errors import InvalidArgumentError
from oncebus.core.timeutil import us_to_datetime
from oncebus.store.sqlite import SqliteStore
from tests.broker.conftest import StoreFactory, run


def test_created_and_updated_times_are_kept_and_shown(stores: StoreFactory) -> None:
    clock = ManualClock()
    created = clock.now_us()

    async def go() -> None:
        ns = await Namespace.open(stores.open(), clock)
        await ns.create_queue("q", requires_duplicate_detection=True)
        await ns.create_topic("t")
        await ns.create_subscription("t", "s")
        clock.advance(90)
        await ns.update_queue("q", duplicate_detection_history_time_window="PT1H")
        await ns.update_subscription("t", "s", max_delivery_count=3)
        await ns.close()

        ns = await Namespace.open(stores.open(), clock)  # a restart keeps them
        queue = queue_runtime_properties(ns, "q")
        assert queue.created_at_utc == us_to_datetime(created)
        assert queue.updated_at_utc == us_to_datetime(created + 90_000_000)
        topic = topic_runtime_properties(ns, "t")
        assert topic.created_at_utc == topic.updated_at_utc == us_to_datetime(created)
        subscription = subscription_runtime_properties(ns, "t", "s")
        assert subscription.created_at_utc == us_to_datetime(created)
        assert subscription.updated_at_utc == us_to_datetime(created + 90_000_000)
        assert queue.accessed_at_utc == UNKNOWN_TIME  # not recorded: Azure's value for "never"
        assert ns.get_queue("q") == QueueProperties.create(
            "q", requires_duplicate_detection=True, duplicate_detection_history_time_window="PT1H"
        )  # times are not compared
        await ns.close()

    run(go())


def test_times_cannot_be_set_by_a_caller(stores: StoreFactory) -> None:
    async def go() -> None:
        ns = await Namespace.open(stores.open(), ManualClock())
        with pytest.raises(InvalidArgumentError, match="unknown queue property created_at_us"):
            await ns.create_queue("q", created_at_us=1)
        await ns.create_queue("q")
        with pytest.raises(InvalidArgumentError, match="unknown queue property updated_at_us"):
            await ns.update_queue("q", updated_at_us=1)
        await ns.close()

    run(go())


def test_an_entity_stored_without_times_reads_them_as_unknown(tmp_path: pytest.TempPathFactory) -> None:
    path = tmp_path / "oncebus.db"  # type: ignore[operator]

    async def create() -> None:
        ns = await Namespace.open(SqliteStore(path), ManualClock())
        await ns.create_queue("old")
        await ns.close()

    run(create())
    with sqlite3.connect(path) as db:  # as a release before the times wrote it
        (props,) = db.execute("SELECT properties FROM entity WHERE path = 'old'").fetchone()
        stored = json.loads(props)
        assert "created_at_us" in stored
        for key in ("created_at_us", "updated_at_us"):
            stored.pop(key)
        db.execute("UPDATE entity SET properties = ? WHERE path = 'old'", (json.dumps(stored),))

    async def reopen() -> None:
        ns = await Namespace.open(SqliteStore(path), ManualClock())
        runtime = queue_runtime_properties(ns, "old")
        assert runtime.created_at_utc == runtime.updated_at_utc == UNKNOWN_TIME
        await ns.update_queue("old", max_delivery_count=4)
        updated = queue_runtime_properties(ns, "old")
        assert updated.updated_at_utc != UNKNOWN_TIME
        assert updated.created_at_utc == UNKNOWN_TIME  # not known, and not made up
        await ns.close()

    run(reopen())
