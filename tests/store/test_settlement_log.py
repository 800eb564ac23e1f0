"""The settlement log (``store/settlement_log.py``): a settlement confirmed by one appended record, applied to the
database by the writer in batches, replayed once after a crash (docs/store.md)."""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncebus.core.errors import StoreError, StoreWriteError
from oncebus.core.messages import MessageState, StoredMessage
from oncebus.store import settlement_log
from oncebus.store import writer as writer_module
from oncebus.store.base import AddCounters, DeleteMessage, MoveMessage, Op, PutMessage, UpdateMessage
from oncebus.store.sqlite import SqliteStore
from oncebus.store.sqlite_layout import SCHEMA_VERSION
from tests.store.writer_support import writer_idle

ROOT = Path(__file__).resolve().parents[2]


def _message(seq: int, path: str = "q") -> StoredMessage:
    return StoredMessage(
        path=path,
        sequence_number=seq,
        body=f"body {seq}".encode(),
        message_id=f"m{seq}",
        enqueued_time_us=1,
        expires_at_us=None,
        state=MessageState.ACTIVE,
    )


def _until(condition: Callable[[], bool], what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _held(path: Path) -> tuple[list[tuple[str, int]], dict[str, dict[str, int]]]:
    """(path, sequence number) of every stored message, and the counters, as a fresh start reads them."""
    store = SqliteStore(path)
    try:
        snapshot = store.load()
        return sorted((row[0], row[1]) for row in snapshot.messages), {
            entity: counters.counters for entity, counters in snapshot.counters.items()
        }
    finally:
        store.close()


def test_a_completion_is_one_record_applied_by_the_writer_and_the_log_is_emptied(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "oncebus.db")
    try:
        store.submit([PutMessage(_message(n)) for n in (1, 2, 3)]).result()
        writer_idle(store)
        assert store.commit_now([DeleteMessage("q", 1), AddCounters("q", 0, {"completed": 1})])
        assert store.logged_settlements == 1
        _until(lambda: store._unsynced_since is None, "the writer's sync")
        assert store.log_path.stat().st_size == 0
        assert store._db.execute("SELECT applied_through FROM settlement_log").fetchall() == [(1,)]
    finally:
        store.close()
    assert _held(tmp_path / "oncebus.db") == ([("q", 2), ("q", 3)], {"q": {"completed": 1}})


CRASH = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from oncebus.store import writer
    writer.SETTLEMENT_SYNC_SECONDS = 3600.0  # the writer does not apply the log before the kill
    from oncebus.core.messages import MessageState, StoredMessage
    from oncebus.store.base import AddCounters, DeleteMessage, MoveMessage, PutMessage
    from oncebus.store.sqlite import SqliteStore
    from tests.store.writer_support import writer_idle  # (run from the repository's root)

    def message(seq):
        return StoredMessage("q", seq, f"m{seq}", b"x", 1, None, state=MessageState.ACTIVE)

    store = SqliteStore(Path(sys.argv[1]))
    store.load()
    store.submit([PutMessage(message(n)) for n in (1, 2, 3)]).result()
    writer_idle(store)
    assert store.commit_now([DeleteMessage("q", 1), AddCounters("q", 0, {"completed": 1})])
    writer_idle(store)
    assert store.commit_now([MoveMessage("q", 2, "q/$deadletterqueue", 0, "why", "what", None)])
    assert store.logged_settlements == 2
    print("confirmed", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_settlements_confirmed_by_the_log_survive_kill_9_and_are_applied_once(tmp_path: Path) -> None:
    path = tmp_path / "oncebus.db"
    done = subprocess.run(
        [sys.executable, "-c", CRASH, str(path)], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.stdout == "confirmed\n", done.stderr
    assert done.returncode == -9
    log = path.with_name("oncebus.db-settled")
    assert log.stat().st_size > 0  # confirmed, not applied: only the log has them
    held, counters = _held(path)
    assert held == [("q", 3), ("q/$deadletterqueue", 2)]
    assert counters == {"q": {"completed": 1}}
    assert log.stat().st_size == 0
    assert _held(path) == (held, counters)  # a second start applies nothing again


def test_a_record_cut_short_by_a_crash_is_ignored_and_those_before_it_applied(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "oncebus.db"
    store = SqliteStore(path)
    store.submit([PutMessage(_message(n)) for n in (1, 2, 3)]).result()
    store.close()
    whole = settlement_log.encode(store._store_id, 1, [DeleteMessage("q", 1)])
    torn = settlement_log.encode(store._store_id, 2, [DeleteMessage("q", 2)])[:-3]
    path.with_name("oncebus.db-settled").write_bytes(whole + torn)
    with caplog.at_level(logging.WARNING, logger="oncebus.store"):
        assert _held(path)[0] == [("q", 2), ("q", 3)]
    assert "a record cut short by a crash" in caplog.text


def test_records_the_database_already_holds_are_not_applied_again(tmp_path: Path) -> None:
    """A crash after the writer's commit of some records and before it emptied the log: those are skipped."""
    path = tmp_path / "oncebus.db"
    store = SqliteStore(path)
    store.submit([PutMessage(_message(n)) for n in (1, 2, 3)]).result()
    writer_idle(store)
    assert store.commit_now([AddCounters("q", 0, {"completed": 5}), DeleteMessage("q", 1)])
    store.close()  # applied: the mark is 1
    me = store._store_id
    applied = settlement_log.encode(me, 1, [AddCounters("q", 0, {"completed": 5}), DeleteMessage("q", 1)])
    after = settlement_log.encode(me, 2, [AddCounters("q", 0, {"completed": 1}), DeleteMessage("q", 2)])
    path.with_name("oncebus.db-settled").write_bytes(applied + after)
    assert _held(path) == ([("q", 3)], {"q": {"completed": 6}})


def test_a_log_left_beside_another_database_is_not_applied_to_it(tmp_path: Path) -> None:
    """The database moved away (to start afresh) and its log left behind: the new database ignores it."""
    path = tmp_path / "oncebus.db"
    store = SqliteStore(path)
    store.submit([PutMessage(_message(1))]).result()
    store.close()
    other = settlement_log.encode("another store", 1, [DeleteMessage("q", 1), AddCounters("q", 0, {"completed": 1})])
    path.with_name("oncebus.db-settled").write_bytes(other)
    assert _held(path) == ([("q", 1)], {})
    assert path.with_name("oncebus.db-settled").stat().st_size == 0


def test_the_writer_applies_logged_settlements_before_the_units_queued_after_them(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "oncebus.db")
    try:
        store.submit([PutMessage(_message(1))]).result()
        seen: list[str] = []
        store._db.set_trace_callback(seen.append)
        writer_idle(store)
        assert store.commit_now([DeleteMessage("q", 1)])
        store.submit([PutMessage(_message(2))]).result()  # durable: its commit carries the logged delete first
        statements = [s for s in seen if not s.startswith("PRAGMA")]
        assert statements[0] == "BEGIN IMMEDIATE" and statements.count("COMMIT") == 1  # one transaction
        delete = statements.index("DELETE FROM message WHERE path = 'q' AND sequence_number = 1")
        insert = next(i for i, s in enumerate(statements) if s.startswith("INSERT OR REPLACE INTO message"))
        mark = statements.index("UPDATE settlement_log SET applied_through = 1 WHERE id = 0")
        assert delete < insert < mark < statements.index("COMMIT")
        assert store.log_path.stat().st_size == 0  # applied by a durable commit: emptied at once
    finally:
        store.close()
    assert _held(tmp_path / "oncebus.db")[0] == [("q", 2)]


def test_a_reload_reads_the_settlements_the_log_confirmed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer_module, "SETTLEMENT_SYNC_SECONDS", 3600.0)
    store = SqliteStore(tmp_path / "oncebus.db")
    try:
        store.submit([PutMessage(_message(n)) for n in (1, 2)]).result()
        writer_idle(store)
        assert store.commit_now([DeleteMessage("q", 1)])
        assert [row[1] for row in store.load().messages] == [2]  # what the broker rebuilds memory from
    finally:
        store.close()


def test_a_failed_append_stores_nothing_and_names_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = SqliteStore(tmp_path / "oncebus.db")
    try:
        store.submit([PutMessage(_message(n)) for n in (1, 2)]).result()
        writer_idle(store)
        real = os.write

        def half_then_full(fd: int, data: bytes) -> int:  # part of the record lands, then the disk is full
            if fd == store._log._fd:
                if not getattr(half_then_full, "wrote", False):
                    half_then_full.wrote = True  # type: ignore[attr-defined]
                    return real(fd, data[:5])
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(fd, data)

        monkeypatch.setattr(os, "write", half_then_full)
        with pytest.raises(StoreWriteError, match=r"oncebus.db-settled.*No space left"):
            store.commit_now([DeleteMessage("q", 1)])
        monkeypatch.setattr(os, "write", real)
        assert store.log_path.stat().st_size == 0 and store.logged_settlements == 0  # nothing of it stays
        writer_idle(store)
        assert store.commit_now([DeleteMessage("q", 2)])
    finally:
        store.close()
    assert _held(tmp_path / "oncebus.db")[0] == [("q", 1)]


def test_an_abandon_that_merges_properties_commits_instead(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "oncebus.db")
    try:
        store.submit([PutMessage(_message(1))]).result()
        writer_idle(store)
        assert store.commit_now([UpdateMessage("q", 1, int(MessageState.ACTIVE), 1, {"why": "retry"})])
        assert store.logged_settlements == 0 and store.direct_commits == 1
        assert store.log_path.stat().st_size == 0
    finally:
        store.close()


def test_records_read_back_as_written() -> None:
    unit: list[Op] = [
        DeleteMessage("q", 1),
        UpdateMessage("q", 2, 0, 3),
        MoveMessage("t/subscriptions/s", 4, "t/subscriptions/s/$deadletterqueue", 0, "reason", None, "t"),
        AddCounters("q", 9, {"completed": 2, "dead_lettered": 1}),
    ]
    data = settlement_log.encode("s", 7, unit) + settlement_log.encode("s", 8, unit[:1])
    assert settlement_log.decode(data, "s") == ([(7, unit), (8, unit[:1])], len(data))
    assert settlement_log.decode(data, "another") == ([], len(data))
    damaged = bytearray(data)
    damaged[-2] ^= 0xFF  # the last record fails its CRC: the first still reads
    assert settlement_log.decode(bytes(damaged), "s") == ([(7, unit)], len(settlement_log.encode("s", 7, unit)))


# written by oncebus at store schema 7 (tests/store/fixtures/make_schema7.py, run on that release): a queue "q" with
# messages 1, 2, 3 and its counters (3 incoming), before the settlement log
FIXTURE_7 = Path(__file__).parent / "fixtures" / "schema7.db"


def test_a_schema_7_file_is_migrated_and_its_settlements_go_through_the_log(tmp_path: Path) -> None:
    path = tmp_path / "oncebus.db"
    path.write_bytes(FIXTURE_7.read_bytes())
    store = SqliteStore(path)
    try:
        assert store._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 10
        assert store._db.execute("SELECT id, applied_through FROM settlement_log").fetchall() == [(0, 0)]
        assert len(store._store_id) == 32
        snapshot = store.load()
        assert [row[1] for row in snapshot.messages] == [1, 2, 3]
        assert store.read_messages("q", [2])[2].body == b"body 2"
        writer_idle(store)
        assert store.commit_now([DeleteMessage("q", 1), AddCounters("q", 0, {"completed": 1})])
        assert store.logged_settlements == 1
    finally:
        store.close()
    assert _held(path) == ([("q", 2), ("q", 3)], {"q": {"incoming": 3, "completed": 1}})


def test_a_failed_schema_7_migration_leaves_the_file_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from oncebus.store import sqlite_layout

    path = tmp_path / "oncebus.db"
    path.write_bytes(FIXTURE_7.read_bytes())
    real = sqlite_layout._settlement_log_v7_to_v8

    def failing(db: sqlite3.Connection) -> None:
        real(db)
        raise OSError("simulated failure at the end")

    monkeypatch.setattr(sqlite_layout, "_settlement_log_v7_to_v8", failing)
    with pytest.raises(
        StoreError, match=rf"could not migrate .* from store schema 7 to {SCHEMA_VERSION} .*the file is unchanged"
    ):
        SqliteStore(path)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 7
    assert db.execute("SELECT sequence_number FROM message ORDER BY 1").fetchall() == [(1,), (2,), (3,)]
    db.close()


def test_a_log_deleted_under_the_store_is_applied_and_started_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer_module, "SETTLEMENT_SYNC_SECONDS", 3600.0)
    store = SqliteStore(tmp_path / "oncebus.db")
    try:
        store.submit([PutMessage(_message(n)) for n in (1, 2, 3)]).result()
        writer_idle(store)
        assert store.commit_now([DeleteMessage("q", 1)])
        store.log_path.unlink()  # a confirmed record only in the deleted file
        store.submit([PutMessage(_message(4))]).result()  # the writer's check before its next group
        assert store.log_path.exists()
        writer_idle(store)
        assert store.commit_now([DeleteMessage("q", 2)])
        assert store.log_path.stat().st_size > 0  # appended to the new file
    finally:
        store.close()
    assert _held(tmp_path / "oncebus.db")[0] == [("q", 3), ("q", 4)]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 10**6), st.sampled_from(["me", "other"])), max_size=5),
    st.binary(max_size=64),
    st.integers(0, 400),
    st.integers(0, 255),
)
def test_any_damage_to_the_log_reads_as_a_prefix_of_its_records(
    records: list[tuple[int, str]], junk: bytes, where: int, flip: int
) -> None:
    """Whatever bytes a crash or a disk leaves, decoding never raises and yields whole records of this store, in
    order, up to the first damaged one (the bytes after it are never read as records)."""
    encoded = [settlement_log.encode(owner, number, [DeleteMessage("q", number)]) for number, owner in records]
    data = bytearray(b"".join(encoded) + junk)
    if data and flip:
        data[where % len(data)] ^= flip
    decoded, end = settlement_log.decode(bytes(data), "me")
    assert 0 <= end <= len(data)
    expected = [(number, [DeleteMessage("q", number)]) for number, owner in records if owner == "me"]
    assert decoded == expected[: len(decoded)]


_texts = st.text(max_size=12)  # quotes, backslashes, control and non-ASCII characters included
_ops = st.one_of(
    st.builds(DeleteMessage, _texts, st.integers(0, 2**63 - 1)),
    st.builds(
        AddCounters,
        _texts,
        st.integers(0, 2**63 - 1),
        st.dictionaries(_texts, st.integers(-(2**40), 2**40), max_size=4),
    ),
    st.builds(UpdateMessage, _texts, st.integers(0, 2**40), st.integers(0, 3), st.integers(0, 99)),
    st.builds(
        MoveMessage,
        _texts,
        st.integers(0, 2**40),
        _texts,
        st.integers(0, 3),
        st.none() | _texts,
        st.none() | _texts,
        st.none() | _texts,
    ),
)


@settings(max_examples=300, deadline=None)
@given(_texts, st.integers(0, 2**40), st.lists(_ops, min_size=1, max_size=5))
def test_a_record_reads_back_in_either_format(store_id: str, number: int, unit: list[object]) -> None:
    """The binary record decodes to the same ops. The JSON one (``encode_json``, the previous release's ``encode``,
    whose text is built directly for deletes and counters) must be byte for byte what json.dumps wrote, which
    earlier logs hold, and decode to the same ops too."""
    import json

    record = settlement_log.encode(store_id, number, unit)  # type: ignore[arg-type]
    assert record[8] == settlement_log.BINARY
    assert settlement_log.decode(record, store_id) == ([(number, unit)], len(record))
    old = settlement_log.encode_json(store_id, number, unit)  # type: ignore[arg-type]
    payload = json.dumps(
        [store_id, number, [settlement_log._op_fields(op) for op in unit]],  # type: ignore[arg-type]
        separators=(",", ":"),
    ).encode()
    assert old == settlement_log.HEADER.pack(len(payload), zlib.crc32(payload)) + payload
    assert settlement_log.decode(old, store_id) == ([(number, unit)], len(old))


# records in the first (JSON) format, written by the release before the binary records
# (tests/store/fixtures/make_settlement_log_v1.py, run on commit 00c8ac0), for the store id "fixture-store"
FIXTURE_LOG_V1 = Path(__file__).parent / "fixtures" / "settlement_log_v1.bin"
UNITS_V1: list[tuple[int, list[Op]]] = [
    (1, [AddCounters("q", 0, {"completed": 1}), DeleteMessage("q", 1)]),
    (2, [UpdateMessage("q", 2, 0, 3), AddCounters("q", 0, {"abandoned": 1})]),
    (
        3,
        [
            MoveMessage("t/subscriptions/s", 4, "t/subscriptions/s/$deadletterqueue", 0, "reason", None, "t"),
            MoveMessage("q", 5, "q/$deadletterqueue", 0, None, 'd\u00e9j\u00e0 "vu"\n', None),
            AddCounters("t/subscriptions/s", 7, {"dead_lettered": 1, "active": -1}),
            DeleteMessage("caf\u00e9-\u30ad\u30e5\u30fc", 2**40),
        ],
    ),
]


def test_a_log_the_previous_release_wrote_reads_back_whole() -> None:
    old = FIXTURE_LOG_V1.read_bytes()
    assert settlement_log.decode(old, "fixture-store") == (UNITS_V1, len(old))
    assert b"".join(settlement_log.encode_json("fixture-store", n, unit) for n, unit in UNITS_V1) == old
    new = b"".join(settlement_log.encode("fixture-store", n, unit) for n, unit in UNITS_V1)
    assert new[8] == settlement_log.BINARY
    assert settlement_log.decode(new, "fixture-store") == (UNITS_V1, len(new))
    mixed = old + settlement_log.encode("fixture-store", 4, [DeleteMessage("q", 9)])
    assert settlement_log.decode(mixed, "fixture-store") == ([*UNITS_V1, (4, [DeleteMessage("q", 9)])], len(mixed))


def test_an_upgrade_replays_the_settlements_the_previous_release_logged(tmp_path: Path) -> None:
    """Killed with settlements in its log, the previous release (JSON records) is replaced: the new one's start
    applies them, once, and then logs its own in the binary format."""
    path = tmp_path / "oncebus.db"
    store = SqliteStore(path)
    store.submit([PutMessage(_message(n)) for n in (1, 2, 3)]).result()
    store.close()
    me = store._store_id
    old = settlement_log.encode_json(me, 1, [AddCounters("q", 0, {"completed": 1}), DeleteMessage("q", 1)])
    old += settlement_log.encode_json(me, 2, [AddCounters("q", 0, {"completed": 1}), DeleteMessage("q", 3)])
    assert old[8:9] == b"["
    path.with_name("oncebus.db-settled").write_bytes(old)
    assert _held(path) == ([("q", 2)], {"q": {"completed": 2}})
    store = SqliteStore(path)
    try:
        writer_idle(store)
        assert store.commit_now([AddCounters("q", 0, {"completed": 1}), DeleteMessage("q", 2)])
        assert path.with_name("oncebus.db-settled").read_bytes()[8] == settlement_log.BINARY
    finally:
        store.close()
    assert _held(path) == ([], {"q": {"completed": 3}})


def test_a_binary_record_with_bytes_past_its_ops_stops_the_replay() -> None:
    whole = settlement_log.encode("s", 1, [DeleteMessage("q", 1)])
    payload = settlement_log.encode("s", 2, [DeleteMessage("q", 2)])[8:] + b"\x00"
    bad = settlement_log.HEADER.pack(len(payload), zlib.crc32(payload)) + payload
    assert settlement_log.decode(whole + bad, "s") == ([(1, [DeleteMessage("q", 1)])], len(whole))


def test_long_texts_and_many_ops_read_back() -> None:
    unit: list[Op] = [DeleteMessage("q", n) for n in range(70_000)]
    unit.append(MoveMessage("q", 1, "q/$deadletterqueue", 0, "r" * 70_000, "", "\u00e9" * 40_000))
    record = settlement_log.encode("s", 1, unit)
    assert settlement_log.decode(record, "s") == ([(1, unit)], len(record))


# --- the binary decoder under random units and random damage -----------------------------------------------
_records = st.lists(
    st.tuples(st.integers(0, 2**63 - 1), st.sampled_from(["me", "other"]), st.lists(_ops, min_size=1, max_size=4)),
    min_size=1,
    max_size=4,
)


def _boundaries(encoded: list[bytes]) -> list[int]:
    ends = [0]
    for record in encoded:
        ends.append(ends[-1] + len(record))
    return ends


@settings(max_examples=200, deadline=None)
@given(
    _records,
    st.none() | st.integers(0, 10**6),  # a cut: the file ends there
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), max_size=3),  # bytes flipped
    st.binary(max_size=40),  # whatever follows the last record
)
def test_random_units_with_random_damage_read_as_exactly_the_records_before_it(
    records: list[tuple[int, str, list[Op]]], cut: int | None, flips: list[tuple[int, int]], junk: bytes
) -> None:
    """Binary records of any ops, then the file cut short, bytes flipped and garbage appended: decoding never
    raises, and yields exactly the whole undamaged records of this store before the first damage (never a unit
    that was not written), ending where they end."""
    encoded = [settlement_log.encode(owner, number, unit) for number, owner, unit in records]
    clean = b"".join(encoded)
    data = bytearray(clean + junk)
    if cut is not None:
        del data[cut % (len(data) + 1) :]
    for where, flip in flips:
        if data:
            data[where % len(data)] ^= flip
    # the junk is never a record of this store; flips may undo each other
    first_damage = min(len(clean), len(data), *(i for i, (a, b) in enumerate(zip(data, clean, strict=False)) if a != b))
    ends = _boundaries(encoded)
    whole = max(i for i, end in enumerate(ends) if end <= first_damage)  # records wholly before the damage
    decoded, end = settlement_log.decode(bytes(data), "me")
    assert decoded == [(number, unit) for number, owner, unit in records[:whole] if owner == "me"]
    assert end == ends[whole]


_damage = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(1, 255)),
    st.tuples(st.just("cut"), st.integers(0, 10**6), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 10**6), st.integers(0, 255)),
    st.tuples(st.just("drop"), st.integers(0, 10**6), st.just(0)),
)


@settings(max_examples=300, deadline=None)
@given(_records, st.lists(_damage, min_size=1, max_size=3), st.binary(max_size=8))
def test_a_damaged_binary_payload_with_a_valid_crc_stops_the_replay_or_reads_as_what_it_encodes(
    records: list[tuple[int, str, list[Op]]], damage: list[tuple[str, int, int]], trailing: bytes
) -> None:
    """The decoder itself, past the CRC (a payload damaged, then its CRC made right again): it never raises, and
    a payload it accepts is exactly the encoding of what it returns (canonical: no other bytes read as the same
    unit, none dropped), so what it returns is a unit that encoding was written for."""
    good = settlement_log.encode("me", 0, [DeleteMessage("q", 1)])
    number, owner, unit = records[0]
    payload = bytearray(settlement_log.encode(owner, number, unit)[settlement_log.HEADER.size :])
    for kind, where, value in damage:
        where %= len(payload) + 1
        if kind == "flip" and where < len(payload):
            payload[where] ^= value
        elif kind == "cut":
            del payload[where:]
        elif kind == "insert":
            payload.insert(where, value)
        elif kind == "drop" and where < len(payload):
            del payload[where]
    payload += trailing
    damaged = settlement_log.HEADER.pack(len(payload), zlib.crc32(payload)) + bytes(payload)
    decoded, end = settlement_log.decode(good + damaged, "me")
    assert decoded[:1] == [(0, [DeleteMessage("q", 1)])]
    if end == len(good):  # the replay stops at the damaged record
        assert decoded == [(0, [DeleteMessage("q", 1)])]
        return
    assert end == len(good) + len(damaged)
    got_owner, got_number, got_unit = settlement_log._decode_payload(bytes(payload))
    assert settlement_log.encode(got_owner, got_number, got_unit) == damaged
    assert decoded[1:] == ([(got_number, got_unit)] if got_owner == "me" else [])


@pytest.mark.parametrize(
    "payload",
    [
        b'["s",1,[["d","q",Infinity]]]',  # json reads Infinity, NaN and 1e400 as floats no int() takes
        b'["s",1e400,[]]',
        b'["s",1,[["c","q",NaN,{}]]]',
        b"[" * 100_000,  # deeper than json's recursion limit
        b"\x02" + b"\x00\x01s" + b"\x00" * 8 + b"\xff\xff\xff\xff",  # four billion ops announced, none there
        # binary, with what the encoder never writes: a counter named twice, a short text in the long form
        b"\x02\x00\x01s"
        + bytes(8)
        + b"\x00\x00\x00\x01c\x00\x01q"
        + bytes(8)
        + b"\x00\x02"
        + (b"\x00\x01a" + bytes(8)) * 2,
        b"\x02\xff\xfe\x00\x00\x00\x01s" + bytes(8) + b"\x00\x00\x00\x00",
    ],
    ids=["infinity", "huge-number", "nan", "deep-nesting", "op-count", "counter-twice", "long-form"],
)
def test_a_payload_no_decoder_foresaw_stops_the_replay(payload: bytes) -> None:
    good = settlement_log.encode("s", 1, [DeleteMessage("q", 1)])
    bad = settlement_log.HEADER.pack(len(payload), zlib.crc32(payload)) + payload
    assert settlement_log.decode(good + bad, "s") == ([(1, [DeleteMessage("q", 1)])], len(good))
