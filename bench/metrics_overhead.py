"""One run: send throughput with a Prometheus scraper hitting /metrics every second versus without.

The broker (Namespace on SQLite, synchronous=FULL) and the observe app (uvicorn) share
one event loop, as in ``oncebus serve``. Concurrent senders on that loop send batches
with unique message ids round-robin to dedup-enabled queues (and topics with three
subscriptions each) for a fixed time; a separate scraper process GETs /metrics once a
second (``scrape`` rounds), or /metrics and /api/dashboard once a second each (``scrape
+ dashboard`` rounds: a browser tab left open). Rounds alternate so drift hits every
mode alike; the median round of each mode is compared.

Prints (never asserts) every round, then ``ratio scrape / none`` (the issue asks >= 0.95).

Usage: ``python bench/metrics_overhead.py [--seconds 8] [--repeat 3] [--queues 20] [--topics 5] [--senders 16]``
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import uvicorn

from oncebus.broker import Message, Namespace, ServiceBusReceiveMode
from oncebus.http.observe import make_observe_app
from oncebus.store.sqlite import SqliteStore

BATCH = 10
BODY = b"x" * 256

SCRAPER = r"""
import sys, time, urllib.request
base, paths = sys.argv[1], sys.argv[2:]
times, sizes = [], []
next_at = time.monotonic()
while True:
    for path in paths:
        started = time.monotonic()
        with urllib.request.urlopen(base + path, timeout=10) as response:
            size = len(response.read())
        if path == "/metrics":
            times.append(time.monotonic() - started)
            sizes.append(size)
            print(f"{times[-1]:.6f} {size}", flush=True)
    next_at += 1.0
    time.sleep(max(0.0, next_at - time.monotonic()))
"""


async def _setup(ns: Namespace, queues: int, topics: int) -> list[str]:
    targets = []
    for i in range(queues):
        await ns.create_queue(
            f"q{i}", requires_duplicate_detection=True, duplicate_detection_history_time_window="PT10M"
        )
        targets.append(f"q{i}")
    for i in range(topics):
        await ns.create_topic(f"t{i}", requires_duplicate_detection=True)
        for sub in ("a", "b", "c"):
            await ns.create_subscription(f"t{i}", sub)
        targets.append(f"t{i}")
    return targets


async def _round(ns: Namespace, targets: list[str], senders: int, seconds: float, ids: itertools.count) -> float:
    """Messages committed per second by ``senders`` concurrent senders for ``seconds``."""
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + seconds
    sent = 0

    async def sender(n: int) -> None:
        nonlocal sent
        target = n
        while loop.time() < stop_at:
            batch = [Message(BODY, message_id=f"m{next(ids)}") for _ in range(BATCH)]
            await ns.send(targets[target % len(targets)], batch)
            sent += BATCH
            target += senders

    started = loop.time()
    await asyncio.gather(*(sender(n) for n in range(senders)))
    return sent / (loop.time() - started)


async def _drain(ns: Namespace, targets: list[str]) -> None:
    """Empty the entities between rounds so every round starts from the same backlog."""
    for target in targets:
        paths = [target] if target.startswith("q") else [f"{target}/subscriptions/{s}" for s in ("a", "b", "c")]
        for path in paths:
            receivable = ns.receivable(path)
            while receivable.messages:
                got = await ns.receive(path, 5000, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE)
                if not got:
                    break


async def main(args: argparse.Namespace) -> None:
    gc.freeze()
    with tempfile.TemporaryDirectory(prefix="oncebus-metrics-bench-") as tmp:
        store = SqliteStore(Path(tmp) / "oncebus.db")
        ns = await Namespace.open(store)
        targets = await _setup(ns, args.queues, args.topics)
        timers = asyncio.create_task(ns.run_timers(0.5))
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        base = f"http://127.0.0.1:{sock.getsockname()[1]}"
        server = uvicorn.Server(uvicorn.Config(make_observe_app(ns), log_level="warning", lifespan="off"))
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            await asyncio.sleep(0.01)
        ids = itertools.count()
        print(
            f"{args.queues} queues + {args.topics} topics x 3 subscriptions, dedup on; {args.senders} concurrent "
            f"senders, batches of {BATCH} x {len(BODY)} B; rounds of {args.seconds:g} s; SQLite synchronous=FULL",
            flush=True,
        )
        await _round(ns, targets, args.senders, min(2.0, args.seconds), ids)  # warm-up
        await _drain(ns, targets)
        modes = {"none": [], "scrape": ["/metrics"], "scrape + dashboard": ["/metrics", "/api/dashboard"]}
        results: dict[str, list[float]] = {mode: [] for mode in modes}
        scrape_times: list[float] = []
        scrape_bytes = 0
        for repeat in range(args.repeat):
            for mode, paths in modes.items():
                scraper = None
                if paths:
                    scraper = subprocess.Popen(
                        [sys.executable, "-c", SCRAPER, base, *paths], stdout=subprocess.PIPE, text=True
                    )
                    await asyncio.sleep(0.3)
                rate = await _round(ns, targets, args.senders, args.seconds, ids)
                if scraper is not None:
                    scraper.terminate()
                    out, _ = scraper.communicate(timeout=10)
                    for line in out.split("\n"):
                        if line.strip():
                            seconds, size = line.split()
                            scrape_times.append(float(seconds))
                            scrape_bytes = int(size)
                results[mode].append(rate)
                print(f"round {repeat + 1} {mode:>18}: {rate:9.0f} messages/s", flush=True)
                await _drain(ns, targets)
        median = {mode: statistics.median(rates) for mode, rates in results.items()}
        print()
        for mode, rate in median.items():
            print(f"median {mode:>18}: {rate:9.0f} messages/s")
        if scrape_times:
            scrape_times.sort()
            p50, worst = scrape_times[len(scrape_times) // 2] * 1e3, scrape_times[-1] * 1e3
            print(
                f"scrape: {len(scrape_times)} of {scrape_bytes} B, p50 {p50:.1f} ms, max {worst:.1f} ms (client side)"
            )
        print(f"ratio scrape / none: {median['scrape'] / median['none']:.3f} (target >= 0.95)")
        print(f"ratio scrape + dashboard / none: {median['scrape + dashboard'] / median['none']:.3f}")
        server.should_exit = True
        await serving
        timers.cancel()
        store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="length of one round")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per mode")
    parser.add_argument("--queues", type=int, default=20)
    parser.add_argument("--topics", type=int, default=5)
    parser.add_argument("--senders", type=int, default=16, help="concurrent senders on the broker's loop")
    asyncio.run(main(parser.parse_args()))
