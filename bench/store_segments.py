"""What a segment log would save the store's writer: the message content in SQLite rows (the store's layout now)
against the same content appended to a segment file, SQLite keeping only the message and key rows. A mimic in
plain ``sqlite3``, not the store: no writer thread, no ops, no broker.

Both ways use the store's own statements and pragmas (``store.sqlite_layout``'s message and content tables, the
trigger that releases a content row, WAL, ``synchronous=FULL``, the store's page size and ``secure_delete``) and
the realistic message's size (a 1,160-byte wire). A send is a batch of ``--batch`` messages, each with its dedup
key, in one transaction; the segment way first appends the batch's wires to its file with one ``write`` and
``fdatasync``s it (a row must not name bytes a crash could lose), then commits the rows, which address their bytes
by offset. Then every message is deleted, ``--deletes`` a transaction, as the writer applies completions (the
segment way deletes only the rows: a segment file would go whole once none of its messages is left, not counted
here, nor the compaction of a segment a few old messages keep alive).

Printed: CPU a message (``process_time``) of the sends and of the deletions, each way, per round and the best,
and the ratios segment / rows.

Usage: ``python bench/store_segments.py [--messages 20000] [--batch 100] [--deletes 500] [--repeat 3]``
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import tempfile
import time
from pathlib import Path

from oncebus.store import sqlite as store
from oncebus.store import sqlite_layout as layout

WIRE = os.urandom(1160)  # the realistic message's wire: 1 KiB body, subject, ids, four application properties
META = '{"message_id":"m","ap":[66,126],"pr":[3,63]}'  # what meta_json writes for it
KEYS = (
    "CREATE TABLE dedup_key (entity TEXT NOT NULL, first_accepted_us INTEGER NOT NULL, key TEXT NOT NULL,"
    " PRIMARY KEY (entity, first_accepted_us, key)) WITHOUT ROWID"
)
INSERT_KEY = "INSERT INTO dedup_key (entity, first_accepted_us, key) VALUES ('q', ?, ?)"
# the segment way's message row: where its wire is in the segment instead of a content row
INSERT_IN_SEGMENT = (
    "INSERT INTO message (path, sequence_number, state, delivery_count, enqueued_time_us, expires_at_us, size,"
    " session_id, content_id, segment_offset, dead_letter_reason, dead_letter_error_description, dead_letter_source,"
    " meta, wire_length, body_offset, body_length)"
    " VALUES ('q', ?, 0, 0, ?, NULL, 1200, NULL, 1, ?, NULL, NULL, NULL, ?, 1160, 134, 1024)"
)


def _database(workdir: Path, segments: bool) -> sqlite3.Connection:
    db = sqlite3.connect(workdir / "store.db", isolation_level=None)
    db.execute(f"PRAGMA page_size={store.PAGE_SIZE}")
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute(f"PRAGMA secure_delete={store.SECURE_DELETE}")
    message_table, content_table, trigger = layout.MESSAGE_STATEMENTS
    if segments:
        db.execute(
            message_table.replace(
                "content_id INTEGER NOT NULL,", "content_id INTEGER NOT NULL, segment_offset INTEGER,"
            )
        )
    else:
        for statement in (message_table, content_table, trigger):
            db.execute(statement)
    db.execute(KEYS)
    return db


def one_round(messages: int, batch: int, deletes: int, segments: bool) -> tuple[float, float]:
    """CPU seconds a message of the sends and of the deletions, one way."""
    with tempfile.TemporaryDirectory(prefix="oncebus-segments-") as tmp:
        workdir = Path(tmp)
        db = _database(workdir, segments)
        segment = os.open(workdir / "segment-1", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600) if segments else -1
        try:
            started, offset = time.process_time(), 0
            for first in range(1, messages + 1, batch):
                numbers = range(first, min(messages, first + batch - 1) + 1)
                db.execute("BEGIN")
                if segments:
                    os.write(segment, WIRE * len(numbers))
                    os.fdatasync(segment)
                    db.executemany(INSERT_IN_SEGMENT, [(n, n, offset + (n - first) * len(WIRE), META) for n in numbers])
                    offset += len(WIRE) * len(numbers)
                else:
                    db.executemany(layout.INSERT_CONTENT, [(n, WIRE, 1) for n in numbers])
                    db.executemany(
                        layout.INSERT_NEW_MESSAGE, [("q", n, n, 1200, n, META, len(WIRE), 134, 1024) for n in numbers]
                    )
                db.executemany(INSERT_KEY, [(n, f"key-{n}") for n in numbers])
                db.execute("COMMIT")
            sent = (time.process_time() - started) / messages
            started = time.process_time()
            for first in range(1, messages + 1, deletes):
                db.execute("BEGIN")
                numbers = range(first, min(messages, first + deletes - 1) + 1)
                db.executemany(layout.DELETE_MESSAGE, [("q", n) for n in numbers])
                db.execute("COMMIT")
            deleted = (time.process_time() - started) / messages
            assert db.execute("SELECT count(*) FROM message").fetchone()[0] == 0
        finally:
            db.close()
            if segment >= 0:
                os.close(segment)
    return sent, deleted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=100, help="messages a send (default 100)")
    parser.add_argument("--deletes", type=int, default=500, help="deletions a transaction (default 500)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"load {os.getloadavg()[0]:.2f}; {args.messages} messages of {len(WIRE)} bytes, sends of {args.batch}")
    best: dict[str, tuple[float, float]] = {}
    for r in range(args.repeat):
        for segments in (False, True) if r % 2 == 0 else (True, False):
            name = "segment log" if segments else "content rows"
            sent, deleted = one_round(args.messages, args.batch, args.deletes, segments)
            print(f"round {r} {name:12}: send {sent * 1e6:5.2f} us/msg, delete {deleted * 1e6:5.2f} us/msg")
            old = best.get(name)
            best[name] = (sent, deleted) if old is None else (min(old[0], sent), min(old[1], deleted))
    rows, log = best["content rows"], best["segment log"]
    for name, (sent, deleted) in best.items():
        print(f"best {name:12}: send {sent * 1e6:5.2f} us/msg, delete {deleted * 1e6:5.2f} us/msg")
    print(f"ratio segment log / content rows: send {log[0] / rows[0]:.2f}, delete {log[1] / rows[1]:.2f}")


if __name__ == "__main__":
    main()
