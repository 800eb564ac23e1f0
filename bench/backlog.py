"""A backlog: ``oncebus serve`` with many 1 KiB messages waiting in one queue. One run, printed (never asserted).

1. Fill the queue through the SDK (``--senders`` processes, batches of 100) and report the server's RSS.
2. With ``--keys N``: stop the server and add N dedup keys of the queue straight into the store's
   ``dedup_key`` table (as N sends would have left them, first accepted over the last minute; the SDK would
   take hours for 10 M), then start it with no index image (every key rebuilt from the rows: what a crash
   restart always did before checkpoints, and what a first start after an upgrade does) and report the time
   to ``ready``, the time until the whole backlog is in memory, and the RSS. Then wait for the server's first
   dedup checkpoint, send ``--after`` more messages (keys the image does not hold), SIGKILL the server and
   start it again: the crash restart (the image, and the rows since its mark). The pause a checkpoint's fork
   costs the loop is measured in this process on the server's own image, with a ballast of the server's RSS.
3. Restart the server cleanly (SIGINT, start again on the same data directory): time until it prints
   ``ready``, until the first send is accepted (a new key judged against every held key), until the
   backlog is in memory (the first receive), and its RSS then.
4. Receive + complete ``--receive`` messages from the backlog (PEEK_LOCK, ``--receivers`` processes) and
   report the rate, the server's CPU per message and its RSS after.

    python bench/backlog.py                                       # 200,000 messages (a few minutes)
    python bench/backlog.py --messages 1000000 --keys 10000000    # the issue's sizes

``--workdir DIR`` keeps the data there (not deleted at the end); run again with the same ``DIR`` and the store
already there, it skips steps 1 and 2 and times ``--restarts`` clean restarts of it (with ``--kill``: each start
sent ``--after`` messages and SIGKILLed, the next one a crash restart).
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import amqp_send
from amqp_send import (
    BATCH,
    _shares,
    describe,
    run_workers,
    sdk_receiver,
    sdk_sender,
)
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from oncebus.core.dedup import DedupIndex
from oncebus.store import dedup_images


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """The process's resident memory now, or with ``field="VmHWM"`` the most it has had."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start_oncebus(workdir: Path) -> tuple[subprocess.Popen[str], str]:
    """``amqp_send.start_oncebus`` with a window of an hour on 'receive' (the keys added stay held) and room for
    a million messages of 1 KiB (5 GB: a queue holds 1 GB by default, and each message counts 256 bytes more)."""
    return amqp_send.start_oncebus(workdir, receive_window="PT1H", receive_properties={"MaxSizeInMegabytes": 5120})


def add_keys(db_path: Path, count: int) -> float:
    """``count`` keys of 'receive' written straight into the store, first accepted over the last minute; seconds."""
    started = time.perf_counter()
    db = sqlite3.connect(db_path)
    now = time.time_ns() // 1000
    db.execute("BEGIN")
    step = 200_000
    for start in range(0, count, step):
        rows = [
            ("receive", now - 60_000_000 + i * 60_000_000 // count, f"bench-key-{i}")
            for i in range(start, min(count, start + step))
        ]
        db.executemany("INSERT INTO dedup_key (entity, first_accepted_us, key) VALUES (?, ?, ?)", rows)
    db.execute("DELETE FROM dedup_checkpoint")  # the index image written at the last stop does not hold them
    db.execute("COMMIT")
    db.close()
    return time.perf_counter() - started


def newest_checkpoint(db_path: Path) -> int:
    """The newest committed checkpoint's mark (0 without one)."""
    db = sqlite3.connect(db_path, timeout=30)
    try:
        return int(db.execute("SELECT COALESCE(MAX(since_us), 0) FROM dedup_checkpoint").fetchone()[0])
    finally:
        db.close()


def wait_for_checkpoint(db_path: Path, after: int, timeout: float = 900) -> float:
    """Seconds until a checkpoint newer than ``after`` is committed."""
    started = time.perf_counter()
    while newest_checkpoint(db_path) <= after:
        if time.perf_counter() - started > timeout:
            raise SystemExit("no dedup checkpoint was committed")
        time.sleep(0.2)
    return time.perf_counter() - started


def fork_pause(db_path: Path, ballast_mb: float) -> str:
    """The loop's pause for a checkpoint (``fork_write``'s fork) and the child's write, measured here on the
    server's committed images with ``ballast_mb`` of touched memory besides (the server's other memory)."""
    db = sqlite3.connect(db_path)
    images = dedup_images.take(db, db_path)
    db.close()
    indexes = []
    for name, image in images.items():
        index = DedupIndex(timedelta(hours=1))
        with image.open() as file:
            index.load_image(file, image.length, image.crc)
        indexes.append((name, index))
    ballast = b"\1" * int(max(ballast_mb - rss_mb(os.getpid()), 0) * 2**20)
    target = db_path.with_name("bench-fork.dedup")
    rss = rss_mb(os.getpid())
    pauses, writes = [], []
    for _ in range(3):
        started = time.perf_counter()
        pid = dedup_images.fork_write(target, secrets.token_bytes(16), indexes)  # type: ignore[arg-type]
        pauses.append(time.perf_counter() - started)
        os.waitpid(pid, 0)
        writes.append(time.perf_counter() - started)
    dedup_images.discard(target)
    del ballast
    return (
        f"checkpoint fork pause (this process: RSS {rss:.0f} MB, "
        f"{sum(len(i) for _, i in indexes):,} keys): {min(pauses) * 1000:.1f} to {max(pauses) * 1000:.1f} ms; "
        f"the child's write + fsync {min(writes):.2f} to {max(writes):.2f} s"
    )


def send_one(connection_string: str, message_id: str) -> None:
    with ServiceBusClient.from_connection_string(connection_string) as client:
        with client.get_queue_sender("receive") as sender:
            sender.send_messages(ServiceBusMessage(b"first", message_id=message_id))


def receive_one(connection_string: str) -> None:
    """Returns once the server has the backlog in memory (receives wait for it); the message goes back."""
    with ServiceBusClient.from_connection_string(connection_string) as client:
        with client.get_queue_receiver("receive", max_wait_time=120) as receiver:
            for message in receiver.receive_messages(max_message_count=1, max_wait_time=120):
                receiver.abandon_message(message)


def restart(workdir: Path, label: str, messages: int, keys: int) -> tuple[subprocess.Popen[str], str]:
    started = time.perf_counter()
    process, connection_string = start_oncebus(workdir)
    ready = time.perf_counter() - started
    send_one(connection_string, str(uuid.uuid4()))
    first = time.perf_counter() - started
    ready_rss = rss_mb(process.pid)
    receive_one(connection_string)
    loaded = time.perf_counter() - started
    again = time.perf_counter()
    send_one(connection_string, str(uuid.uuid4()))
    again = time.perf_counter() - again
    print(
        f"{label} with {messages:,} messages waiting and {keys:,} keys held: ready after {ready:.2f} s, first send "
        f"accepted after {first:.2f} s (SDK connect included; server RSS then {ready_rss:.0f} MB), backlog in "
        f"memory after {loaded:.2f} s; server RSS {rss_mb(process.pid):.0f} MB; a send on a new SDK connection "
        f"then takes {again:.2f} s"
    )
    return process, connection_string


def stop(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGINT)
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()


def held(db_path: Path) -> tuple[int, int]:
    """(messages, dedup key rows) in the store."""
    db = sqlite3.connect(db_path)
    try:
        return (
            int(db.execute("SELECT count(*) FROM message").fetchone()[0]),
            int(db.execute("SELECT count(*) FROM dedup_key").fetchone()[0]),
        )
    finally:
        db.close()


def restarts_only(workdir: Path, args: argparse.Namespace) -> None:
    """Clean restarts of the store kept in ``workdir`` (each stopped cleanly again: its image written anew); with
    ``--kill``, each start is sent ``--after`` messages to 'dedup-on' and SIGKILLed, so every start after the
    first is a crash restart (the last image, and the keys accepted since its mark)."""
    messages, keys = held(workdir / "data" / "oncebus.db")
    crashed = 0
    for number in range(args.restarts):
        label = (
            f"start {number + 1} after SIGKILL ({crashed:,} keys sent since)"
            if crashed
            else f"clean restart {number + 1}"
        )
        process, connection_string = restart(workdir, label, messages, keys)
        if not args.kill:
            stop(process)
            continue
        jobs = [(connection_string, "dedup-on", "after", "bare", n) for n in _shares(args.after, args.senders)]
        run_workers(sdk_sender, jobs, process.pid)
        process.kill()  # SIGKILL: nothing written on the way out
        process.wait()
        crashed, messages, keys = args.after, messages + args.after, keys + args.after
    if crashed:
        stop(restart(workdir, "clean restart", messages, keys)[0])
    one, five, _ = os.getloadavg()
    print(f"load average {one:.2f} (1 min), {five:.2f} (5 min)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000, help="backlog size (default 200000)")
    parser.add_argument("--senders", type=int, default=2, help="sender processes filling the queue (default 2)")
    parser.add_argument("--receive", type=int, default=20_000, help="messages received from the backlog")
    parser.add_argument("--receivers", type=int, default=4, help="receiver processes (default 4)")
    parser.add_argument("--keys", type=int, default=0, help="dedup keys added to the store before restarting")
    parser.add_argument("--after", type=int, default=20_000, help="messages sent after the checkpoint (--keys)")
    parser.add_argument("--workdir", help="keep the data here; a store already there is restarted, not filled")
    parser.add_argument("--restarts", type=int, default=1, help="clean restarts timed (default 1)")
    parser.add_argument(
        "--kill", action="store_true", help="with a kept --workdir: SIGKILL each start after --after sends"
    )
    args = parser.parse_args()
    if args.workdir and (Path(args.workdir) / "data" / "oncebus.db").exists():
        restarts_only(Path(args.workdir), args)
        return
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="oncebus-backlog-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"{args.messages:,} messages of 1 KiB into queue 'receive' (dedup on); data in {workdir}")
    process, connection_string = start_oncebus(workdir)
    try:
        idle = rss_mb(process.pid)
        started = time.perf_counter()
        jobs = [(connection_string, "receive", "fill", "bare", n) for n in _shares(args.messages, args.senders)]
        filled = run_workers(sdk_sender, jobs, process.pid)
        print(
            f"filled in {time.perf_counter() - started:.0f} s: {describe(filled)}; "
            f"server RSS {rss_mb(process.pid):.0f} MB, at most {rss_mb(process.pid, 'VmHWM'):.0f} MB throughout "
            f"(idle before: {idle:.0f} MB)"
        )
    finally:
        stop(process)
    keys = messages = args.messages  # each message sent left its key
    if args.keys:
        seconds = add_keys(workdir / "data" / "oncebus.db", args.keys)
        keys += args.keys
        print(f"added {args.keys:,} dedup keys straight into the store in {seconds:.0f} s (not through the SDK)")
    size = sum(f.stat().st_size for f in (workdir / "data").glob("oncebus.db*"))
    print(f"store on disk: {size / 2**20:.0f} MB")
    if args.keys:
        db_path = workdir / "data" / "oncebus.db"
        process, connection_string = restart(
            workdir, "start with no index image (every key rebuilt from the rows)", args.messages, keys
        )
        waited = wait_for_checkpoint(db_path, 0)
        images = sum(p.stat().st_size for p in (workdir / "data").glob("oncebus.db.dedup.*"))
        print(f"first dedup checkpoint committed {waited:.1f} s later (image {images / 2**20:.0f} MB)")
        # to 'dedup-on': 'receive' may be full (1 GB); its keys since the mark are read the same way
        jobs = [(connection_string, "dedup-on", "after", "bare", n) for n in _shares(args.after, args.senders)]
        sent = describe(run_workers(sdk_sender, jobs, process.pid))
        print(f"{args.after:,} more messages after it (to 'dedup-on'): {sent}")
        server_rss = rss_mb(process.pid)
        process.kill()  # SIGKILL: nothing written on the way out
        process.wait()
        messages, keys = args.messages + args.after, keys + args.after
        process, _ = restart(workdir, f"start after SIGKILL ({args.after:,} keys since the image)", messages, keys)
        stop(process)
        print(fork_pause(db_path, server_rss))

    process, connection_string = restart(workdir, "clean restart", messages, keys)
    try:
        count = min(args.receive, messages)
        if count:
            per = (count + args.receivers - 1) // args.receivers
            received = run_workers(sdk_receiver, [(connection_string, "receive", per)] * args.receivers, process.pid)
            print(
                f"receive + complete {count:,} from the backlog (PEEK_LOCK, prefetch {BATCH * 2}, {args.receivers} "
                f"processes): {describe(received)}; server RSS {rss_mb(process.pid):.0f} MB"
            )
    finally:
        stop(process)
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    one, five, _ = os.getloadavg()
    print(f"load average {one:.2f} (1 min), {five:.2f} (5 min)")


if __name__ == "__main__":
    main()
