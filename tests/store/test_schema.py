"""Store schema versions: files the previous layouts wrote (schema 0, before versions; schema 2, one message table
with the content) are migrated in place."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import pytest

from oncebus.broker import ManualClock, Message, Namespace
from oncebus.core import keys
from oncebus.core.entities import QueueProperties
from oncebus.core.errors import StoreError
from oncebus.core.timeutil import us_to_datetime
from oncebus.store import sqlite as sqlite_store
from oncebus.store.sqlite import SCHEMA_VERSION, SqliteStore

# the layout of schema 0, verbatim from the release before store versions
SCHEMA_0 = """
CREATE TABLE IF NOT EXISTS entity (path TEXT PRIMARY KEY, kind TEXT NOT NULL, properties TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS message (
    path TEXT NOT NULL, sequence_number INTEGER NOT NULL, state INTEGER NOT NULL, delivery_count INTEGER NOT NULL,
    enqueued_time_us INTEGER NOT NULL, expires_at_us INTEGER, body BLOB NOT NULL, wire BLOB, meta TEXT NOT NULL,
    PRIMARY KEY (path, sequence_number)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS dedup_key (
    entity TEXT NOT NULL, first_accepted_us INTEGER NOT NULL, key TEXT NOT NULL,
    PRIMARY KEY (entity, first_accepted_us, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS session_state (
    path TEXT NOT NULL, session_id TEXT NOT NULL, state BLOB NOT NULL, PRIMARY KEY (path, session_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS counters (
    entity TEXT PRIMARY KEY, next_sequence_number INTEGER NOT NULL, counters TEXT NOT NULL
);
"""
T0 = 1_700_000_000_000_000


def _write_schema_0(path: Path) -> None:
    """A data file as the previous release left it: two queues, keys (two of string ids led by NUL), a message."""
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(SCHEMA_0)
    for name, partitioned in (("plain", False), ("parts", True)):
        props = QueueProperties.create(name, requires_duplicate_detection=True, enable_partitioning=partitioned)
        db.execute("INSERT INTO entity VALUES (?, 'queue', ?)", (name, json.dumps(props.to_dict())))
    rows = [
        ("plain", T0, "order-1"),
        ("plain", T0 + 1, "\x00odd"),
        ("parts", T0 + 2, "2:pkorder-1"),
        ("parts", T0 + 3, "4:\x00odd\x00odd"),  # partitioned by its own NUL-led id
        ("parts", T0 + 4, "2:pk\x00odd"),
    ]
    db.executemany("INSERT INTO dedup_key (entity, first_accepted_us, key) VALUES (?, ?, ?)", rows)
    db.execute(
        "INSERT INTO message VALUES ('plain', 1, 0, 0, ?, NULL, x'6869', NULL, ?)",
        (T0, json.dumps({"message_id": "order-1"})),
    )
    db.execute("INSERT INTO counters VALUES ('plain', 3, ?)", (json.dumps({"accepted": 2, "duplicates": 1}),))
    db.commit()
    db.close()


def test_a_schema_0_file_is_migrated_and_keeps_every_key_and_message(tmp_path: Path) -> None:
    path = tmp_path / "oncebus.db"
    _write_schema_0(path)
    store = SqliteStore(path)
    assert store._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 10
    stored = {(k.entity, k.key) for k in store.load().dedup_keys}
    assert stored == {
        ("plain", "order-1"),
        ("plain", keys.dedup_key("\x00odd").text),
        ("parts", "2:pkorder-1"),
        ("parts", keys.dedup_key("\x00odd", partitioned=True).text),
        ("parts", keys.dedup_key("\x00odd", "pk", partitioned=True).text),
    }

    async def go() -> None:
        ns = await Namespace.open(store, ManualClock(T0 + 10))
        resent = await ns.send("plain", [Message(b"", message_id="order-1"), Message(b"", message_id="\x00odd")])
        assert [o.duplicate for o in resent] == [True, True]
        resent = await ns.send(
            "parts",
            [
                Message(b"", message_id="order-1", partition_key="pk"),
                Message(b"", message_id="\x00odd"),
                Message(b"", message_id="\x00odd", partition_key="pk"),
                Message(b"", message_id="\x00sodd"),  # new: the escape does not make it a duplicate
            ],
        )
        assert [o.duplicate for o in resent] == [True, True, True, False]
        assert [m.message_id for m in ns.peek_messages("plain")] == ["order-1"]
        stats = ns.stats("plain")
        assert (stats.accepted, stats.duplicates_dropped, stats.next_sequence_number) == (2, 1 + 2, 3)
        await ns.close()

    asyncio.run(go())
    store.close()
    assert SqliteStore(path)._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION  # reopened


def test_a_failed_migration_leaves_the_file_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "oncebus.db"
    _write_schema_0(path)
    seen: list[str] = []

    def failing(text: str, *, partitioned: bool) -> str:
        seen.append(text)
        if len(seen) == 2:
            raise ValueError("simulated failure half way")
        return keys.migrate_key_text_v0(text, partitioned=partitioned)

    monkeypatch.setattr("oncebus.store.sqlite_layout.migrate_key_text_v0", failing)
    with pytest.raises(
        StoreError, match=rf"could not migrate .* from store schema 0 to {SCHEMA_VERSION} .*the file is unchanged"
    ):
        SqliteStore(path)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 0
    assert sorted(k for (k,) in db.execute("SELECT key FROM dedup_key")) == sorted(
        ["order-1", "\x00odd", "2:pkorder-1", "4:\x00odd\x00odd", "2:pk\x00odd"]
    )


def test_a_file_from_a_newer_release_is_refused_naming_both_versions(tmp_path: Path) -> None:
    path = tmp_path / "oncebus.db"
    SqliteStore(path).close()
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 11")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match=r"newer oncebus \(store schema 11; this version reads up to 10\)"):
        SqliteStore(path)


def test_a_new_file_starts_at_the_current_schema(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "oncebus.db")
    assert store._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    store.close()


def test_a_new_file_has_4_kib_pages_and_a_file_of_16_kib_pages_keeps_them_and_its_messages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stores are created with SQLite's 4 KiB pages (``PAGE_SIZE``, kept on measurement); a file with other pages
    (16 KiB, as a build of session 21 created them for a while) is read and written as it is: its page size cannot
    change in place."""
    new = SqliteStore(tmp_path / "new.db")
    assert new._db.execute("PRAGMA page_size").fetchone()[0] == sqlite_store.PAGE_SIZE == 4096
    new.close()
    old_path = tmp_path / "old.db"
    monkeypatch.setattr(sqlite_store, "PAGE_SIZE", 16384)  # as that build created its files

    async def fill() -> None:
        ns = await Namespace.open(SqliteStore(old_path), ManualClock(T0))
        await ns.create_queue("q", requires_duplicate_detection=True)
        await ns.send("q", [Message(b"x" * 3000, message_id=f"m{i}") for i in range(50)])
        await ns.close()

    asyncio.run(fill())
    monkeypatch.undo()

    async def reopen() -> None:
        store = SqliteStore(old_path)
        assert store._db.execute("PRAGMA page_size").fetchone()[0] == 16384
        ns = await Namespace.open(store, ManualClock(T0 + 10))
        assert [
            o.duplicate for o in await ns.send("q", [Message(b"y", message_id="m0"), Message(b"y", message_id="n")])
        ] == [True, False]
        got = await ns.receive("q", 100)
        assert [m.message_id for m in got] == [f"m{i}" for i in range(50)] + ["n"]
        assert all(m.body == b"x" * 3000 for m in got[:50])
        for m in got:
            await ns.complete("q", m.lock_token)  # type: ignore[arg-type]
        await ns.close()
        again = SqliteStore(old_path)
        assert again._db.execute("PRAGMA page_size").fetchone()[0] == 16384 and not list(again.load().messages)
        again.close()

    asyncio.run(reopen())


def _write_schema_2(path: Path) -> list[tuple[object, ...]]:
    """A data file as schema 2 left it: one ``message`` table holding each message's body, wire encoding and JSON."""
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(SCHEMA_0 + "CREATE TABLE subscription_rules (path TEXT PRIMARY KEY, rules TEXT NOT NULL);")
    props = QueueProperties.create("q", requires_duplicate_detection=True, requires_session=False)
    db.execute("INSERT INTO entity VALUES ('q', 'queue', ?)", (json.dumps(props.to_dict()),))
    wire = b"\x00Sp\xc0\x01\x00" + b"\x00Su\xa0\x05hello"  # a header and a data section holding the body
    rows = [
        # path, seq, state, delivery count, enqueued, expires, body, wire, meta
        ("q", 1, 0, 0, T0, None, b"hello", wire, json.dumps({"message_id": "m1", "subject": "s"})),
        (
            "q",
            2,
            1,
            2,
            T0 + 1,
            T0 + 10**9,
            b"later",
            None,
            json.dumps(
                {
                    "message_id": "abcd",
                    "message_id_type": "binary",
                    "session_id": "s1",
                    "application_properties": {"k": 1},
                    "time_to_live_us": 10**9,
                }
            ),
        ),
        (
            "q/$deadletterqueue",
            3,
            3,
            5,
            T0 + 2,
            None,
            b"dead",
            None,
            json.dumps({"message_id": "m3", "dead_letter_reason": "why", "dead_letter_error_description": "because"}),
        ),
    ]
    db.executemany("INSERT INTO message VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    db.execute("INSERT INTO dedup_key VALUES ('q', ?, 'm1')", (T0,))
    db.execute("INSERT INTO counters VALUES ('q', 4, ?)", (json.dumps({"accepted": 3}),))
    db.execute("PRAGMA user_version = 2")
    db.commit()
    db.close()
    return rows


def test_a_schema_2_file_is_migrated_and_every_message_reads_back_the_same(tmp_path: Path) -> None:
    path = tmp_path / "oncebus.db"
    _write_schema_2(path)
    store = SqliteStore(path)
    assert store._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    tables = {name for (name,) in store._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"message", "content"} <= tables and not {"message_v1", "message_v5", "message_data"} & tables
    # the body inside the wire encoding is kept once: the content row is the wire, the body a slice of it
    assert store._db.execute(
        "SELECT m.wire_length, m.body_offset, m.body_length, length(c.data) FROM message AS m"
        " JOIN content AS c ON c.id = m.content_id WHERE m.path = 'q' AND m.sequence_number = 1"
    ).fetchone() == (
        len(b"\x00Sp\xc0\x01\x00\x00Su\xa0\x05") + 5,
        len(b"\x00Sp\xc0\x01\x00\x00Su\xa0\x05"),
        5,
        len(b"\x00Sp\xc0\x01\x00\x00Su\xa0\x05") + 5,
    )
    rows = sorted(store.load().messages)
    assert [(r[0], r[1], r[2], r[3], r[7]) for r in rows] == [
        ("q", 1, 0, 0, None),
        ("q", 2, 1, 2, "s1"),
        ("q/$deadletterqueue", 3, 3, 5, None),
    ]

    async def go() -> None:
        ns = await Namespace.open(store, ManualClock(T0 + 100))
        peeked = {m.sequence_number: m for m in ns.peek_messages("q", 10)}
        assert peeked[1].body == b"hello" and peeked[1].subject == "s" and peeked[1].message_id == "m1"
        assert peeked[2].body == b"later" and peeked[2].message_id == bytes.fromhex("abcd")
        assert peeked[2].session_id == "s1" and peeked[2].application_properties == {"k": 1}
        assert peeked[2].delivery_count == 3  # stored 2 (the row above): a peek shows what its next receive will
        deferred = await ns.receive_deferred_messages("q", [2])
        assert deferred[0].body == b"later"
        (dead,) = await ns.receive("q/$DeadLetterQueue", 10)
        assert (dead.body, dead.dead_letter_reason, dead.dead_letter_error_description) == (b"dead", "why", "because")
        await ns.complete("q/$DeadLetterQueue", dead.lock_token)
        assert (await ns.send("q", Message(b"", message_id="m1")))[0].duplicate
        await ns.close()

    asyncio.run(go())
    store.close()
    reopened = SqliteStore(path)
    assert reopened._db.execute("SELECT count(*) FROM content").fetchone()[0] == 2  # the completed one's went
    reopened.close()


def test_a_failed_schema_2_migration_leaves_the_file_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "oncebus.db"
    rows = _write_schema_2(path)

    def failing(message: object, data_id: int) -> object:
        raise OSError("simulated failure half way")

    monkeypatch.setattr("oncebus.store.sqlite_layout.message_rows", failing)
    with pytest.raises(
        StoreError, match=rf"could not migrate .* from store schema 2 to {SCHEMA_VERSION} .*the file is unchanged"
    ):
        SqliteStore(path)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 2
    assert db.execute("SELECT * FROM message ORDER BY sequence_number").fetchall() == [tuple(r) for r in rows]
    assert db.execute("SELECT name FROM sqlite_master WHERE name = 'message_data'").fetchone() is None


# written by oncebus at store schema 5 (tests/store/fixtures/make_schema5.py, run on that release): a queue with
# duplicate detection (a message with properties, one without a wire encoding and with a session, a deferred one
# whose body is not inside its wire, one dead-lettered with an empty body) and a topic's two subscription copies
FIXTURE_5 = Path(__file__).parent / "fixtures" / "schema5.db"
_WIRE_T1 = b"\x00\x53\x73\xc0\x06\x01\xa1\x03t-1" + b"\x00\x53\x75\xb0" + (10).to_bytes(4, "big") + b"topic body"


def test_a_schema_5_file_is_migrated_and_keeps_every_message_its_content_keys_and_state(tmp_path: Path) -> None:
    path = tmp_path / "oncebus.db"
    path.write_bytes(FIXTURE_5.read_bytes())
    store = SqliteStore(path)
    assert store._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 10
    tables = {name for (name,) in store._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"message", "content"} <= tables and not {"message_v5", "message_data"} & tables
    snapshot = store.load()
    rows = sorted((r[0], r[1], r[2], r[7]) for r in snapshot.messages)
    assert rows == [
        ("q", 1, 0, None),
        ("q", 2, 0, "s1"),
        ("q", 3, 1, None),
        ("q/$deadletterqueue", 4, 3, None),
        ("t/subscriptions/a", 1, 0, None),
        ("t/subscriptions/b", 1, 0, None),
    ]
    assert sorted(store._db.execute("SELECT entity, key, first_accepted_us FROM dedup_key")) == [
        ("q", f"m-{i}", T0 + i - 1) for i in range(1, 5)
    ]
    # the two subscription copies were one content row each in schema 5: now rows of their own, refs 1
    assert store._db.execute("SELECT count(*), sum(refs) FROM content").fetchone() == (6, 6)
    q = store.read_messages("q", [1, 2, 3])
    assert (q[1].body, q[1].application_properties, q[1].wire is not None) == (b"hello \x00 body", {"k": 1}, True)
    assert q[1].wire is not None and q[1].wire.endswith(q[1].body)
    assert (q[2].body, q[2].wire, q[2].session_id, q[2].expires_at_us) == (b"no wire", None, "s1", T0 + 10**9)
    assert (q[3].body, q[3].state, q[3].delivery_count) == (b"not in wire", 1, 1)
    assert q[3].wire == b"\x00\x53\x73\xc0\x06\x01\xa1\x03m-3" + b"\x00\x53\x75\xb0" + (5).to_bytes(4, "big") + b"other"
    (dead,) = store.read_messages("q/$deadletterqueue", [4]).values()
    assert (dead.body, dead.dead_letter_reason, dead.dead_letter_error_description) == (b"", "why", "desc")
    for sub in "ab":
        (copy,) = store.read_messages(f"t/subscriptions/{sub}", [1]).values()
        assert (copy.body, copy.wire) == (b"topic body", _WIRE_T1)
    store.close()

    async def go() -> None:  # the broker serves it: a duplicate is judged from the migrated keys, content settles
        reopened = SqliteStore(path)
        ns = await Namespace.open(reopened, ManualClock(T0 + 10))
        assert (await ns.send("q", Message(b"again", message_id="m-1")))[0].duplicate
        got = await ns.receive("q", 10)
        assert sorted(m.body for m in got) == [b"hello \x00 body", b"no wire"]
        for m in got:
            await ns.complete("q", m.lock_token)
        await ns.close()
        left = reopened._db.execute("SELECT count(*) FROM content").fetchone()[0]
        assert left == 6 - len(got)  # each completed message's content went with it
        reopened.close()

    asyncio.run(go())


def test_a_failed_schema_5_migration_leaves_the_file_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from oncebus.store import sqlite_layout

    path = tmp_path / "oncebus.db"
    path.write_bytes(FIXTURE_5.read_bytes())
    real = sqlite_layout._content_v5_to_v6

    def failing(db: sqlite3.Connection) -> None:
        real(db)  # all of it done, then the failure: the transaction is rolled back
        raise OSError("simulated failure at the end")

    monkeypatch.setattr(sqlite_layout, "_content_v5_to_v6", failing)
    with pytest.raises(
        StoreError, match=rf"could not migrate .* from store schema 5 to {SCHEMA_VERSION} .*the file is unchanged"
    ):
        SqliteStore(path)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 5
    assert db.execute("SELECT count(*) FROM message_data").fetchone()[0] == 6
    assert db.execute("SELECT name FROM sqlite_master WHERE name = 'content'").fetchone() is None
    db.close()
    monkeypatch.setattr(sqlite_layout, "_content_v5_to_v6", real)
    store = SqliteStore(path)  # and it migrates next time
    assert store.read_messages("q", [1])[1].body == b"hello \x00 body"
    store.close()


# written by oncebus at store schema 6 (tests/store/fixtures/make_schema6.py, run on that release): a session queue
# "sq" with a message in session "s1" and the session's state, stored without the time it was set
FIXTURE_6 = Path(__file__).parent / "fixtures" / "schema6.db"


def test_a_schema_6_file_is_migrated_and_its_session_state_counts_as_set_at_the_start(tmp_path: Path) -> None:
    path = tmp_path / "oncebus.db"
    path.write_bytes(FIXTURE_6.read_bytes())
    store = SqliteStore(path)
    assert store._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 10
    snapshot = store.load()
    assert [(s.path, s.session_id, s.state, s.updated_us) for s in snapshot.session_states] == [
        ("sq", "s1", b"state of s1", None)  # when it was set is not known
    ]
    assert [(r[0], r[1], r[7]) for r in snapshot.messages] == [("sq", 1, "s1")]
    store.close()

    async def go() -> None:
        clock = ManualClock(T0 + 60 * 10**6)
        reopened = SqliteStore(path)
        ns = await Namespace.open(reopened, clock)
        start = clock.now_us()
        # not known: counts as set at this start (at the latest), not before it
        assert ns.list_sessions("sq", state_updated_after=us_to_datetime(start - 1)) == ["s1"]
        assert ns.list_sessions("sq", state_updated_after=us_to_datetime(start)) == []
        session = await ns.accept_session("sq", "s1")
        assert await ns.get_session_state(session) == b"state of s1"
        assert [m.body for m in await ns.receive("sq", 10, session=session)] == [b"in a session"]
        clock.advance(5)
        await ns.set_session_state(session, b"new")  # set again: its time is stored now
        await ns.close()
        reopened.close()
        clock.advance(5)
        again = SqliteStore(path)
        ns = await Namespace.open(again, clock)
        assert ns.list_sessions("sq", state_updated_after=us_to_datetime(start + 1)) == ["s1"]
        assert ns.list_sessions("sq", state_updated_after=us_to_datetime(start + 6 * 10**6)) == []
        await ns.close()
        again.close()

    asyncio.run(go())


def test_a_failed_schema_6_migration_leaves_the_file_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from oncebus.store import sqlite_layout

    path = tmp_path / "oncebus.db"
    path.write_bytes(FIXTURE_6.read_bytes())
    real = sqlite_layout._session_times_v6_to_v7

    def failing(db: sqlite3.Connection) -> None:
        real(db)  # all of it done, then the failure: the transaction is rolled back
        raise OSError("simulated failure at the end")

    monkeypatch.setattr(sqlite_layout, "_session_times_v6_to_v7", failing)
    with pytest.raises(
        StoreError, match=rf"could not migrate .* from store schema 6 to {SCHEMA_VERSION} .*the file is unchanged"
    ):
        SqliteStore(path)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 6
    assert "updated_us" not in {row[1] for row in db.execute("PRAGMA table_info(session_state)")}
    assert db.execute("SELECT session_id, state FROM session_state").fetchall() == [("s1", b"state of s1")]
    db.close()
    monkeypatch.setattr(sqlite_layout, "_session_times_v6_to_v7", real)
    store = SqliteStore(path)  # and it migrates next time
    assert [s.updated_us for s in store.load().session_states] == [None]
    store.close()
