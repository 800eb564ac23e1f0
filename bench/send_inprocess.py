"""The send path without the wire: ``Namespace.send`` of decoded AMQP batches on a SQLite store, in process.

Each send is a batch of ``--batch`` messages decoded by the AMQP codec from proton-encoded bytes (as a transfer
brings them), ``--senders`` concurrent senders, a SQLite store with fsync (``synchronous=FULL``), the collector
tuned as ``oncebus serve`` tunes it. Prints the CPU microseconds a message of all threads (``process_time``) and
of the store's writer thread (``thread_time`` around ``SqliteStore._apply``), dedup off and on, rounds
alternated; the best round of each is shown. ``--cprofile``: cProfile the loop thread and the writer's
``_apply`` in one more dedup-on round and print their top functions by own time.

``--page-sizes 4096,16384`` (or ``--secure-delete 1,FAST``): instead, the store against itself with each SQLite page
size for the databases it creates (``store.sqlite.PAGE_SIZE``; or each ``secure_delete`` setting,
``store.sqlite.SECURE_DELETE``), dedup on, rounds alternated: the send as above, then every message received
and completed (``Namespace.receive`` of 100, each completed) and the store closed (the writer applies the
settlement log's records), each phase's CPU a message of all threads and of the writer; the best round of each and
the ratios to the first setting.

Usage: ``python bench/send_inprocess.py [--messages 10000] [--batch 100] [--senders 2] [--shape realistic]
[--repeat 3] [--cprofile] [--page-sizes 4096,16384 | --secure-delete 1,FAST]``
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import tempfile
import time
from pathlib import Path
from typing import Any

import proton

from oncebus.amqp import codec
from oncebus.broker import Namespace
from oncebus.core.messages import Message
from oncebus.server.runtime import tune_gc
from oncebus.store import sqlite as sqlite_store
from oncebus.store.sqlite import SqliteStore

BODY = b"x" * 1024


def wire_messages(shape: str, prefix: str, count: int) -> list[Message]:
    """``count`` messages as the AMQP door decodes them (``bench/amqp_send.py``'s shapes)."""
    out = []
    for i in range(count):
        m = proton.Message(body=BODY, id=f"{prefix}-{i}", inferred=True)  # a data section, as the SDKs send
        if shape == "realistic":
            m.subject = "order-created"
            m.content_type = proton.symbol("application/json")
            m.correlation_id = f"corr-{prefix}-{i}"
            m.properties = {"tenant": "contoso", "attempt": 1, "priority": True, "amount": 9.5}
        out += codec.decode_transfer(m.encode(), 0)
    return out


class WriterClock:
    """Adds up the writer thread's CPU time in ``_apply``."""

    def __init__(self, store: SqliteStore) -> None:
        self.seconds = 0.0
        self.profile: cProfile.Profile | None = None
        apply = store._apply

        def timed(ops: Any, durable: bool) -> None:
            started = time.thread_time()
            if self.profile is not None:
                self.profile.enable()
            try:
                apply(ops, durable)
            finally:
                if self.profile is not None:
                    self.profile.disable()
                self.seconds += time.thread_time() - started

        store._apply = timed  # type: ignore[method-assign]


async def one_round(
    workdir: Path,
    dedup: bool,
    batches: list[list[Message]],
    senders: int,
    profile: cProfile.Profile | None,
    writer_profile: cProfile.Profile | None = None,
) -> tuple[float, float]:
    store = SqliteStore(workdir / f"r{time.monotonic_ns()}.db")
    writer = WriterClock(store)
    ns = await Namespace.open(store)
    try:
        await ns.create_queue("q", requires_duplicate_detection=dedup)
        await ns.send("q", [Message(b"warm-up", message_id="warm-up")])
        work = iter(batches)

        async def sender() -> None:
            for batch in work:
                await ns.send("q", batch)

        writer.seconds = 0.0
        writer.profile = writer_profile
        cpu = time.process_time()
        if profile is not None:
            profile.enable()
        await asyncio.gather(*(sender() for _ in range(senders)))
        if profile is not None:
            profile.disable()
        writer.profile = None
        return time.process_time() - cpu, writer.seconds
    finally:
        await ns.close()
        store.close()


# the store's settings a comparison round sets (``--page-sizes``, ``--secure-delete``): the module's constant, and
# how SQLite reports it (secure_delete: 0 off, 1 on, 2 FAST)
SETTINGS = {"page_size": "PAGE_SIZE", "secure_delete": "SECURE_DELETE"}
_SECURE_DELETE_REPORTED = {"0": 0, "1": 1, "FAST": 2}


async def setting_round(
    workdir: Path, setting: str, value: str, batches: list[list[Message]], senders: int
) -> list[float]:
    """One comparison round: a store opened with ``setting`` (a key of ``SETTINGS``) at ``value``; returns the send's
    CPU (all threads, the writer) and the receive + complete's (all threads, the writer), seconds."""
    constant = SETTINGS[setting]
    chosen: int | str = int(value) if setting == "page_size" else value
    default = getattr(sqlite_store, constant)
    setattr(sqlite_store, constant, chosen)
    try:
        store = SqliteStore(workdir / f"p{time.monotonic_ns()}.db")
    finally:
        setattr(sqlite_store, constant, default)
    reported = store._db.execute(f"PRAGMA {setting}").fetchone()[0]
    assert reported == (chosen if setting == "page_size" else _SECURE_DELETE_REPORTED[value]), (setting, reported)
    writer = WriterClock(store)
    ns = await Namespace.open(store)
    try:
        await ns.create_queue("q", requires_duplicate_detection=True)
        work = iter(batches)

        async def sender() -> None:
            for batch in work:
                await ns.send("q", batch)

        writer.seconds, cpu = 0.0, time.process_time()
        await asyncio.gather(*(sender() for _ in range(senders)))
        sent = [time.process_time() - cpu, writer.seconds]
        writer.seconds, cpu = 0.0, time.process_time()
        while got := await ns.receive("q", 100, max_wait_time=0):
            await asyncio.gather(*(ns.complete("q", m.lock_token) for m in got if m.lock_token is not None))
    finally:
        await ns.close()
        store.close()  # counted: the writer applies the settlement log's last records
    return [*sent, time.process_time() - cpu, writer.seconds]


def compare_settings(args: argparse.Namespace, tmp: Path, setting: str, values: list[str]) -> None:
    best: dict[str, list[float]] = {}
    for r in range(args.repeat):
        for value in values if r % 2 == 0 else values[::-1]:
            messages = wire_messages(args.shape, f"r{r}-{value}", args.messages)
            batches = [messages[i : i + args.batch] for i in range(0, len(messages), args.batch)]
            per = [
                seconds / args.messages * 1e6
                for seconds in asyncio.run(setting_round(tmp, setting, value, batches, args.senders))
            ]
            print(
                f"round {r} {setting} {value:>6}: send {per[0]:5.1f} us/msg (writer {per[1]:5.1f}), "
                f"receive + complete {per[2]:5.1f} (writer {per[3]:5.1f})"
            )
            best[value] = per if value not in best else [min(a, b) for a, b in zip(best[value], per, strict=True)]
    for value, per in best.items():
        print(
            f"best {setting} {value:>6}: send {per[0]:5.1f} us/msg (writer {per[1]:5.1f}), "
            f"receive + complete {per[2]:5.1f} (writer {per[3]:5.1f})"
        )
    first = best[values[0]]
    for value in values[1:]:
        ratios = [a / b for a, b in zip(best[value], first, strict=True)]
        print(
            f"ratio {setting} {value} / {values[0]}: send {ratios[0]:.2f} (writer {ratios[1]:.2f}), "
            f"receive + complete {ratios[2]:.2f} (writer {ratios[3]:.2f})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--senders", type=int, default=2)
    parser.add_argument("--shape", choices=("bare", "realistic"), default="realistic")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cprofile", action="store_true")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--page-sizes", help="compare SQLite page sizes, e.g. 4096,16384 (see the module)")
    parser.add_argument("--secure-delete", help="compare SQLite's secure_delete settings, e.g. 1,FAST (see the module)")
    args = parser.parse_args()
    tune_gc()  # the collector as ``oncebus serve`` sets it
    print(f"load {os.getloadavg()[0]:.2f}; {args.messages} {args.shape} messages, batches of {args.batch}")
    best: dict[str, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory(prefix="oncebus-send-") as tmp:
        if args.page_sizes or args.secure_delete:
            setting = "page_size" if args.page_sizes else "secure_delete"
            compare_settings(args, Path(tmp), setting, (args.page_sizes or args.secure_delete).split(","))
            return
        for r in range(args.repeat):
            for dedup in (False, True) if r % 2 == 0 else (True, False):
                messages = wire_messages(args.shape, f"r{r}-{dedup}", args.messages)
                batches = [messages[i : i + args.batch] for i in range(0, len(messages), args.batch)]
                total, writer = asyncio.run(one_round(Path(tmp), dedup, batches, args.senders, None))
                per = (total / args.messages * 1e6, writer / args.messages * 1e6)
                name = "on" if dedup else "off"
                print(f"round {r} dedup {name:3}: all threads {per[0]:5.1f} us/msg, writer {per[1]:5.1f} us/msg")
                if name not in best or per[0] < best[name][0]:
                    best[name] = per
        for name, (total_us, writer_us) in best.items():
            print(f"best dedup {name:3}: all threads {total_us:5.1f} us/msg (writer {writer_us:5.1f})")
        if args.cprofile:
            profile, writer_profile = cProfile.Profile(), cProfile.Profile()
            messages = wire_messages(args.shape, "prof", args.messages)
            batches = [messages[i : i + args.batch] for i in range(0, len(messages), args.batch)]
            asyncio.run(one_round(Path(tmp), True, batches, args.senders, profile, writer_profile))
            for name, which in (("loop thread", profile), ("writer thread (_apply)", writer_profile)):
                stream = io.StringIO()
                stats = pstats.Stats(which, stream=stream)
                calls = stats.total_calls / args.messages  # type: ignore[attr-defined]
                print(f"{name}, dedup on: {calls:.1f} calls a message")
                stats.sort_stats("tottime").print_stats(args.top)
                print(stream.getvalue())


if __name__ == "__main__":
    main()
