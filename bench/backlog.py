"""A backlog: ``oncebus serve`` with many 1 KiB messages waiting in one queue. One run, printed (never asserted).

1. Fill the queue through the SDK (``--senders`` processes, batches of 100) and report the server's RSS.
2. Restart the server (SIGINT, start again on the same data directory): time until it prints ``ready``,
   until the first send is accepted, and its RSS then (message contents stay on disk: RSS should not
   grow with the backlog).
3. Receive + complete ``--receive`` messages from the backlog (PEEK_LOCK, ``--receivers`` processes) and
   report the rate, the server's CPU per message and its RSS after.

    python bench/backlog.py                       # 200,000 messages (a few minutes)
    python bench/backlog.py --messages 1000000    # the issue's size
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from amqp_send import (
    BATCH,
    _shares,
    describe,
    run_workers,
    sdk_receiver,
    sdk_sender,
    start_oncebus,
)
from azure.servicebus import ServiceBusClient, ServiceBusMessage


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def stop(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGINT)
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000, help="backlog size (default 200000)")
    parser.add_argument("--senders", type=int, default=2, help="sender processes filling the queue (default 2)")
    parser.add_argument("--receive", type=int, default=20_000, help="messages received from the backlog")
    parser.add_argument("--receivers", type=int, default=4, help="receiver processes (default 4)")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="oncebus-backlog-"))
    print(f"{args.messages:,} messages of 1 KiB into queue 'receive' (dedup on); data in {workdir}")
    process, connection_string = start_oncebus(workdir)
    try:
        idle = rss_mb(process.pid)
        started = time.perf_counter()
        jobs = [(connection_string, "receive", "fill", share) for share in _shares(args.messages, args.senders)]
        filled = run_workers(sdk_sender, jobs, process.pid)
        print(
            f"filled in {time.perf_counter() - started:.0f} s: {describe(filled)}; "
            f"server RSS {rss_mb(process.pid):.0f} MB (idle before: {idle:.0f} MB)"
        )
    finally:
        stop(process)
    size = sum(f.stat().st_size for f in (workdir / "data").glob("oncebus.db*"))
    print(f"store on disk: {size / 2**20:.0f} MB")

    started = time.perf_counter()
    process, connection_string = start_oncebus(workdir)
    ready = time.perf_counter() - started
    try:
        with ServiceBusClient.from_connection_string(connection_string) as client:
            with client.get_queue_sender("dedup-off") as sender:
                sender.send_messages(ServiceBusMessage(b"first", message_id=str(uuid.uuid4())))
        first = time.perf_counter() - started
        print(
            f"restart with {args.messages:,} waiting: ready after {ready:.2f} s, first send accepted after "
            f"{first:.2f} s (SDK connect included); server RSS {rss_mb(process.pid):.0f} MB"
        )
        count = min(args.receive, args.messages)
        per = (count + args.receivers - 1) // args.receivers
        received = run_workers(sdk_receiver, [(connection_string, "receive", per)] * args.receivers, process.pid)
        print(
            f"receive + complete {count:,} from the backlog (PEEK_LOCK, prefetch {BATCH * 2}, {args.receivers} "
            f"processes): {describe(received)}; server RSS {rss_mb(process.pid):.0f} MB"
        )
    finally:
        stop(process)
        shutil.rmtree(workdir, ignore_errors=True)
    one, five, _ = os.getloadavg()
    print(f"load average {one:.2f} (1 min), {five:.2f} (5 min)")


if __name__ == "__main__":
    main()
