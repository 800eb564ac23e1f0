"""System calls a message on ``oncebus serve``: the send row and the receive + complete row of ``bench/amqp_send.py``.

``perf stat`` (Linux, the syscall tracepoints: root or ``perf_event_paranoid`` <= 1) counts the server's system
calls per thread while azure-servicebus SDK processes send (dedup on, batches of 100) or receive and complete
(PEEK_LOCK, prefetch 200), from when every worker has connected until the last finishes: counts, unlike CPU time,
barely depend on the machine's load. Prints, a message, the loop thread's transport calls (``sendto`` and
``recvfrom`` on asyncio's loop; ``read``, ``write`` and ``writev`` on uvloop, whose ``write`` count also holds
the settlement log's appends), ``epoll_wait``/``epoll_pwait`` (the loop's waits), ``epoll_ctl`` (a writer added
or removed), ``getpid`` (``asyncio.get_running_loop`` makes one on Python 3.11), ``pwrite64`` and ``futex``, all
its system calls, and those of the other threads (the store's writer: ``pwrite64``, ``fdatasync``, ...).
Without a usable ``perf`` it says so and measures nothing.

Usage: ``python bench/amqp_syscalls.py [--messages 10000] [--senders 2] [--receivers 4] [--shape realistic]``
"""

from __future__ import annotations

import argparse
import collections
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

from amqp_send import SHAPES, _shares, joined, sdk_fill, sdk_receiver, sdk_sender, spawn_workers, start_oncebus

LOOP_CALLS = (
    "sendto",
    "recvfrom",
    "read",
    "write",
    "writev",
    "epoll_wait",
    "epoll_pwait",
    "epoll_ctl",
    "getpid",
    "pwrite64",
    "futex",
)
OTHER_CALLS = ("write", "pwrite64", "fdatasync", "fsync", "futex")
EVENTS = [f"syscalls:sys_enter_{name}" for name in dict.fromkeys(LOOP_CALLS + OTHER_CALLS)]
ALL = "raw_syscalls:sys_enter"
TOTAL = "sys_enter"  # ALL's short name, as the counts are keyed


def perf_usable() -> str | None:
    """None when ``perf stat`` can count syscall tracepoints here; otherwise why not."""
    binary = shutil.which("perf")
    if binary is None:
        return "perf not found"
    done = subprocess.run([binary, "stat", "-x,", "-e", ALL, "--", "true"], capture_output=True, text=True)
    if done.returncode != 0 or "not supported" in done.stderr or "<not" in done.stderr:
        return (done.stderr.strip().splitlines() or ["perf stat failed"])[-1]
    return None


class Counted:
    """``perf stat --per-thread`` attached to ``pid`` until :meth:`stop`: counts per (thread, event)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.out = tempfile.NamedTemporaryFile(prefix="oncebus-perf-", suffix=".csv", delete=False)
        command = ["perf", "stat", "-x,", "--per-thread", "-e", ",".join([*EVENTS, ALL]), "-p", str(pid)]
        self.process = subprocess.Popen([*command, "-o", self.out.name], stderr=subprocess.DEVNULL)
        time.sleep(0.5)  # attached to every thread

    def stop(self) -> dict[tuple[int, str], int]:
        self.process.send_signal(signal.SIGINT)
        self.process.wait(30)
        counts: dict[tuple[int, str], int] = collections.Counter()
        for line in Path(self.out.name).read_text().splitlines():
            fields = line.split(",")
            if len(fields) < 4 or not fields[1].isdigit():
                continue
            tid = int(fields[0].rsplit("-", 1)[-1])
            counts[tid, fields[3].split(":", 1)[-1].removeprefix("sys_enter_")] += int(fields[1])
        Path(self.out.name).unlink()
        return counts


def counted_row(target: Callable[..., None], jobs: list[tuple[Any, ...]], server_pid: int) -> tuple[int, Counted]:
    """Run ``target(*job, barrier, results)`` in one process per job (as ``amqp_send.run_workers``), counting the
    server's syscalls from the barrier (all connected) to the last report; the messages handled and the counts."""
    processes, barrier, results = spawn_workers(target, jobs)
    counted: Counted | None = None
    try:
        while barrier.n_waiting < len(jobs):  # every worker connected: count from here
            time.sleep(0.05)
            if not any(p.is_alive() for p in processes):
                raise SystemExit("the workers did not start: " + str(results.get(timeout=5)))
        counted = Counted(server_pid)
        barrier.wait(120)
        reports = [results.get(timeout=600) for _ in processes]
    except BaseException:
        if counted is not None:
            counted.stop()
        for process in processes:
            process.terminate()
        raise
    joined(processes, reports)
    return sum(r[2] for r in reports), counted


def describe(name: str, messages: int, counts: dict[tuple[int, str], int], loop_tid: int) -> None:
    loop = {event: n for (tid, event), n in counts.items() if tid == loop_tid}
    others: collections.Counter[str] = collections.Counter()
    for (tid, event), n in counts.items():
        if tid != loop_tid:
            others[event] += n

    def per(n: int) -> str:
        return f"{n / messages:.3f}"

    print(f"{name}: {messages:,} messages; system calls a message")
    calls = ", ".join(f"{e} {per(loop.get(e, 0))}" for e in LOOP_CALLS)
    print(f"  loop thread: {calls}; all {per(loop.get(TOTAL, 0))}")
    calls = ", ".join(f"{e} {per(others[e])}" for e in OTHER_CALLS if others.get(e))
    print(f"  other threads: {calls}; all {per(others[TOTAL])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10_000, help="messages per row (default 10000)")
    parser.add_argument("--senders", type=int, default=2)
    parser.add_argument("--receivers", type=int, default=4)
    parser.add_argument("--shape", choices=SHAPES, default="realistic")
    parser.add_argument("--repeat", type=int, default=1, help="rounds (each row counted on its own)")
    args = parser.parse_args()
    why_not = perf_usable()
    if why_not is not None:
        print(f"not measured: perf cannot count syscall tracepoints here ({why_not})")
        return
    workdir = Path(tempfile.mkdtemp(prefix="oncebus-syscalls-"))
    oncebus, connection_string = start_oncebus(workdir)
    try:
        count = args.messages
        for r in range(args.repeat):
            prefix = f"r{r}-{args.shape}"
            jobs: list[tuple[Any, ...]] = [
                (connection_string, "dedup-on", prefix, args.shape, share) for share in _shares(count, args.senders)
            ]
            sent, counted = counted_row(sdk_sender, jobs, oncebus.pid)
            describe(f"send ({args.senders} senders, dedup on, {args.shape})", sent, counted.stop(), oncebus.pid)
            sdk_fill(connection_string, "receive", prefix, count, args.shape)
            per_receiver = (count + args.receivers - 1) // args.receivers
            jobs = [(connection_string, "receive", per_receiver)] * args.receivers
            received, counted = counted_row(sdk_receiver, jobs, oncebus.pid)
            name = f"receive + complete ({args.receivers} receivers, prefetch 200, {args.shape})"
            describe(name, received, counted.stop(), oncebus.pid)
    finally:
        oncebus.send_signal(signal.SIGINT)
        try:
            oncebus.wait(30)
        except subprocess.TimeoutExpired:
            oncebus.kill()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
