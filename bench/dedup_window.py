"""Does the window size cost throughput? One run, printing ratios measured side by side.

1. Dedup checks per second: a 20 s window holding about 1,000 keys versus a
   7-day window holding 10 million keys (same mix of new keys and resends).
2. Bytes per held key of the index (its arrays' exact sizes).
3. Committed sends per second through the SQLite store, duplicate detection
   on versus off (concurrent senders sharing group commits).

    python bench/dedup_window.py            # full run (about 2-3 minutes)
    python bench/dedup_window.py --quick    # 1 M keys instead of 10 M
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from oncebus.broker import Message, Namespace, SystemClock
from oncebus.core.dedup import DedupIndex
from oncebus.server.runtime import tune_gc
from oncebus.store.sqlite import SqliteStore

S = 1_000_000


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def fill(index: DedupIndex, keys: int, step_us: int) -> int:
    now = 0
    for i in range(keys):
        index.judge(f"fill-{i}", now)
        now += step_us
    return now


def measure_checks(index: DedupIndex, start_us: int, step_us: int, checks: int, recent: int, seed: int) -> float:
    """A steady stream: every other check is a resend of a recently sent key, the rest are new keys."""
    rng = random.Random(seed)
    keys = []
    now = start_us
    sent: list[str] = []
    for i in range(checks):
        if i % 2 and sent:
            keys.append(sent[-1 - rng.randrange(min(len(sent), recent))])
        else:
            key = f"new-{seed}-{i}"
            sent.append(key)
            keys.append(key)
    judge = index.judge
    began = time.perf_counter()
    for key in keys:
        judge(key, now)
        now += step_us
    return checks / (time.perf_counter() - began)


async def _send_rates(db: Path, messages: int, senders: int, rounds: int) -> tuple[list[float], list[float]]:
    """Alternate rounds on two long-lived queues (dedup on, dedup off) of one running broker.

    A warm-up round per queue is not counted, so both are measured in steady state (the
    index has grown to its size; SQLite's pages are warm), as in a broker that has been up.
    """
    store = SqliteStore(db)
    ns = await Namespace.open(store, SystemClock())
    tune_gc()  # as `oncebus serve` does
    for name, dedup in (("q-on", True), ("q-off", False)):
        # the Standard tier's largest queue without partitioning (an 80 GB one needs partitioning, which would change
        # the dedup key); the sends measured take far less
        await ns.create_queue(name, requires_duplicate_detection=dedup, max_size_in_megabytes=5120)
    body = os.urandom(1024)
    counter = {"q-on": 0, "q-off": 0}

    async def one_round(name: str) -> float:
        start = counter[name]
        counter[name] += messages
        ids = iter(range(start, start + messages))

        async def sender() -> None:
            for i in ids:  # the message an application sends: subject, content type, correlation id, properties
                await ns.send(
                    name,
                    Message(
                        body,
                        message_id=f"{name}-{i}",
                        subject="order-created",
                        content_type="application/json",
                        correlation_id=f"corr-{i}",
                        application_properties={"tenant": "contoso", "attempt": 1, "priority": True, "amount": 9.5},
                    ),
                )

        began = time.perf_counter()
        await asyncio.gather(*(sender() for _ in range(senders)))
        return messages / (time.perf_counter() - began)

    await one_round("q-on")
    await one_round("q-off")
    on, off = [], []
    for _ in range(rounds):
        off.append(await one_round("q-off"))
        on.append(await one_round("q-on"))
    await ns.close()
    store.close()
    return on, off


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="1 M keys held instead of 10 M")
    parser.add_argument("--keys", type=int, help="keys held in the 7-day window (overrides --quick)")
    parser.add_argument("--checks", type=int, default=500_000)
    parser.add_argument("--sends", type=int, default=20_000)
    parser.add_argument("--senders", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    big = args.keys if args.keys is not None else 1_000_000 if args.quick else 10_000_000
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores")

    small = DedupIndex(timedelta(seconds=20), recently_expired_capacity=0)
    small_step = 20 * S // 1000  # one send every 20 ms: about 1,000 keys held in a 20 s window
    small_now = fill(small, 1000, small_step)
    small_step //= 2  # while measuring, every other check is a resend: still one new key every 20 ms
    large = DedupIndex(timedelta(days=7), recently_expired_capacity=0)
    t0 = time.perf_counter()
    rss0 = _rss_mb()
    large_now = fill(large, big, 1)
    print(
        f"filled the 7-day index with {len(large):,} keys in {time.perf_counter() - t0:.1f} s "
        f"(peak RSS grew {(_rss_mb() - rss0):,.0f} MB)"
    )

    rates_small, rates_large = [], []
    for round_ in range(3):  # alternate to share the machine's noise
        rates_small.append(measure_checks(small, small_now, small_step, args.checks, 500, round_))
        small_now += small_step * args.checks
        rates_large.append(measure_checks(large, large_now, 1, args.checks, 500, round_))
        large_now += args.checks
    rs, rl = max(rates_small), max(rates_large)
    print(f"checks/s  20 s window, {len(small):,} keys held:    {rs:,.0f}")
    print(f"checks/s  7-day window, {len(large):,} keys held: {rl:,.0f}")
    print(f"ratio large/small window: {rl / rs:.3f}   (goal >= 0.9)")
    print(f"bytes per held key (7-day index): {large.nbytes() / len(large):.1f}   (goal <= 48)")

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.db"
        on, off = asyncio.run(_send_rates(db, args.sends, args.senders, args.rounds))
        print("rounds (off, on):", ", ".join(f"({a:,.0f}, {b:,.0f})" for a, b in zip(off, on, strict=True)))
        print(
            f"committed sends/s via SQLite (synchronous=FULL), {args.senders} concurrent senders, 1 KiB bodies, "
            f"median of {args.rounds}: dedup on {statistics.median(on):,.0f}, off {statistics.median(off):,.0f}"
        )
        ratios = [a / b for a, b in zip(on, off, strict=True)]
        print(
            f"ratio dedup on/off: median of rounds {statistics.median(ratios):.3f}, "
            f"of medians {statistics.median(on) / statistics.median(off):.3f}   (goal >= 0.9)"
        )


if __name__ == "__main__":
    main()
