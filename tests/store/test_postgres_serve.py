"""``oncebus serve`` on PostgreSQL, end to end with the real SDK: sends acknowledged with duplicate detection, the
server SIGKILLed (nothing written on the way out), started again: every message is there once, and the dedup
history too (resends are dropped). Also the CLI with no server: ``$ONCEBUS_STORE`` opens the same database."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import psycopg

from tests.postgres_cluster import PostgresCluster
from tests.store.test_files_deleted_under_serve import ONCEBUS, Serve, _drain, _send, cli


def test_serve_on_postgresql_loses_nothing_acknowledged_across_a_sigkill(
    tmp_path: Path, postgres_cluster: PostgresCluster
) -> None:
    url = postgres_cluster.fresh_url()
    env = {"ONCEBUS_STORE": url}
    data = tmp_path / "data"
    server = Serve(data, env)
    try:
        cli(data, "queue", "create", "q", "--duplicate-detection")
        ids = [f"m-{i}" for i in range(30)]
        acked = _send(server.connection_string, ids)
        assert acked == ids
        assert _send(server.connection_string, ["m-0"]) == ["m-0"]  # a resend: acknowledged, dropped
        assert any(f"with its store on {url}" in line for line in server.output), server.output
        server.kill()
        assert (data / "oncebus.db").stat().st_size == 0  # nothing went to the data directory's SQLite file
        with psycopg.connect(url) as db:
            assert db.execute("SELECT count(*) FROM oncebus_message").fetchone() == (30,)
            assert db.execute("SELECT count(*) FROM oncebus_dedup_key").fetchone() == (30,)

        server = Serve(data, env)
        assert _send(server.connection_string, ["m-1", "m-29", "new"]) == ["m-1", "m-29", "new"]
        got = _drain(server.connection_string)
        assert sorted(got) == sorted([*ids, "new"]) and len(got) == len(set(got))  # resends dropped: once each
        stats = json.loads(cli(data, "stats", "q", "--json"))[0]
        assert stats["accepted"] == 31 and stats["duplicates_dropped"] >= 2
        server.stop()
        # no server: a CLI command opens the store itself, the one $ONCEBUS_STORE names
        listed = subprocess.run(
            [*ONCEBUS, "--data-dir", str(data), "queue", "list", "--json"],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert listed.returncode == 0, listed.stderr
        assert [q["name"] for q in json.loads(listed.stdout)] == ["q"]
    finally:
        server.stop()
