"""The PostgreSQL store as a user meets it: choosing it, a missing driver, a server it cannot reach, a schema it
cannot use, the durability it asks of the server, and a connection lost while it serves."""

from __future__ import annotations

import asyncio
import builtins
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from oncebus.broker import ManualClock, Message, Namespace
from oncebus.cli import main
from oncebus.core.errors import InvalidArgumentError, StoreError, StoreWriteError
from oncebus.server.settings import Settings
from oncebus.store.base import (
    SETTLEMENT_SYNC_SECONDS,
    AddCounters,
    DeleteMessage,
    Op,
    PutEntity,
    PutMessage,
    PutSessionState,
    UpdateMessage,
)
from oncebus.store.postgres import SCHEMA_VERSION, PostgresStore, display_url
from oncebus.store.postgres_url import open_store, store_spec
from oncebus.store.sqlite import SqliteStore
from tests.broker.test_session_state_quota import size_is_kept_across_a_restart
from tests.postgres_cluster import PostgresCluster
from tests.store.test_contract import _message


def test_the_store_is_a_postgresql_url_or_sqlite() -> None:
    """``--store``, else ``ONCEBUS_STORE`` (read by ``oncebus.server.settings``; the CLI names where it came from)."""
    assert store_spec(None) is None
    assert store_spec("sqlite") is None
    assert store_spec("postgresql://h/db") == "postgresql://h/db"
    assert store_spec(Settings.from_environ({"ONCEBUS_STORE": "postgres://h/db"}).store) == "postgres://h/db"
    with pytest.raises(InvalidArgumentError, match=r"--store 'mysql://h/db': give a PostgreSQL URL"):
        store_spec("mysql://h/db")
    given = Settings.from_environ({"ONCEBUS_STORE": "/data/oncebus.db"}).store
    with pytest.raises(InvalidArgumentError, match=r"ONCEBUS_STORE '/data/oncebus.db': give a PostgreSQL URL"):
        store_spec(given, option="ONCEBUS_STORE")


def test_serve_with_a_store_that_is_not_a_url_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ONCEBUS_STORE", raising=False)
    code = main(["--data-dir", str(tmp_path), "serve", "--port", "0", "--store", "oncebus.db"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "--store 'oncebus.db': give a PostgreSQL URL" in err


def test_a_missing_driver_gives_one_line_naming_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in sys.modules if n == "psycopg" or n.startswith(("psycopg.", "oncebus.store.postgres"))]:
        monkeypatch.delitem(sys.modules, name)
    real_import = builtins.__import__

    def no_psycopg(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "psycopg" or name.startswith("psycopg."):
            raise ModuleNotFoundError("No module named 'psycopg'", name="psycopg")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_psycopg)
    with pytest.raises(StoreError) as refused:
        open_store("postgresql://127.0.0.1:1/db", tmp_path / "oncebus.db")
    assert "pip install 'oncebus[postgresql]'" in str(refused.value) and "\n" not in str(refused.value)
    store = open_store(None, tmp_path / "oncebus.db")  # the embedded default needs no driver
    assert isinstance(store, SqliteStore)
    store.close()


def test_a_server_it_cannot_reach_gives_one_line_without_the_password(tmp_path: Path) -> None:
    with pytest.raises(StoreError) as refused:
        PostgresStore("postgresql://me:s3cret@127.0.0.1:1/db?connect_timeout=2")
    message = str(refused.value)
    assert message.startswith("cannot connect to PostgreSQL at postgresql://me:***@127.0.0.1:1/db")
    assert "s3cret" not in message and "\n" not in message
    assert display_url("postgresql://u@h/db") == "postgresql://u@h/db"
    assert display_url("postgresql://h/db?user=u&password=pw&sslmode=require") == (
        "postgresql://h/db?user=u&password=***&sslmode=require"
    )


def test_serve_on_an_unreachable_server_exits_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--data-dir", str(tmp_path), "serve", "--port", "0", "--store", "postgresql://u:pw@127.0.0.1:1/x"])
    err = capsys.readouterr().err
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "cannot connect to PostgreSQL at postgresql://u:***@127.0.0.1:1/x" in lines[0], err
    assert main(["--data-dir", str(tmp_path), "queue", "list"]) == 0  # the data directory's lock was let go


def test_a_schema_that_does_not_exist_or_holds_other_tables_is_refused(postgres_cluster: PostgresCluster) -> None:
    with pytest.raises(StoreError, match=r"no schema to create oncebus's tables in .*create the schema"):
        PostgresStore(postgres_cluster.url(schema="nowhere"))
    url = postgres_cluster.fresh_url()
    with psycopg.connect(url, autocommit=True) as db:
        db.execute("CREATE TABLE oncebus_message (id int)")
    with pytest.raises(StoreError, match=r"holds tables named like oncebus's \(oncebus_message\).*not written by"):
        PostgresStore(url)


def test_commits_are_durable_even_where_the_server_says_otherwise(postgres_cluster: PostgresCluster) -> None:
    url = postgres_cluster.fresh_url() + "%20-csynchronous_commit%3Doff"  # the session's default: off
    store = PostgresStore(url)
    try:
        assert store._db is not None
        assert store._db.execute("SHOW synchronous_commit").fetchone() == ("on",)
        store.submit([PutEntity("q", "queue", {}), PutMessage(_message(1))]).result()
        assert (store.relaxed_commits, store.syncs) == (0, 0)
        store.submit([DeleteMessage("q", 1), AddCounters("q", 2, {"completed": 1})], durable=False).result()
        assert store.relaxed_commits == 1  # committed without waiting for its flush...
        deadline = time.monotonic() + 5
        while store.syncs == 0 and time.monotonic() < deadline:
            time.sleep(SETTLEMENT_SYNC_SECONDS / 4)
        assert store.syncs == 1  # ...which the writer asks for itself, soon after
    finally:
        store.close()


def _terminate_oncebus_sessions(cluster: PostgresCluster) -> int:
    with psycopg.connect(cluster.url(), autocommit=True) as db:
        rows = db.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = 'oncebus' AND pid <> pg_backend_pid()"
        ).fetchall()
    return len(rows)


def test_a_lost_connection_refuses_one_send_then_the_store_reconnects(postgres_cluster: PostgresCluster) -> None:
    async def go() -> None:
        store = PostgresStore(postgres_cluster.fresh_url())
        try:
            ns = await Namespace.open(store, ManualClock())
            await ns.create_queue("q", requires_duplicate_detection=True)
            await ns.send("q", Message(b"before", message_id="a"))
            assert _terminate_oncebus_sessions(postgres_cluster) >= 1  # the server dropped oncebus's sessions
            with pytest.raises(StoreWriteError, match=r"the connection to PostgreSQL failed.*reconnects"):
                await ns.send("q", Message(b"lost", message_id="b"))
            for _ in range(200):  # the namespace reloads what the store holds, then accepts work again
                try:
                    assert not (await ns.send("q", Message(b"after", message_id="c")))[0].duplicate
                    break
                except StoreWriteError:
                    await asyncio.sleep(0.02)
            else:
                raise AssertionError("the store did not recover")
            assert store.reconnects >= 1
            assert (await ns.send("q", Message(b"again", message_id="a")))[0].duplicate
            got = await ns.receive("q", 10)
            assert [m.body for m in got] == [b"before", b"after"]  # "b" was refused: stored or not, never lost
            await ns.close()
        finally:
            store.close()

    asyncio.run(go())


def test_a_second_node_on_the_same_schema_is_refused_until_the_first_stops(postgres_cluster: PostgresCluster) -> None:
    url = postgres_cluster.fresh_url()
    first = PostgresStore(url)
    try:
        started = time.monotonic()
        with pytest.raises(StoreError) as refused:
            PostgresStore(url)
        assert time.monotonic() - started < 10
        message = str(refused.value)
        assert message.startswith(f"another oncebus serves {url} (server process ") and "\n" not in message
        assert "one oncebus process per database schema" in message
        PostgresStore(postgres_cluster.fresh_url()).close()  # another schema of the same database: its own node
    finally:
        first.close()
    PostgresStore(url).close()  # the first let go with its session


def test_an_older_schema_is_migrated_in_one_transaction_or_left_as_it_was(
    postgres_cluster: PostgresCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The migration steps of a later release (here a made-up version 2) run at start, all or nothing."""
    from oncebus.store import postgres, postgres_layout

    url = postgres_cluster.fresh_url()
    store = PostgresStore(url)
    store.submit([PutEntity("q", "queue", {}), PutMessage(_message(1))]).result()
    store.close()
    new = postgres_layout.SCHEMA_VERSION + 1
    monkeypatch.setattr(postgres, "SCHEMA_VERSION", new)
    broken = ("ALTER TABLE oncebus_entity ADD COLUMN note text", "ALTER TABLE no_such_table ADD COLUMN x int")
    monkeypatch.setattr(postgres_layout, "MIGRATIONS", {new - 1: broken})
    with pytest.raises(StoreError) as refused:
        PostgresStore(url)
    message = str(refused.value)
    assert f"could not migrate {url}" in message and f"from store schema {new - 1} to {new}" in message
    assert "no_such_table" in message and "the database is unchanged" in message and "\n" not in message
    with psycopg.connect(url) as db:
        assert db.execute("SELECT version FROM oncebus_schema").fetchone() == (new - 1,)
        columns = db.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'oncebus_entity'"
            " AND table_schema = current_schema()"
        )
        assert "note" not in {c for (c,) in columns}  # the first step was rolled back with the second
    monkeypatch.setattr(postgres_layout, "MIGRATIONS", {new - 1: broken[:1]})
    store = PostgresStore(url)
    try:
        assert [e.path for e in store.load().entities] == ["q"]
        assert store.read_messages("q", [1])[1].body == b"x1"
    finally:
        store.close()
    with psycopg.connect(url) as db:
        assert db.execute("SELECT version FROM oncebus_schema").fetchone() == (new,)


def _written_as(url: str, version: int, ops: list[Op], *undo: str) -> None:
    """``ops`` stored, then the database taken back to how store schema ``version`` left it (``undo``: the
    statements that remove what later versions added)."""
    store = PostgresStore(url)
    store.submit(ops).result()
    store.close()
    with psycopg.connect(url, autocommit=True) as db:
        for statement in undo:
            db.execute(statement)
        db.execute("UPDATE oncebus_schema SET version = %s", (version,))


def test_a_version_1_database_gets_session_state_times_and_its_states_count_as_set_at_the_start(
    postgres_cluster: PostgresCluster,
) -> None:
    """Version 2 stores when a session state was set; a version 1 database's states have no time (None)."""
    url = postgres_cluster.fresh_url()
    _written_as(
        url,
        1,
        [PutEntity("q", "queue", {}), PutSessionState("q", "s1", b"old", 123)],
        "ALTER TABLE oncebus_session_state DROP COLUMN updated_us",
        "DROP TABLE oncebus_node",
    )
    store = PostgresStore(url)
    try:
        assert [(s.session_id, s.state, s.updated_us) for s in store.load().session_states] == [("s1", b"old", None)]
        store.submit([PutSessionState("q", "s2", b"new", 456)]).result()
        assert sorted((s.session_id, s.updated_us) for s in store.load().session_states) == [
            ("s1", None),
            ("s2", 456),
        ]
    finally:
        store.close()
    with psycopg.connect(url) as db:
        assert db.execute("SELECT version FROM oncebus_schema").fetchone() == (SCHEMA_VERSION,)


def test_a_version_2_database_gets_the_cluster_table_and_keeps_its_messages(
    postgres_cluster: PostgresCluster,
) -> None:
    """Version 3 adds ``oncebus_node`` (where a cluster's leader serves); a version 2 database (as the previous
    release wrote it: no such table) is migrated in place and keeps what it held."""
    url = postgres_cluster.fresh_url()
    kept = [PutEntity("q", "queue", {}), PutSessionState("q", "s1", b"kept", 7)]
    _written_as(url, 2, kept, "DROP TABLE oncebus_node")
    store = PostgresStore(url)
    try:
        snapshot = store.load()
        assert [e.path for e in snapshot.entities] == ["q"]
        assert [(s.session_id, s.state, s.updated_us) for s in snapshot.session_states] == [("s1", b"kept", 7)]
        store.announce("n1", {"host": "127.0.0.1", "amqp": 1})  # the new table takes the leader's address
    finally:
        store.close()
    with psycopg.connect(url) as db:
        assert db.execute("SELECT version FROM oncebus_schema").fetchone() == (SCHEMA_VERSION,)
        assert db.execute("SELECT node FROM oncebus_node").fetchall() == [("n1",)]


def test_a_version_3_database_is_migrated_and_reads_its_messages_as_written_and_new_records_from_the_wire(
    postgres_cluster: PostgresCluster,
) -> None:
    """Version 4, the message record: a message the AMQP codec decoded keeps its application properties in its wire
    bytes only; a version 3 row (its properties written again in ``meta``) reads as it was."""
    import dataclasses

    from tests.store.test_record import PROPERTIES, _record

    url = postgres_cluster.fresh_url()
    old = dataclasses.replace(_record(1), sections=None)  # written as version 3 wrote it: properties in meta
    _written_as(url, 3, [PutEntity("q", "queue", {}), PutMessage(old)])
    store = PostgresStore(url)
    try:
        store.load()
        store.submit([PutMessage(_record(2)), PutMessage(_record(3))]).result()
        store.submit([UpdateMessage("q", 3, 0, 1, {"kind": "retried"})]).result()
        read = store.read_messages("q", [1, 2, 3])
        assert [read[n].application_properties for n in (1, 2)] == [dict(PROPERTIES, n=n) for n in (1, 2)]
        assert read[3].application_properties == {**PROPERTIES, "n": 3, "kind": "retried"}
        assert [read[n].body for n in (1, 2, 3)] == [b"body 1", b"body 2", b"body 3"]
    finally:
        store.close()
    with psycopg.connect(url) as db:
        assert db.execute("SELECT version FROM oncebus_schema").fetchone() == (SCHEMA_VERSION,)
        metas = dict(db.execute("SELECT sequence_number, meta FROM oncebus_message").fetchall())
        assert '"application_properties"' in metas[1] and '"application_properties"' not in metas[2]


def test_after_a_cut_connection_the_node_takes_its_lock_back_from_its_own_old_session(
    postgres_cluster: PostgresCluster,
) -> None:
    """A cut network: this side's connection is dead, but the server has not noticed (no FIN came), so the old
    session still holds the node lock. The node ends its own old session rather than wait for TCP to give up."""
    import os
    import socket

    store = PostgresStore(postgres_cluster.fresh_url())
    kept = None
    try:
        store.submit([PutEntity("q", "queue", {}), PutMessage(_message(1))]).result()
        assert store._db is not None
        old_backend = store._db.info.backend_pid
        fd = store._db.pgconn.socket
        kept = os.dup(fd)  # the socket stays open (the server sees nothing)...
        dead, peer = socket.socketpair()
        peer.close()
        os.dup2(dead.fileno(), fd)  # ...but the connection now writes into a socket nobody reads
        dead.close()
        with pytest.raises(StoreWriteError, match="the connection to PostgreSQL failed"):
            store.submit([PutMessage(_message(2))]).result()
        store.submit([PutMessage(_message(3))]).result()  # reconnected, and the lock taken back
        assert store.reconnects == 1
        with psycopg.connect(postgres_cluster.url(), autocommit=True) as db:
            alive = db.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (old_backend,)).fetchone()
        assert alive == (0,)
        assert sorted(store.read_messages("q", [1, 2, 3])) == [1, 3]
    finally:
        store.close()
        if kept is not None:
            os.close(kept)


def test_a_damaged_dedup_image_is_rebuilt_from_the_key_rows(postgres_cluster: PostgresCluster) -> None:
    url = postgres_cluster.fresh_url()

    async def go() -> None:
        clock = ManualClock()
        store = PostgresStore(url)
        ns = await Namespace.open(store, clock)
        await ns.create_queue("q", requires_duplicate_detection=True)
        for i in range(20):
            await ns.send("q", Message(b"x", message_id=f"k-{i}"))
        clock.advance(1)
        await ns.close()
        store.close()
        with psycopg.connect(url) as db:
            assert db.execute("UPDATE oncebus_dedup_image SET crc = crc + 1").rowcount == 1
        store = PostgresStore(url)
        try:
            ns = await Namespace.open(store, clock)
            assert store.keys_read == 20  # the image failed its check: every key read from the rows
            assert (await ns.send("q", Message(b"x", message_id="k-3")))[0].duplicate
            await ns.close()
        finally:
            store.close()

    asyncio.run(go())


def test_session_states_count_toward_the_size_across_a_restart(postgres_cluster: PostgresCluster) -> None:
    """Issue 33, item 4, on PostgreSQL: the size a queue's session states take is the same after a restart."""
    url = postgres_cluster.fresh_url()
    opened: list[PostgresStore] = []

    def open_again() -> PostgresStore:
        for store in opened:
            store.close()
        opened[:] = [PostgresStore(url)]
        return opened[0]

    try:
        asyncio.run(size_is_kept_across_a_restart(open_again))
    finally:
        for store in opened:
            store.close()


def test_without_the_postgresql_binaries_the_tests_fail_saying_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tests.postgres_cluster as cluster_module

    monkeypatch.setenv("PATH", str(tmp_path))  # no initdb on PATH
    monkeypatch.setattr(cluster_module, "DEBIAN_BINARIES", tmp_path / "none")
    with pytest.raises(pytest.fail.Exception, match=r"initdb, pg_ctl and postgres were not found.*apt-get install"):
        cluster_module.find_binaries()  # a failure, never a skip


def test_reading_messages_after_the_session_was_ended_reconnects(postgres_cluster: PostgresCluster) -> None:
    store = PostgresStore(postgres_cluster.fresh_url())
    try:
        store.submit([PutEntity("q", "queue", {}), PutMessage(_message(1))]).result()
        assert store.read_messages("q", [1])[1].body == b"x1"
        assert _terminate_oncebus_sessions(postgres_cluster) >= 2  # the reader's and the writer's
        assert store.read_messages("q", [1])[1].body == b"x1"  # opened again, once, on the caller's thread
    finally:
        store.close()


def test_a_version_4_database_reads_its_text_fields_from_meta_and_new_records_from_the_wire(
    postgres_cluster: PostgresCluster,
) -> None:
    """Version 5: a message the AMQP codec decoded keeps its text fields (subject, content type, correlation id...)
    in its wire bytes only; a version 4 row (its text fields written again in ``meta``) reads as it was."""
    import dataclasses

    from tests.store.test_record import PROPERTIES, _record

    url = postgres_cluster.fresh_url()
    first = _record(1)
    assert first.sections is not None
    old = dataclasses.replace(first, sections=dataclasses.replace(first.sections, properties=None))  # as version 4
    _written_as(url, 4, [PutEntity("q", "queue", {}), PutMessage(old)])
    store = PostgresStore(url)
    try:
        store.load()
        store.submit([PutMessage(_record(2))]).result()
        store.submit([UpdateMessage("q", 1, 0, 1, {"kind": "retried"})]).result()
        read = store.read_messages("q", [1, 2])
        for n in (1, 2):
            assert (read[n].subject, read[n].content_type, read[n].correlation_id) == (
                "orders",
                "application/json",
                f"c-{n}",
            )
        assert read[1].application_properties == {**PROPERTIES, "n": 1, "kind": "retried"}
        assert read[2].application_properties == dict(PROPERTIES, n=2)
    finally:
        store.close()
    with psycopg.connect(url) as db:
        assert db.execute("SELECT version FROM oncebus_schema").fetchone() == (SCHEMA_VERSION,) == (5,)
        metas = dict(db.execute("SELECT sequence_number, meta FROM oncebus_message").fetchall())
        assert '"subject"' in metas[1] and '"subject"' not in metas[2] and '"pr"' in metas[2]
