"""Python calls a message on ``oncebus serve``'s loop thread while SDK receivers receive and complete.

``oncebus serve`` runs with cProfile switched on and off by signals (SIGUSR1 on, SIGUSR2 off and dump), on its
main thread, which runs the event loop (the store's writer thread is not counted). The queue is filled first (not
counted), then ``--receivers`` azure-servicebus receivers in PEEK_LOCK complete every message, as
``bench/amqp_send.py``'s receive row does. Prints the calls a message (all Python and C calls cProfile sees on
the loop thread: they do not depend on the machine's load) and the functions with the most calls and own time
a message (own times are inflated by the profiler).

Usage: ``python bench/receive_calls.py [--messages 6000] [--receivers 4] [--shape realistic] [--top 25]``
"""

from __future__ import annotations

import argparse
import collections
import json
import pstats
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from amqp_send import run_workers, sdk_fill, sdk_receiver, start_serve

_SERVE = """
import cProfile, signal, sys
profile = cProfile.Profile()
out = sys.argv[1]
def on(*_):
    profile.enable()
def off(*_):
    profile.disable()
    profile.dump_stats(out)
    print("dumped", flush=True)
signal.signal(signal.SIGUSR1, on)
signal.signal(signal.SIGUSR2, off)
sys.argv = ["oncebus", *sys.argv[2:]]
from oncebus.cli import main
sys.exit(main())
"""


def start(workdir: Path, stats: Path) -> tuple[subprocess.Popen[str], str, list[str]]:
    config = {
        "UserConfig": {
            "Namespaces": [
                {"Name": "bench", "Queues": [{"Name": "receive", "Properties": {"RequiresDuplicateDetection": True}}]}
            ]
        }
    }
    config_file = workdir / "config.json"
    config_file.write_text(json.dumps(config))
    serve = [str(stats), "--data-dir", str(workdir / "data"), "serve", "--port", "0", "--config", str(config_file)]
    lines: list[str] = []
    process, connection_string = start_serve(_SERVE, serve, lines)
    return process, connection_string, lines


def arguments(messages: int, clients: str, count: int, description: str) -> argparse.Namespace:
    """The command line both call benches take (``clients``: ``receivers`` or ``senders``)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--messages", type=int, default=messages)
    parser.add_argument(f"--{clients}", type=int, default=count)
    parser.add_argument("--shape", choices=("bare", "realistic"), default="realistic")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--keep", type=Path, help="copy the cProfile stats here (pstats format)")
    return parser.parse_args()


def profiled(
    args: argparse.Namespace,
    messages: int,
    what: str,
    prepare: Callable[[str], None],
    measure: Callable[[str, int], None],
) -> None:
    """``oncebus serve`` profiled: ``prepare(connection string)`` first (not counted), then ``measure(connection
    string, serve's pid)`` with the profiler on; then :func:`report` of ``messages`` (``what`` they were)."""
    workdir = Path(tempfile.mkdtemp(prefix="oncebus-calls-"))
    stats = workdir / "serve.prof"
    process, connection_string, lines = start(workdir, stats)
    try:
        prepare(connection_string)
        process.send_signal(signal.SIGUSR1)
        measure(connection_string, process.pid)
        process.send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + 30
        while "dumped\n" not in lines and time.monotonic() < deadline:
            time.sleep(0.05)
        if "dumped\n" not in lines:
            raise SystemExit("oncebus serve did not dump its profile:\n" + "".join(lines[-30:]))
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(30)
    report(stats, messages, what, args.top)
    if args.keep is not None:
        shutil.copy(stats, args.keep)
    shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    args = arguments(6000, "receivers", 4, __doc__.splitlines()[0])
    per_receiver = (args.messages + args.receivers - 1) // args.receivers

    def prepare(connection_string: str) -> None:
        sdk_fill(connection_string, "receive", "calls", args.messages, args.shape)

    def measure(connection_string: str, pid: int) -> None:
        jobs: list[tuple[Any, ...]] = [(connection_string, "receive", per_receiver)] * args.receivers
        run_workers(sdk_receiver, jobs, pid)

    profiled(args, args.messages, f"{args.shape} messages, {args.receivers} receivers", prepare, measure)


def report(stats: Path, messages: int, what: str, top: int) -> None:
    """Print the calls a message the profile ``stats`` holds, and the functions with the most calls and own time."""
    table = pstats.Stats(str(stats))
    entries: dict[Any, Any] = table.stats  # type: ignore[attr-defined]
    total = sum(nc for (_cc, nc, _tt, _ct, _callers) in entries.values())
    print(f"{messages:,} {what}")
    print(f"calls a message on the loop thread: {total / messages:.1f}")
    rows = collections.Counter({key: value[1] for key, value in entries.items()})
    print("most calls a message:")
    for (file, line, name), calls in rows.most_common(top):
        print(f"  {calls / messages:7.2f}  {name}  {Path(file).name}:{line}")
    own = collections.Counter({key: value[2] for key, value in entries.items()})
    print("most own time a message (us, profiled):")
    for (file, line, name), seconds in own.most_common(top):
        print(f"  {seconds / messages * 1e6:7.2f}  {name}  {Path(file).name}:{line}")


if __name__ == "__main__":
    main()
