"""What the SQLite store's writer thread costs a completion: applying the settlement log's records to the database,
the WAL checkpoint, the fsyncs of its sync, against itself the way it did it before session 25 (a checkpoint at
every sync), in one run.

The real store and broker in this process (no AMQP): a ``Namespace`` on a ``SqliteStore`` in a temporary
directory, ``--messages`` messages of the bench's kind (``amqp_send.bench_message``, bare or ``--shape
realistic``, as the SDK encodes them) sent in batches of 100; then received ``--batch`` at a time and completed
(each completion one settlement-log record, as ``serve`` confirms it), and after each batch the writer's sync
(``_make_durable`` itself: apply the records, checkpoint when due, fsync the WAL and the directory, empty the log)
run on this thread, timed in thread CPU, the records' application apart (a commit's own checkpoints are in it).
The writer thread is kept from syncing by itself meanwhile (``SETTLEMENT_SYNC_SECONDS``), so every record goes
through the timed sync. The two ways alternate, ``--repeat`` rounds each; printed: microseconds a completion a
phase, the best round of each way, and the ratio.

    python bench/settlement_apply.py [--messages 12000] [--batch 300] [--repeat 3] [--shape bare]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import amqp_floor as floor

from oncebus import Namespace, SqliteStore
from oncebus.amqp import codec
from oncebus.amqp.performatives import BATCH_MESSAGE_FORMAT
from oncebus.store import writer

PHASES = ("apply", "checkpoint and fsync")


WAYS = {"before": True, "now": False}  # name: a checkpoint at every sync


def one_round(count: int, batch: int, way: str, batches: list[bytes]) -> dict[str, float]:
    """Microseconds a completion of each phase of the writer's syncs (thread CPU), the ``way`` of :data:`WAYS`."""
    every_sync = WAYS[way]
    spent = dict.fromkeys(PHASES, 0.0)

    async def main(workdir: Path) -> None:
        store = SqliteStore(workdir / "oncebus.db")
        namespace = await Namespace.open(store)
        await namespace.create_queue("q", requires_duplicate_detection=True)
        for payload in batches:
            await namespace.send("q", codec.decode_transfer(payload, BATCH_MESSAGE_FORMAT))
        done = 0
        while done < count:
            got = await namespace.receive("q", batch, max_wait_time=0)
            if not got:
                raise RuntimeError(f"the queue gave {done} of the {count} messages sent")
            for message in got:
                assert message.lock_token is not None
                await namespace.complete("q", message.lock_token)
            done += len(got)
            sync(store)
        await namespace.close()
        store.close()

    def sync(store: SqliteStore) -> None:
        """The writer's own sync (``_make_durable``, under its lock), its records' application timed apart."""
        apply_logged = store._apply_logged
        applying = [0.0]

        def timed_apply() -> None:
            started = time.thread_time()
            apply_logged()
            applying[0] += time.thread_time() - started

        store._apply_logged = timed_apply  # type: ignore[method-assign]
        try:
            with store._lock:
                if every_sync:
                    store._checkpoint_due = True  # (before: every completion marked a checkpoint due)
                started = time.thread_time()
                store._make_durable()
                whole = time.thread_time() - started
        finally:
            del store._apply_logged
        spent["apply"] += applying[0]
        spent["checkpoint and fsync"] += whole - applying[0]

    with tempfile.TemporaryDirectory(prefix="oncebus-apply-") as workdir:
        asyncio.run(main(Path(workdir)))
    return {phase: seconds / count * 1e6 for phase, seconds in spent.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=12_000)
    parser.add_argument("--batch", type=int, default=300, help="completions between two syncs (default 300)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of each way, alternated (default 3)")
    parser.add_argument("--shape", choices=("bare", "realistic"), default="bare")
    args = parser.parse_args()
    writer.SETTLEMENT_SYNC_SECONDS = 3600.0  # the writer thread leaves every sync to the timed one
    batches = floor.sdk_batches(args.messages, "apply", args.shape)
    count = args.messages
    rounds: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
    for _ in range(args.repeat):
        for way in WAYS:
            measured = one_round(count, args.batch, way, batches)
            rounds[way].append(measured)
            print(f"  {way:6} {_row(measured)}", flush=True)
    best: dict[str, Any] = {way: min(r, key=lambda m: sum(m.values())) for way, r in rounds.items()}
    print(
        f"the writer's sync a completion ({count:,} {args.shape} messages, {args.batch} completions a sync; "
        f"best of {args.repeat}):"
    )
    print("  before (a checkpoint at every sync): " + _row(best["before"]))
    print("  now (the writer's commits checkpoint the WAL past 1,000 pages): " + _row(best["now"]))
    total = {way: sum(measured.values()) for way, measured in best.items()}
    print(f"  ratio now / before: {total['now'] / total['before']:.2f}")


def _row(measured: dict[str, float]) -> str:
    return ", ".join(f"{p} {measured[p]:.2f}" for p in PHASES) + f"; total {sum(measured.values()):.2f} us"


if __name__ == "__main__":
    main()
