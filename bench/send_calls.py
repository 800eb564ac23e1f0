"""Python calls a message on ``oncebus serve``'s loop thread while SDK senders send batches (dedup on).

The send side of ``bench/receive_calls.py`` (same profiled ``oncebus serve``: cProfile on its main thread, the event
loop, switched on and off by signals; the store's writer thread is not counted). ``--senders`` azure-servicebus
senders send batches of 100 messages with unique ids to a queue with duplicate detection, as
``bench/amqp_send.py``'s send rows do. Prints the calls a message (they do not depend on the machine's load) and
the functions with the most calls and own time a message (own times are inflated by the profiler).

Usage: ``python bench/send_calls.py [--messages 10000] [--senders 2] [--shape realistic] [--top 25]``
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from amqp_send import BATCH, run_workers, sdk_sender
from receive_calls import arguments, profiled


def main() -> None:
    args = arguments(10000, "senders", 2, __doc__.splitlines()[0])
    share = -(-args.messages // (args.senders * BATCH)) * BATCH  # whole batches a sender

    def measure(connection_string: str, pid: int) -> None:
        jobs: list[tuple[Any, ...]] = [
            (connection_string, "receive", f"calls-{n}", args.shape, range(share)) for n in range(args.senders)
        ]
        run_workers(sdk_sender, jobs, pid)

    what = f"{args.shape} messages sent, {args.senders} senders"
    profiled(args, share * args.senders, what, lambda _: None, measure)


if __name__ == "__main__":
    main()
