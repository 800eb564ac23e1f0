"""Fixtures of the store tests: a throwaway PostgreSQL cluster (tests/postgres_cluster.py) for the session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.postgres_cluster import PostgresCluster


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[PostgresCluster]:
    cluster = PostgresCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.remove()


@pytest.fixture
def postgres_url(postgres_cluster: PostgresCluster) -> str:
    """A PostgreSQL URL of a schema of this test's own (empty)."""
    return postgres_cluster.fresh_url()
