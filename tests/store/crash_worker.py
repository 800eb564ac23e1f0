"""A process that uses the broker on SQLite, for the crash test (run with ``python -m tests.store.crash_worker``).

Modes:
  send DB START END CONCURRENCY   send ids START..END-1 from CONCURRENCY tasks; print "ACK <id>" after each ack
  drain DB                        receive and complete everything; print "GOT <id>" each, then "DRAINED", then idle
"""

from __future__ import annotations

import asyncio
import sys

from oncebus.broker import Message, Namespace, SystemClock
from oncebus.core.errors import EntityAlreadyExistsError
from oncebus.store.sqlite import SqliteStore


async def _open(db: str) -> Namespace:
    ns = await Namespace.open(SqliteStore(db), SystemClock())
    try:
        await ns.create_queue("orders", requires_duplicate_detection=True)
    except EntityAlreadyExistsError:
        pass
    return ns


async def send(db: str, start: int, end: int, concurrency: int) -> None:
    ns = await _open(db)
    ids = iter(range(start, end))

    async def worker() -> None:
        for i in ids:
            await ns.send("orders", Message(f"body {i}".encode(), message_id=f"id-{i}"))
            sys.stdout.write(f"ACK {i}\n")
            sys.stdout.flush()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    print("DONE", flush=True)
    await asyncio.sleep(3600)


async def drain(db: str) -> None:
    ns = await _open(db)
    while got := await ns.receive("orders", 500):
        for m in got:
            await ns.complete("orders", m.lock_token)  # type: ignore[arg-type]
            sys.stdout.write(f"GOT {m.message_id}\n")
    print("DRAINED", flush=True)
    await asyncio.sleep(3600)


if __name__ == "__main__":
    mode, db, *rest = sys.argv[1:]
    if mode == "send":
        asyncio.run(send(db, int(rest[0]), int(rest[1]), int(rest[2])))
    else:
        asyncio.run(drain(db))
