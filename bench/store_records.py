"""What the store's records cost per stored message copy: schema 6 (content once per encoding) against schema 5.

The hot-path issue's design item 3 asks for one stored record per transfer instead of two rows per message
(schema 5: ``message`` + ``message_data``, every subscription copy holding its own copy of the wire bytes).
Schema 6 stores a unit's content once per distinct encoding (``content``, reference counted; a topic's copies
share their sender's wire) and one ``message`` row per message and copy carrying its meta and addressing its
content. Four ways to store the same sends, on SQLite with the pragmas ``oncebus serve`` uses (WAL,
``synchronous=FULL``, one transaction and fsync per unit):

- ``store``: ``SqliteStore.submit`` (schema 6) of the ops the broker writes (a ``PutMessage`` per message
  and per subscription copy, with its dedup key), as ``oncebus serve`` commits them;
- ``rows-5``: schema 5's rows written by plain ``sqlite3`` (no writer thread, no ops): the old layout's floor;
- ``rows-6``: schema 6's rows the same way (one content row per distinct wire of the unit): its floor;
- ``transfer``: all of a unit's wires concatenated in one content row, each message addressing its slice
  (the alternative schema 6 did not take: see the ratios).

Printed: process CPU per stored message copy for each, and the ratios. A queue (1 copy per message) and a
topic with 10 subscriptions (10 copies) are measured.

    python bench/store_records.py                  # about 20 s
    python bench/store_records.py --batches 200 --batch 100
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from oncebus.core.messages import StoredMessage
from oncebus.store.base import Op, PutMessage
from oncebus.store.sqlite import SqliteStore
from oncebus.store.sqlite_layout import (
    INSERT_DATA,
    INSERT_KEY,
    INSERT_MESSAGE_V5,
    MESSAGE_STATEMENTS_V5,
    SCHEMA,
    ContentRows,
    create,
    message_rows,
)

BODY = b"x" * 1024
START_US = 1_800_000_000_000_000


def _wire(i: int) -> bytes:
    # an AMQP message: properties (message-id) then one data section, as the SDK encodes it
    mid = f"m-{i:08d}".encode()
    props = b"\x00\x53\x73\xc0" + bytes((len(mid) + 3, 1, 0xA1, len(mid))) + mid
    return props + b"\x00\x53\x75\xb0" + len(BODY).to_bytes(4, "big") + BODY


def _records(batch: int, first: int, copies: int) -> list[tuple[StoredMessage, tuple[str, str, int] | None]]:
    out = []
    for i in range(first, first + batch):
        wire = _wire(i)
        for c in range(copies):
            path = "q" if copies == 1 else f"t/subscriptions/s{c}"
            record = StoredMessage(path, i + 1, f"m-{i:08d}", BODY, START_US + i, None, wire=wire)
            key = (path.split("/")[0], f"m-{i:08d}", START_US + i) if c == 0 else None
            out.append((record, key))
    return out


def _via_store(directory: Path, batches: int, batch: int, copies: int) -> float:
    store = SqliteStore(directory / "store.db")
    store.load()
    units = [
        [PutMessage(r, k) for r, k in _records(batch, b * batch, copies)]  # type: ignore[arg-type]
        for b in range(batches)
    ]
    started = time.process_time()
    for unit in units:
        ops: list[Op] = list(unit)
        store.submit(ops).result()
    spent = time.process_time() - started
    store.close()
    return spent


def _connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    return db


def _via_rows_5(directory: Path, batches: int, batch: int, copies: int) -> float:
    """Schema 5's layout, without the store's machinery."""
    db = _connect(directory / "rows.db")
    db.executescript(SCHEMA + "".join(statement + ";\n" for statement in MESSAGE_STATEMENTS_V5))
    units = [_records(batch, b * batch, copies) for b in range(batches)]
    data_id = 0
    started = time.process_time()
    for unit in units:
        db.execute("BEGIN")
        lights, datas, keys = [], [], []
        for record, key in unit:
            data_id += 1
            light, data = message_rows(record, data_id)
            lights.append(light)
            datas.append(data)
            if key is not None:
                keys.append((key[0], key[2], key[1]))
        db.executemany(INSERT_DATA, datas)
        db.executemany(INSERT_MESSAGE_V5, lights)
        db.executemany(INSERT_KEY, keys)
        db.execute("COMMIT")
    spent = time.process_time() - started
    db.close()
    return spent


def _via_rows_6(directory: Path, batches: int, batch: int, copies: int) -> float:
    """Schema 6's layout, without the store's machinery."""
    db = _connect(directory / "rows6.db")
    create(db)
    units = [_records(batch, b * batch, copies) for b in range(batches)]
    next_id = 0
    started = time.process_time()
    for unit in units:
        db.execute("BEGIN")
        rows = ContentRows(next_id)
        keys = []
        for record, key in unit:
            rows.add(record)
            if key is not None:
                keys.append((key[0], key[2], key[1]))
        rows.flush(db)
        next_id = rows.next_id
        db.executemany(INSERT_KEY, keys)
        db.execute("COMMIT")
    spent = time.process_time() - started
    db.close()
    return spent


_TRANSFER_SCHEMA = """
CREATE TABLE transfer (id INTEGER PRIMARY KEY, payload BLOB NOT NULL, live INTEGER NOT NULL);
CREATE TABLE message (
    path TEXT NOT NULL, sequence_number INTEGER NOT NULL, state INTEGER NOT NULL, delivery_count INTEGER NOT NULL,
    enqueued_time_us INTEGER NOT NULL, expires_at_us INTEGER, size INTEGER NOT NULL, session_id TEXT,
    transfer_id INTEGER NOT NULL, wire_offset INTEGER NOT NULL, wire_length INTEGER NOT NULL, meta TEXT NOT NULL,
    PRIMARY KEY (path, sequence_number)) WITHOUT ROWID;
CREATE TABLE dedup_key (entity TEXT NOT NULL, first_accepted_us INTEGER NOT NULL, key TEXT NOT NULL,
    PRIMARY KEY (entity, first_accepted_us, key)) WITHOUT ROWID;
"""


def _via_transfer(directory: Path, batches: int, batch: int, copies: int) -> float:
    """One content row per unit (its wires concatenated), message rows addressing their slice of it."""
    db = _connect(directory / "transfer.db")
    db.executescript(_TRANSFER_SCHEMA)
    units = [_records(batch, b * batch, copies) for b in range(batches)]
    started = time.process_time()
    for transfer_id, unit in enumerate(units, 1):
        db.execute("BEGIN")
        wires: dict[int, tuple[int, int]] = {}
        parts: list[bytes] = []
        offset = 0
        lights, keys = [], []
        for record, key in unit:
            wire = record.wire or b""
            place = wires.get(id(wire))
            if place is None:  # a topic's copies share their sender's bytes
                place = wires[id(wire)] = (offset, len(wire))
                parts.append(wire)
                offset += len(wire)
            lights.append(
                (
                    record.path,
                    record.sequence_number,
                    int(record.state),
                    record.delivery_count,
                    record.enqueued_time_us,
                    record.expires_at_us,
                    record.size,
                    record.session_id,
                    transfer_id,
                    place[0],
                    place[1],
                    record.meta_json(),
                )
            )
            if key is not None:
                keys.append((key[0], key[2], key[1]))
        db.execute("INSERT INTO transfer VALUES (?, ?, ?)", (transfer_id, b"".join(parts), len(lights)))
        db.executemany("INSERT INTO message VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", lights)
        db.executemany("INSERT INTO dedup_key VALUES (?, ?, ?)", keys)
        db.execute("COMMIT")
    spent = time.process_time() - started
    db.close()
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=100, help="sends (transactions) per measurement")
    parser.add_argument("--batch", type=int, default=100, help="messages per send")
    args = parser.parse_args()
    ways: dict[str, Callable[[Path, int, int, int], float]] = {
        "store": _via_store,
        "rows-5": _via_rows_5,
        "rows-6": _via_rows_6,
        "transfer": _via_transfer,
    }
    print(f"{args.batches} sends of {args.batch} x 1 KiB messages; process CPU per stored message copy")
    for copies, what in ((1, "queue"), (10, "topic, 10 subscriptions")):
        results: dict[str, float] = {}
        for name, way in ways.items():
            with tempfile.TemporaryDirectory() as tmp:
                spent = way(Path(tmp), args.batches, args.batch, copies)
            results[name] = spent / (args.batches * args.batch * copies) * 1e6
        print(f"  {what}:")
        for name, us in results.items():
            print(f"    {name:<9} {us:7.2f} us")
        print(f"    ratio store (6) / rows-5:   {results['store'] / results['rows-5']:.2f}")
        print(f"    ratio rows-6 / rows-5:      {results['rows-6'] / results['rows-5']:.2f}")
        print(f"    ratio transfer / rows-6:    {results['transfer'] / results['rows-6']:.2f}")


if __name__ == "__main__":
    main()
