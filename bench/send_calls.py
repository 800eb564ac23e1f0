"""Python calls a message on ``oncebus serve``'s loop thread while SDK senders send batches (dedup on).

The send side of ``bench/receive_calls.py`` (same profiled ``oncebus serve``: cProfile on its main thread, the event
loop, switched on and off by signals; the store's writer thread is not counted). ``--senders`` azure-servicebus
senders send batches of 100 messages with unique ids to a queue with duplicate detection, as
``bench/amqp_send.py``'s send rows do. Prints the calls a message (they do not depend on the machine's load) and
the functions with the most calls and own time a message (own times are inflated by the profiler).

Usage: ``python bench/send_calls.py [--messages 10000] [--senders 2] [--shape realistic] [--top 25]``
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from amqp_send import BATCH, run_workers, sdk_sender
from receive_calls import report, start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10000)
    parser.add_argument("--senders", type=int, default=2)
    parser.add_argument("--shape", choices=("bare", "realistic"), default="realistic")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--keep", type=Path, help="copy the cProfile stats here (pstats format)")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="oncebus-calls-"))
    stats = workdir / "send.prof"
    process, connection_string, lines = start(workdir, stats)
    try:
        share = -(-args.messages // (args.senders * BATCH)) * BATCH  # whole batches a sender
        jobs: list[tuple[Any, ...]] = [
            (connection_string, "receive", f"calls-{n}", args.shape, range(share)) for n in range(args.senders)
        ]
        process.send_signal(signal.SIGUSR1)
        run_workers(sdk_sender, jobs, process.pid)
        process.send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + 30
        while "dumped\n" not in lines and time.monotonic() < deadline:
            time.sleep(0.05)
        if "dumped\n" not in lines:
            raise SystemExit("oncebus serve did not dump its profile:\n" + "".join(lines[-30:]))
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(30)
    report(stats, share * args.senders, f"{args.shape} messages sent, {args.senders} senders", args.top)
    if args.keep is not None:
        shutil.copy(stats, args.keep)
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
