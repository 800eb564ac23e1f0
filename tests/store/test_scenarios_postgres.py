"""The shared scenarios (tests/data/scenarios.json) against the broker engine on the PostgreSQL store, via a queue
and a topic, with the restarts they ask for (tests/broker/test_scenarios.py runs them on memory and SQLite)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from oncebus.store.postgres import PostgresStore
from tests.broker.test_scenarios import run_on_broker
from tests.postgres_cluster import PostgresCluster
from tests.scenarios import expected_delivered, load_scenarios, scenario_ids


class _PostgresStores:
    """Opens the same PostgreSQL store again, as a restarted broker would (the one before closed)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._open: list[PostgresStore] = []

    def open(self) -> PostgresStore:
        self.close()
        self._open = [PostgresStore(self.url)]
        return self._open[0]

    def close(self) -> None:
        for store in self._open:
            store.close()
        self._open = []


@pytest.mark.parametrize("kind", ["queue", "topic"])
@pytest.mark.parametrize("scenario", load_scenarios(), ids=scenario_ids())
def test_scenario_on_postgres(scenario: dict[str, Any], kind: str, postgres_cluster: PostgresCluster) -> None:
    stores = _PostgresStores(postgres_cluster.fresh_url())
    try:
        delivered = asyncio.run(run_on_broker(scenario, stores, kind))  # type: ignore[arg-type]
    finally:
        stores.close()
    for path, got in delivered.items():
        assert got == expected_delivered(scenario), path
