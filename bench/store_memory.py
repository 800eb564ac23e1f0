"""Where a held message's bytes go: the broker's memory per waiting message, by the line that allocated it.

One run, printed (never asserted). A namespace on a SQLite store in a temporary directory (in this process,
no AMQP), one queue with duplicate detection; ``--messages`` sends of 1 KiB bodies in batches of 100, each
with a unique message id: the bare message (an id only), then the realistic one (a subject, a content type, a
correlation id and four application properties), each in a store of its own. ``tracemalloc`` compares the memory
before and after the sends, with the content cache of recent messages (bounded at 64 MB, see broker/contents.py)
emptied first, so what is left is what grows with the backlog: per message, grouped by the allocating line, and
the Python objects of one held message measured on their own.

    python bench/store_memory.py --messages 100000 [--shape bare|realistic]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import tempfile
import tracemalloc
import uuid
from pathlib import Path

from oncebus.broker import ManualClock, Namespace
from oncebus.core.messages import Message
from oncebus.store.sqlite import SqliteStore


def deep_size(obj: object, seen: set[int]) -> int:
    """The bytes of ``obj`` and what its slots hold (each object once)."""
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    for name in getattr(type(obj), "__slots__", ()):
        value = getattr(obj, name, None)
        if value is not None and not isinstance(value, bool):
            size += deep_size(value, seen)
    return size


def _message(body: bytes, shape: str) -> Message:
    if shape == "bare":
        return Message(body=body, message_id=str(uuid.uuid4()))
    return Message(
        body=body,
        message_id=str(uuid.uuid4()),
        subject="order-created",
        content_type="application/json",
        correlation_id=f"corr-{uuid.uuid4()}",
        application_properties={"tenant": "contoso", "attempt": 1, "priority": True, "amount": 9.5},
    )


async def fill(messages: int, directory: Path, shape: str) -> None:
    store = SqliteStore(directory / "oncebus.db")
    namespace = await Namespace.open(store, ManualClock())
    try:
        await namespace.create_queue("q", requires_duplicate_detection=True)
        body = b"x" * 1024
        await namespace.send("q", [_message(body, shape)])  # warm up
        namespace._contents.clear()
        gc.collect()
        tracemalloc.start(3)
        before = tracemalloc.take_snapshot()
        for start in range(0, messages, 100):
            batch = [_message(body, shape) for _ in range(min(100, messages - start))]
            await namespace.send("q", batch)
            namespace._contents.clear()
        gc.collect()
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        stats = after.compare_to(before, "lineno")
        total = sum(s.size_diff for s in stats)
        print(f"{messages:,} {shape} messages held: {total / messages:.0f} bytes per message (Python allocations)")
        for stat in stats[:12]:
            if stat.size_diff < messages:  # less than a byte a message
                break
            frame = stat.traceback[0]
            where = f"{Path(frame.filename).parent.name}/{Path(frame.filename).name}:{frame.lineno}"
            print(f"  {stat.size_diff / messages:6.1f} B/msg  {stat.count_diff / messages:5.2f} blocks/msg  {where}")
        receivable = namespace._registry.receivable_by_path("q")
        assert receivable is not None
        held = receivable.messages
        columns = sum(
            sys.getsizeof(column) for column in (held.run.seqs, held.run.enqueued, held.run.sizes, held.run.counts)
        )
        entry = next(iter(held.values()))
        print(
            f"held as columns: {held.run.live:,} of {len(held):,} messages, "
            f"{columns / max(held.run.live, 1):.1f} bytes a message; as objects: {len(held.entries):,}, "
            "an Entry with what its slots hold "
            f"{deep_size(entry, set())} bytes ({sys.getsizeof(entry)} the object itself)"
        )
        index = namespace._registry.entities["q"].detector.index
        print(f"the dedup index's held keys: {index.nbytes() / messages:.1f} bytes a key")
    finally:
        await namespace.close()
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000, help="messages sent (default 100000)")
    parser.add_argument("--shape", choices=("bare", "realistic"), help="only this message (default: both)")
    args = parser.parse_args()
    for shape in [args.shape] if args.shape else ["bare", "realistic"]:
        with tempfile.TemporaryDirectory(prefix="oncebus-memory-") as directory:
            asyncio.run(fill(args.messages, Path(directory), shape))


if __name__ == "__main__":
    main()
