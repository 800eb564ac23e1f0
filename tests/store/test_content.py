"""Schema 6: a unit's content is stored once per distinct encoding (a topic's subscription copies share their
sender's wire bytes) and goes with the last message that holds it."""

from __future__ import annotations

import gc
import sqlite3
from pathlib import Path

from oncebus.core.messages import MessageState, StoredMessage
from oncebus.store.base import DeleteEntity, DeleteMessage, MoveMessage, PutMessage, UpdateMessage
from oncebus.store.sqlite import SqliteStore

T0 = 1_700_000_000_000_000
BODY = b"body \x00 bytes"
WIRE = b"\x00\x53\x73\xc0\x06\x01\xa1\x03m-1" + b"\x00\x53\x75\xb0" + len(BODY).to_bytes(4, "big") + BODY


def _contents(store: SqliteStore) -> list[tuple[int, int]]:
    return [(len(data), refs) for data, refs in store._db.execute("SELECT data, refs FROM content ORDER BY id")]


def test_subscription_copies_share_one_content_row_released_by_each_of_them(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "oncebus.db")
    store.load()
    copies = [f"t/subscriptions/s{i}" for i in range(4)]
    store.submit(
        [PutMessage(StoredMessage(p, 1, "m-1", BODY, T0, None, wire=WIRE), None) for p in copies]
        + [PutMessage(StoredMessage("q", 1, "m-2", b"alone", T0, None), None)]
    ).result()
    assert _contents(store) == [(len(WIRE), 4), (5, 1)]  # one row for the four copies, one for the queue's
    # abandon with properties: the copy's own meta changes, not its siblings'
    store.submit([UpdateMessage(copies[0], 1, int(MessageState.ACTIVE), 1, {"why": "retry"})]).result()
    store.submit(
        [MoveMessage(copies[1], 1, copies[1] + "/$deadletterqueue", int(MessageState.DEAD_LETTERED), "r", "d")]
    ).result()
    assert _contents(store)[0] == (len(WIRE), 4)  # a dead-letter move keeps it
    read = {p: store.read_messages(p, [1])[1] for p in (copies[0], copies[1] + "/$deadletterqueue", copies[2])}
    assert read[copies[0]].application_properties == {"why": "retry"}
    assert read[copies[2]].application_properties == {}
    assert all((m.body, m.wire) == (BODY, WIRE) for m in read.values())
    assert read[copies[1] + "/$deadletterqueue"].dead_letter_reason == "r"

    store.submit([DeleteMessage(copies[0], 1)]).result()  # complete one copy
    assert _contents(store)[0] == (len(WIRE), 3)
    store.submit([DeleteEntity("t/subscriptions/s2")]).result()  # delete a subscription with its copy
    assert _contents(store)[0] == (len(WIRE), 2)
    store.submit([DeleteMessage(copies[1] + "/$deadletterqueue", 1), DeleteMessage("q", 1)]).result()
    assert _contents(store) == [(len(WIRE), 1)]
    store.submit([DeleteMessage(copies[3], 1)]).result()  # the last copy takes the content with it
    assert _contents(store) == []
    store.close()


def test_a_message_written_again_releases_its_former_content_and_ids_go_on_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "oncebus.db"
    store = SqliteStore(path)
    store.load()
    store.submit([PutMessage(StoredMessage("q", 1, "m-1", BODY, T0, None, wire=WIRE), None)]).result()
    store.submit([PutMessage(StoredMessage("q", 1, "m-1", b"other", T0, None), None)]).result()  # same row again
    assert _contents(store) == [(5, 1)]
    store.close()
    store = SqliteStore(path)
    store.load()
    store.submit([PutMessage(StoredMessage("q", 2, "m-2", BODY, T0, None, wire=WIRE), None)]).result()
    assert _contents(store) == [(5, 1), (len(WIRE), 1)]
    assert store.read_messages("q", [1, 2])[2].wire == WIRE and store.read_messages("q", [1])[1].body == b"other"
    store.close()


def test_a_deleted_messages_bytes_are_zeroed_in_the_page_that_keeps_its_neighbours(tmp_path: Path) -> None:
    """``secure_delete=FAST``: a completed message's body and meta do not linger in a database page that is written
    anyway (its neighbours stay on it), whatever the SQLite build's default (Debian's zeroes freed pages too, others
    nothing)."""
    store = SqliteStore(tmp_path / "oncebus.db")
    store.load()
    secret, kept = b"completed-secret-" * 4, b"still-queued-body-" * 4
    store.submit(
        [
            PutMessage(StoredMessage("q", 1, "id-of-the-secret", secret, T0, None), None),
            PutMessage(StoredMessage("q", 2, "id-still-queued", kept, T0, None), None),
        ]
    ).result()
    store.submit([DeleteMessage("q", 1)]).result()
    store.close()
    gc.collect()  # (the unread start-up snapshot's row readers hold a read transaction until collected)
    db = sqlite3.connect(tmp_path / "oncebus.db")  # the WAL's pages into the database file, and the WAL emptied
    assert db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0  # not busy: all of it
    db.close()
    data = (tmp_path / "oncebus.db").read_bytes()
    assert kept in data and b"id-still-queued" in data  # the page was written with its neighbour on it
    assert secret not in data and b"id-of-the-secret" not in data
