"""Dedup index images (checkpoints): written while serving and at a clean stop, read in bulk at start with the
rows since their mark on top, never trusted blindly.

The ``dedup_key`` rows stay the truth: an image is used with the rows first accepted since its mark; a damaged or
missing image, an entity deleted since, or a write that failed before the image was committed all fall back to
the rows, with the same verdicts. What a start read from the rows is counted (``SqliteStore.keys_read``).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from oncebus.broker import ManualClock, Message, Namespace, recovery
from oncebus.store.sqlite import SqliteStore
from oncebus.store.sqlite_layout import SCHEMA_VERSION
from tests.store.writer_support import writer_idle

T0 = 1_700_000_000_000_000
KEYS = 5_000  # more than one block of the index's log (4096 entries)


async def _open(path: Path, clock: ManualClock) -> tuple[SqliteStore, Namespace]:
    store = SqliteStore(path)
    return store, await Namespace.open(store, clock)


def _checkpoints(store: SqliteStore) -> int:
    """Entities the committed checkpoint holds."""
    db = sqlite3.connect(store.path)
    try:
        return int(db.execute("SELECT count(*) FROM dedup_checkpoint").fetchone()[0])
    finally:
        db.close()


async def _stop(store: SqliteStore, ns: Namespace) -> None:
    await ns.close()
    store.close()


def _crash(store: SqliteStore) -> None:
    """Stop without the namespace's close: what a killed process leaves (every acknowledged unit committed)."""
    store._keep_images = None
    store.close()


async def _duplicates(ns: Namespace, entity: str, ids: list[str]) -> list[bool]:
    outcomes = await ns.send(entity, [Message(b"x", message_id=i) for i in ids])
    return [o.duplicate for o in outcomes]


async def _fill(ns: Namespace, clock: ManualClock) -> None:
    await ns.create_queue("q", requires_duplicate_detection=True, duplicate_detection_history_time_window="PT1H")
    await ns.create_queue("off", requires_duplicate_detection=False)
    for start in range(0, KEYS, 500):
        await ns.send("q", [Message(b"x", message_id=f"k{i}") for i in range(start, start + 500)])
        clock.advance(1)


async def _checkpoint(store: SqliteStore, ns: Namespace) -> None:
    """A checkpoint while serving, committed (the loop goes on while the child writes)."""
    assert ns.checkpoint_dedup()
    while store._checkpointing is not None:
        await asyncio.sleep(0.005)


def test_a_clean_restart_reads_the_image_and_no_row(tmp_path: Path) -> None:
    path = tmp_path / "oncebus.db"
    clock = ManualClock(T0)

    async def go() -> None:
        store, ns = await _open(path, clock)
        await _fill(ns, clock)
        before = ns.stats("q").keys_held
        await _stop(store, ns)
        assert [p.exists() for p in store.checkpoint_files()] == [True]

        store, ns = await _open(path, clock)
        assert store.keys_read == 0  # every key from the image
        assert ns.stats("q").keys_held == before == KEYS
        assert await _duplicates(ns, "q", ["k0", "k4999", "new"]) == [True, True, False]
        assert not (await _duplicates(ns, "off", ["k0"]))[0]
        # the window still counts from each key's first acceptance: k0..k499 were accepted at T0
        clock.advance(3600 - 10)
        assert await _duplicates(ns, "q", ["k1", "k600"]) == [False, True]
        await _stop(store, ns)

    asyncio.run(go())


def test_a_crash_after_a_start_from_an_image_replays_only_the_rows_since_its_mark(tmp_path: Path) -> None:
    path = tmp_path / "oncebus.db"
    clock = ManualClock(T0)

    async def go() -> None:
        store, ns = await _open(path, clock)
        await _fill(ns, clock)
        await _stop(store, ns)
        store, ns = await _open(path, clock)
        assert await _duplicates(ns, "q", [f"after-{i}" for i in range(300)]) == [False] * 300
        _crash(store)  # the image of the clean stop stays the checkpoint

        store, ns = await _open(path, clock)
        assert store.keys_read == 300
        assert ns.stats("q").keys_held == KEYS + 300
        assert await _duplicates(ns, "q", ["k0", "k4999", "after-0", "after-299", "new"]) == [True] * 4 + [False]
        _crash(store)

    asyncio.run(go())


def test_a_queue_deleted_and_made_again_gets_none_of_its_image(tmp_path: Path) -> None:
    path = tmp_path / "oncebus.db"
    clock = ManualClock(T0)

    async def go() -> None:
        store, ns = await _open(path, clock)
        await _fill(ns, clock)
        await _stop(store, ns)
        store, ns = await _open(path, clock)
        assert await _duplicates(ns, "q", ["after-image"]) == [False]
        await ns.delete_queue("q")  # and made again: none of the image's keys may come back
        await ns.create_queue("q", requires_duplicate_detection=True, duplicate_detection_history_time_window="PT1H")
        assert await _duplicates(ns, "q", ["again"]) == [False]
        _crash(store)

        store, ns = await _open(path, clock)
        assert _checkpoints(store) == 0 and store.keys_read == 1
        assert await _duplicates(ns, "q", ["again", "k0", "after-image"]) == [True, False, False]
        await _stop(store, ns)

    asyncio.run(go())


def test_a_checkpoint_while_serving_leaves_a_crash_only_the_rows_after_it(tmp_path: Path) -> None:
    path = tmp_path / "oncebus.db"
    clock = ManualClock(T0)

    async def go() -> None:
        store, ns = await _open(path, clock)
        await _fill(ns, clock)
        _crash(store)
        store, ns = await _open(path, clock)
        assert store.keys_read == KEYS  # no image yet: every row
        await _checkpoint(store, ns)
        assert store.checkpoints == 1 and len(store.checkpoint_pauses) == 1
        clock.advance(1)
        assert await _duplicates(ns, "q", [f"after-{i}" for i in range(200)]) == [False] * 200
        clock.advance(1)  # keys first accepted at a checkpoint's mark are read again: harmless, but counted
        await _checkpoint(store, ns)  # a second one replaces the first, and its file
        assert await _duplicates(ns, "q", [f"later-{i}" for i in range(100)]) == [False] * 100
        files = store.checkpoint_files()
        assert len(files) == 1 and sorted(p.name for p in tmp_path.glob("oncebus.db.dedup*")) == [files[0].name]
        _crash(store)

        store, ns = await _open(path, clock)
        assert store.keys_read == 100  # only what came after the last checkpoint
        assert ns.stats("q").keys_held == KEYS + 300
        ids = ["k0", "k4999", "after-0", "after-199", "later-0", "later-99", "new"]
        assert await _duplicates(ns, "q", ids) == [True] * 6 + [False]
        await _stop(store, ns)

    asyncio.run(go())


def test_a_queue_deleted_while_its_checkpoint_is_written_is_left_out_of_it(tmp_path: Path) -> None:
    path = tmp_path / "oncebus.db"
    clock = ManualClock(T0)

    async def go() -> None:
        store, ns = await _open(path, clock)
        await _fill(ns, clock)
        await ns.create_queue("other", requires_duplicate_detection=True)
        assert await _duplicates(ns, "other", ["o1"]) == [False]
        assert ns.checkpoint_dedup()
        await ns.delete_queue("q")  # submitted after the fork: its image in this checkpoint is void
        await ns.create_queue("q", requires_duplicate_detection=True, duplicate_detection_history_time_window="PT1H")
        assert await _duplicates(ns, "q", ["again"]) == [False]
        while store._checkpointing is not None:
            await asyncio.sleep(0.005)
        assert store.checkpoints == 1
        assert [r[0] for r in store._db.execute("SELECT entity FROM dedup_checkpoint")] == ["other"]
        _crash(store)

        store, ns = await _open(path, clock)
        assert await _duplicates(ns, "q", ["again", "k0"]) == [True, False]
        assert await _duplicates(ns, "other", ["o1"]) == [True]
        await _stop(store, ns)

    asyncio.run(go())


@pytest.mark.parametrize("when", ["a write failed", "the store was reloaded"])
def test_a_checkpoint_is_dropped_when_memory_may_hold_a_key_the_store_does_not(tmp_path: Path, when: str) -> None:
    path = tmp_path / "oncebus.db"
    clock = ManualClock(T0)

    async def go() -> None:
        store, ns = await _open(path, clock)
        await _fill(ns, clock)
        await _stop(store, ns)
        store, ns = await _open(path, clock)
        before = store.checkpoint_files()
        # the checkpoint is held after its child wrote the images until the failure or the reload happened: a
        # child done before the test's next line had its checkpoint stored first (the test failed twice in 20)
        gate = threading.Event()
        wait_child = store._await_checkpoint

        def held(checkpoint: Any) -> None:
            assert gate.wait(30)
            wait_child(checkpoint)

        store._await_checkpoint = held  # type: ignore[method-assign]
        assert ns.checkpoint_dedup()
        if when == "a write failed":
            store.failures += 1  # one the broker has not heard of yet
        else:
            store.load()
        gate.set()
        while store._checkpointing is not None:
            await asyncio.sleep(0.005)
        assert store.checkpoints == 0 and store.checkpoints_dropped == 1
        assert store.checkpoint_files() == before
        assert sorted(tmp_path.glob("oncebus.db.dedup*")) == before
        _crash(store)
        store, ns = await _open(path, clock)
        assert await _duplicates(ns, "q", ["k0", "new"]) == [True, False]
        await _stop(store, ns)

    asyncio.run(go())


def test_a_window_shortened_after_the_checkpoint_applies_to_its_keys(tmp_path: Path) -> None:
    path = tmp_path / "oncebus.db"
    clock = ManualClock(T0)

    async def go() -> None:
        store, ns = await _open(path, clock)
        await _fill(ns, clock)
        await _checkpoint(store, ns)
        await ns.update_queue("q", duplicate_detection_history_time_window="PT1M")
        clock.advance(30)
        assert await _duplicates(ns, "q", ["fresh"]) == [False]
        clock.advance(40)  # k* were accepted 70 to 80 s ago: out of the new window; fresh 40 s ago: in it
        _crash(store)
        store, ns = await _open(path, clock)
        assert store.keys_read == 1
        assert await _duplicates(ns, "q", ["k0", "k4999", "fresh"]) == [False, False, True]
        await _stop(store, ns)

    asyncio.run(go())


@pytest.mark.parametrize("damage", ["flipped", "truncated", "missing"])
def test_a_damaged_or_missing_image_is_not_trusted(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "oncebus.db"
    clock = ManualClock(T0)

    async def go() -> None:
        store, ns = await _open(path, clock)
        await _fill(ns, clock)
        await _stop(store, ns)
        [image] = store.checkpoint_files()
        data = bytearray(image.read_bytes())
        if damage == "flipped":
            data[len(data) // 3] ^= 0x40  # inside the log's blocks: only the checksum can tell
            image.write_bytes(bytes(data))
        elif damage == "truncated":
            image.write_bytes(bytes(data[: len(data) - 100]))
        else:
            image.unlink()
        with caplog.at_level(logging.WARNING, logger="oncebus.broker"):
            store, ns = await _open(path, clock)
        assert store.keys_read == KEYS  # every row instead
        assert ns.stats("q").keys_held == KEYS
        assert await _duplicates(ns, "q", ["k0", "k2500", "k4999", "new"]) == [True, True, True, False]
        await _stop(store, ns)

    asyncio.run(go())
    if damage == "flipped":
        assert "could not be used (the image fails its checksum)" in caplog.text


@pytest.mark.parametrize("when", ["before the namespace closed", "after the namespace closed"])
def test_no_image_is_kept_when_a_write_failed_before_the_shutdown(tmp_path: Path, when: str) -> None:
    """A failed write the broker has not heard of yet (its callback still queued on the loop) or one of a unit
    committed after the namespace closed: memory may hold a key the store does not."""
    path = tmp_path / "oncebus.db"
    clock = ManualClock(T0)

    async def go() -> None:
        store, ns = await _open(path, clock)
        await _fill(ns, clock)
        if when.startswith("before"):
            store.failures += 1
        await ns.close()
        if when.startswith("after"):
            store.failures += 1
        store.close()
        assert _checkpoints(store) == 0 and list(tmp_path.glob("oncebus.db.dedup*")) == []
        store, ns = await _open(path, clock)
        assert store.keys_read == KEYS
        assert await _duplicates(ns, "q", ["k0", "new"]) == [True, False]
        await _stop(store, ns)

    asyncio.run(go())


def test_a_schema_3_directory_opens_and_keeps_its_keys(tmp_path: Path) -> None:
    """Schema 3 is schema 4 without the ``dedup_snapshot`` table (and never an image)."""
    path = tmp_path / "oncebus.db"
    clock = ManualClock(T0)

    async def write() -> None:
        store, ns = await _open(path, clock)
        await _fill(ns, clock)
        _crash(store)

    asyncio.run(write())
    db = sqlite3.connect(path)
    db.execute("DROP TABLE dedup_checkpoint")
    db.execute("PRAGMA user_version = 3")
    db.commit()
    db.close()

    async def read() -> None:
        store, ns = await _open(path, clock)
        assert store._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 10
        assert _checkpoints(store) == 0 and store.keys_read == KEYS
        assert ns.stats("q").keys_held == KEYS
        assert await _duplicates(ns, "q", ["k0", "k4999", "new"]) == [True, True, False]
        await _stop(store, ns)
        store, ns = await _open(path, clock)  # and from now on with images (and the rows of the stop's time)
        assert store.keys_read == 1 and await _duplicates(ns, "q", ["new"]) == [True]
        await _stop(store, ns)

    asyncio.run(read())


def test_a_schema_4_directory_stopped_cleanly_starts_from_its_image(tmp_path: Path) -> None:
    """Schema 4 wrote one image file, ``oncebus.db.dedup`` (the same format), at a clean stop, and its token to
    ``dedup_snapshot``: migrated, the image serves with the rows of its newest microsecond on top."""
    path = tmp_path / "oncebus.db"
    clock = ManualClock(T0)

    async def write() -> None:
        store, ns = await _open(path, clock)
        await _fill(ns, clock)
        await _stop(store, ns)

    asyncio.run(write())
    [image] = path.parent.glob("oncebus.db.dedup.*")
    image.rename(path.with_name("oncebus.db.dedup"))
    db = sqlite3.connect(path)
    [(token,)] = db.execute("SELECT DISTINCT token FROM dedup_checkpoint").fetchall()
    db.execute("DROP TABLE dedup_checkpoint")  # the schema 4 layout, as that release wrote it
    db.execute("CREATE TABLE dedup_snapshot (token BLOB NOT NULL)")
    db.execute("INSERT INTO dedup_snapshot (token) VALUES (?)", (token,))
    db.execute("PRAGMA user_version = 4")
    db.commit()
    db.close()

    async def read() -> None:
        store, ns = await _open(path, clock)
        assert store._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert store.keys_read == 500  # the last send's keys, all first accepted in the newest microsecond
        assert ns.stats("q").keys_held == KEYS
        assert await _duplicates(ns, "q", ["k0", "k4999", "new"]) == [True, True, False]
        await _stop(store, ns)  # a checkpoint of this release replaces it, and the old file goes
        assert [p.name for p in tmp_path.glob("oncebus.db.dedup*")] == [store.checkpoint_files()[0].name]

    asyncio.run(read())


def test_a_key_accepted_again_is_rebuilt_from_its_latest_row(tmp_path: Path) -> None:
    """A key resent after it left the window has two rows until pruning; rebuilt from the rows (in the primary
    key's order, no sort), the later acceptance is the one held, also when a longer window covers both."""
    path = tmp_path / "oncebus.db"
    clock = ManualClock(T0)

    async def go() -> None:
        store, ns = await _open(path, clock)
        await ns.create_queue("q", requires_duplicate_detection=True, duplicate_detection_history_time_window="PT1M")
        assert await _duplicates(ns, "q", ["k"]) == [False]
        clock.advance(61)
        assert await _duplicates(ns, "q", ["k"]) == [False]  # accepted again: a second row, at T0 + 61 s
        await ns.update_queue("q", duplicate_detection_history_time_window="PT1H")
        _crash(store)
        store, ns = await _open(path, clock)
        assert ns.stats("q").keys_held == 1
        clock.advance(3600 - 61 + 30)  # the first row's window has passed, the second's not
        assert await _duplicates(ns, "q", ["k"]) == [True]
        await _stop(store, ns)

    asyncio.run(go())


def test_an_image_that_cannot_be_written_leaves_no_checkpoint_and_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "oncebus.db"
    clock = ManualClock(T0)

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    async def go() -> None:
        store, ns = await _open(path, clock)
        await _fill(ns, clock)
        await ns.close()
        with monkeypatch.context() as patch, caplog.at_level(logging.WARNING, logger="oncebus.store"):
            patch.setattr("oncebus.store.dedup_images.os.fsync", full)
            store.close()
        assert "could not write the dedup index images" in caplog.text
        assert sorted(p.name for p in tmp_path.iterdir() if "dedup" in p.name) == []
        store, ns = await _open(path, clock)
        assert _checkpoints(store) == 0 and await _duplicates(ns, "q", ["k0", "new"]) == [True, False]
        await _stop(store, ns)

    asyncio.run(go())


def test_a_clock_set_back_across_a_restart_never_puts_a_new_key_before_the_mark(tmp_path: Path) -> None:
    """Keys accepted after a restart must be first accepted at or after the checkpoint's mark, or the next crash
    restart would not read them: the broker's time never goes back before the newest mark either."""
    path = tmp_path / "oncebus.db"

    async def go() -> None:
        clock = ManualClock(T0)
        store, ns = await _open(path, clock)
        await _fill(ns, clock)
        clock.advance(100)
        await _checkpoint(store, ns)  # marked T0 + 110 s, after every key
        _crash(store)
        store, ns = await _open(path, ManualClock(T0))  # the clock is back at T0
        assert await _duplicates(ns, "q", ["after-the-restart"]) == [False]
        _crash(store)
        store, ns = await _open(path, ManualClock(T0))
        assert await _duplicates(ns, "q", ["after-the-restart", "k0"]) == [True, True]
        await _stop(store, ns)

    asyncio.run(go())


def test_the_timer_checkpoints_after_enough_new_keys_and_after_a_start_that_read_many_rows(tmp_path: Path) -> None:
    path = tmp_path / "oncebus.db"
    clock = ManualClock(T0)

    async def wait(store: SqliteStore) -> None:
        while store._checkpointing is not None:
            await asyncio.sleep(0.005)

    async def go() -> None:
        store, ns = await _open(path, clock)
        await _fill(ns, clock)
        _crash(store)
        store, ns = await _open(path, clock)  # read KEYS rows: due at the first tick
        ns._checkpoints.keys, ns._checkpoints.min_seconds = 1000, 0.0
        ns.tick()
        await wait(store)
        assert store.checkpoints == 1
        ns.tick()
        await wait(store)
        assert store.checkpoints == 1  # nothing new
        assert await _duplicates(ns, "q", [f"a{i}" for i in range(999)]) == [False] * 999
        ns.tick()
        await wait(store)
        assert store.checkpoints == 1  # one key short
        assert await _duplicates(ns, "q", ["a0", "a999"]) == [True, False]
        clock.advance(1)
        ns.tick()
        await wait(store)
        assert store.checkpoints == 2
        _crash(store)
        store, ns = await _open(path, clock)
        assert store.keys_read == 0
        await _stop(store, ns)

    asyncio.run(go())


def test_a_checkpoint_whose_child_fails_is_dropped_and_the_previous_one_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "oncebus.db"
    clock = ManualClock(T0)

    def full(*args: object) -> None:
        raise OSError(28, "No space left on device")

    async def go() -> None:
        store, ns = await _open(path, clock)
        await _fill(ns, clock)
        await _stop(store, ns)
        store, ns = await _open(path, clock)
        before = store.checkpoint_files()
        assert await _duplicates(ns, "q", ["after"]) == [False]
        with monkeypatch.context() as patch:
            patch.setattr("oncebus.store.dedup_images.write", full)  # in the child (a fork: the same module)
            assert ns.checkpoint_dedup()
            while store._checkpointing is not None:
                await asyncio.sleep(0.005)
        assert store.checkpoints == 0 and store.checkpoints_dropped == 1
        assert sorted(tmp_path.glob("oncebus.db.dedup*")) == before
        _crash(store)
        store, ns = await _open(path, clock)
        assert store.keys_read == 1
        assert await _duplicates(ns, "q", ["after", "k0", "new"]) == [True, True, False]
        await _stop(store, ns)

    asyncio.run(go())


def _held_loader(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Hold the loader thread before it reads its first image: (started, release)."""
    started, release = threading.Event(), threading.Event()
    load = recovery._load_image

    def held(*args: Any) -> int:
        started.set()
        assert release.wait(30)
        return load(*args)

    monkeypatch.setattr(recovery, "_load_image", held)
    return started, release


def test_serve_opens_while_the_image_loads_and_a_send_waits_for_its_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``serve`` (a namespace opened with its backlog in the background) is ready before the images are read: they
    load on a thread, and a send judged meanwhile waits for them, so it is judged against every held key."""
    path = tmp_path / "oncebus.db"
    clock = ManualClock(T0)

    async def go() -> None:
        store, ns = await _open(path, clock)
        await _fill(ns, clock)
        await ns.send("q", [Message(b"x", message_id="since-the-image")])
        await _stop(store, ns)
        db = sqlite3.connect(path)  # a key accepted after the image's mark: read from the rows, applied after it
        db.execute("UPDATE dedup_checkpoint SET since_us = since_us - 1")
        db.commit()
        db.close()

        started, release = _held_loader(monkeypatch)
        store = SqliteStore(path)
        ns = await Namespace.open(store, clock, backlog_in_background=True)
        assert started.wait(10)  # open returned while the loader holds the image unread
        assert ns.stats("off").keys_held == 0  # an entity without detection is not waited for
        # nor is reading a window (serve's topology does before it is ready): an image does not hold it
        assert ns._registry.entities["q"].detector.window == timedelta(hours=1)
        await ns.update_queue("q", duplicate_detection_history_time_window="PT1H", lock_duration="PT1M")  # as it was
        threading.Timer(0.2, release.set).start()
        assert await _duplicates(ns, "q", ["k0", "k4999", "since-the-image", "new"]) == [True, True, True, False]
        assert ns.stats("q").keys_held == KEYS + 2
        await ns.backlog_restored()
        assert await _duplicates(ns, "q", ["new"]) == [True]
        await _stop(store, ns)

    asyncio.run(go())


def test_an_image_that_fails_on_the_loader_thread_is_rebuilt_from_its_rows_there(tmp_path: Path) -> None:
    path = tmp_path / "oncebus.db"
    clock = ManualClock(T0)

    async def go() -> None:
        store, ns = await _open(path, clock)
        await _fill(ns, clock)
        await _stop(store, ns)
        [image] = store.checkpoint_files()
        with open(image, "r+b") as file:  # one byte of the index changed: its CRC-32 fails
            file.seek(-100, 2)
            byte = file.read(1)
            file.seek(-100, 2)
            file.write(bytes([byte[0] ^ 0xFF]))

        store = SqliteStore(path)
        ns = await Namespace.open(store, clock, backlog_in_background=True)
        assert await _duplicates(ns, "q", ["k0", "k4999", "new"]) == [True, True, False]
        assert store.keys_read == KEYS  # rebuilt from its rows
        await ns.backlog_restored()
        await _stop(store, ns)

    asyncio.run(go())


def test_a_completion_the_log_confirmed_before_a_checkpoint_is_in_the_database_once_it_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint's commit is durable, and the writer then counts every settlement as synced: one the log
    confirmed and the database did not hold yet would be left to the next activity, past its power-safe period."""
    from oncebus.store import writer

    monkeypatch.setattr(writer, "SETTLEMENT_SYNC_SECONDS", 3600.0)  # the writer's own sync does not come first
    monkeypatch.setattr(SqliteStore, "idle_seconds", None)  # nor its idle check (it takes the writer's lock)
    path = tmp_path / "oncebus.db"
    clock = ManualClock(T0)

    async def go() -> None:
        store, ns = await _open(path, clock)
        await ns.create_queue("q", requires_duplicate_detection=True)
        await ns.send("q", [Message(b"x", message_id=f"m{i}") for i in range(3)])
        (first,) = await ns.receive("q", 1)
        assert first.lock_token is not None
        await asyncio.to_thread(writer_idle, store)  # the send's commit let go of the writer's lock: logged
        await ns.complete("q", first.lock_token)
        assert store.logged_settlements == 1 and store._unsynced_since is not None
        await _checkpoint(store, ns)
        held = sqlite3.connect(path)
        try:
            rows = held.execute("SELECT sequence_number FROM message WHERE path = 'q'").fetchall()
        finally:
            held.close()
        assert sorted(seq for (seq,) in rows) == [2, 3]  # the completed one is gone from the file itself
        await _stop(store, ns)

    asyncio.run(go())
