"""Dedup index images: written at a clean shutdown, read in bulk at the next start, never trusted blindly.

The ``dedup_key`` rows stay the truth: an image serves only the start right after the clean shutdown
that wrote it; a crash after that start, a damaged or missing image, or a write that failed before the
shutdown all make the next start rebuild the index from the rows, with the same verdicts.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from pathlib import Path

import pytest

from oncebus.broker import ManualClock, Message, Namespace
from oncebus.store.sqlite import SqliteStore
from oncebus.store.sqlite_layout import SCHEMA_VERSION

T0 = 1_700_000_000_000_000
KEYS = 5_000  # more than one block of the index's log (4096 entries)


async def _open(path: Path, clock: ManualClock) -> tuple[SqliteStore, Namespace, bool]:
    store = SqliteStore(path)
    had_token = store._db.execute("SELECT count(*) FROM dedup_snapshot").fetchone()[0] == 1
    return store, await Namespace.open(store, clock), had_token


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


def test_a_clean_restart_reads_the_image_and_judges_as_before(tmp_path: Path) -> None:
    path = tmp_path / "oncebus.db"
    clock = ManualClock(T0)

    async def go() -> None:
        store, ns, _ = await _open(path, clock)
        await _fill(ns, clock)
        before = ns.stats("q").keys_held
        await _stop(store, ns)
        assert store.image_path.exists()

        store, ns, had_token = await _open(path, clock)
        assert had_token and store._db.execute("SELECT count(*) FROM dedup_snapshot").fetchone()[0] == 0
        assert ns.stats("q").keys_held == before == KEYS
        assert await _duplicates(ns, "q", ["k0", "k4999", "new"]) == [True, True, False]
        assert not (await _duplicates(ns, "off", ["k0"]))[0]
        # the window still counts from each key's first acceptance: k0..k499 were accepted at T0
        clock.advance(3600 - 10)
        assert await _duplicates(ns, "q", ["k1", "k600"]) == [False, True]
        await _stop(store, ns)

    asyncio.run(go())


def test_the_image_serves_one_start_only_a_crash_after_it_rebuilds_from_the_rows(tmp_path: Path) -> None:
    path = tmp_path / "oncebus.db"
    clock = ManualClock(T0)

    async def go() -> None:
        store, ns, _ = await _open(path, clock)
        await _fill(ns, clock)
        await _stop(store, ns)
        store, ns, had_token = await _open(path, clock)
        assert had_token
        assert await _duplicates(ns, "q", ["after-image"]) == [False]
        await ns.delete_queue("q")  # and made again: none of the image's keys may come back
        await ns.create_queue("q", requires_duplicate_detection=True, duplicate_detection_history_time_window="PT1H")
        assert await _duplicates(ns, "q", ["again"]) == [False]
        _crash(store)

        store, ns, had_token = await _open(path, clock)
        assert not had_token
        assert await _duplicates(ns, "q", ["again", "k0", "after-image"]) == [True, False, False]
        await _stop(store, ns)

    asyncio.run(go())


@pytest.mark.parametrize("damage", ["flipped", "truncated", "missing"])
def test_a_damaged_or_missing_image_is_not_trusted(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "oncebus.db"
    clock = ManualClock(T0)

    async def go() -> None:
        store, ns, _ = await _open(path, clock)
        await _fill(ns, clock)
        await _stop(store, ns)
        image = store.image_path
        data = bytearray(image.read_bytes())
        if damage == "flipped":
            data[len(data) // 3] ^= 0x40  # inside the log's blocks: only the checksum can tell
            image.write_bytes(bytes(data))
        elif damage == "truncated":
            image.write_bytes(bytes(data[: len(data) - 100]))
        else:
            image.unlink()
        with caplog.at_level(logging.WARNING, logger="oncebus.broker"):
            store, ns, had_token = await _open(path, clock)
        assert had_token
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
        store, ns, _ = await _open(path, clock)
        await _fill(ns, clock)
        if when.startswith("before"):
            store.failures += 1
        await ns.close()
        if when.startswith("after"):
            store.failures += 1
        store.close()
        assert store._db_identity is not None and not store.image_path.exists()
        store, ns, had_token = await _open(path, clock)
        assert not had_token
        assert await _duplicates(ns, "q", ["k0", "new"]) == [True, False]
        await _stop(store, ns)

    asyncio.run(go())


def test_a_schema_3_directory_opens_and_keeps_its_keys(tmp_path: Path) -> None:
    """Schema 3 is schema 4 without the ``dedup_snapshot`` table (and never an image)."""
    path = tmp_path / "oncebus.db"
    clock = ManualClock(T0)

    async def write() -> None:
        store, ns, _ = await _open(path, clock)
        await _fill(ns, clock)
        _crash(store)

    asyncio.run(write())
    db = sqlite3.connect(path)
    db.execute("DROP TABLE dedup_snapshot")
    db.execute("PRAGMA user_version = 3")
    db.commit()
    db.close()

    async def read() -> None:
        store, ns, had_token = await _open(path, clock)
        assert not had_token
        assert store._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
        assert ns.stats("q").keys_held == KEYS
        assert await _duplicates(ns, "q", ["k0", "k4999", "new"]) == [True, True, False]
        await _stop(store, ns)
        store, ns, had_token = await _open(path, clock)  # and from now on with images
        assert had_token and await _duplicates(ns, "q", ["new"]) == [True]
        await _stop(store, ns)

    asyncio.run(read())


def test_a_key_accepted_again_is_rebuilt_from_its_latest_row(tmp_path: Path) -> None:
    """A key resent after it left the window has two rows until pruning; rebuilt from the rows (in the primary
    key's order, no sort), the later acceptance is the one held, also when a longer window covers both."""
    path = tmp_path / "oncebus.db"
    clock = ManualClock(T0)

    async def go() -> None:
        store, ns, _ = await _open(path, clock)
        await ns.create_queue("q", requires_duplicate_detection=True, duplicate_detection_history_time_window="PT1M")
        assert await _duplicates(ns, "q", ["k"]) == [False]
        clock.advance(61)
        assert await _duplicates(ns, "q", ["k"]) == [False]  # accepted again: a second row, at T0 + 61 s
        await ns.update_queue("q", duplicate_detection_history_time_window="PT1H")
        _crash(store)
        store, ns, had_token = await _open(path, clock)
        assert not had_token and ns.stats("q").keys_held == 1
        clock.advance(3600 - 61 + 30)  # the first row's window has passed, the second's not
        assert await _duplicates(ns, "q", ["k"]) == [True]
        await _stop(store, ns)

    asyncio.run(go())


def test_an_image_that_cannot_be_written_leaves_no_token_and_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "oncebus.db"
    clock = ManualClock(T0)

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    async def go() -> None:
        store, ns, _ = await _open(path, clock)
        await _fill(ns, clock)
        await ns.close()
        with monkeypatch.context() as patch, caplog.at_level(logging.WARNING, logger="oncebus.store"):
            patch.setattr("oncebus.store.dedup_images.os.fsync", full)
            store.close()
        assert "could not write the dedup index images" in caplog.text
        assert sorted(p.name for p in tmp_path.iterdir() if "dedup" in p.name) == []
        store, ns, had_token = await _open(path, clock)
        assert not had_token and await _duplicates(ns, "q", ["k0", "new"]) == [True, False]
        await _stop(store, ns)

    asyncio.run(go())
