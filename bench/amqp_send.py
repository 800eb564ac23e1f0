"""One run: azure-servicebus SDK throughput against ``oncebus serve``, and the same send workload on NATS JetStream.

Prints (never asserts):
- SDK send throughput, batches of 100 messages with 1 KiB bodies and unique
  message ids, duplicate detection on versus off (ratio on / off), from
  ``--senders`` concurrent sender processes (one client connection each);
- receive-and-complete throughput (PEEK_LOCK, prefetch, complete each message),
  from ``--receivers`` concurrent receiver processes;
- the same send workload on NATS JetStream with its duplicate window
  (``Nats-Msg-Id``; nats-py; ``nats-server`` from Debian's package, started on
  a free loopback port with file storage), from the same number of sender
  processes, as the ratio oncebus / JetStream.

Durability differs, and the output says so: oncebus acknowledges a send only
after its SQLite transaction is committed with ``synchronous=FULL`` (fsync
before the ack); JetStream's file store acknowledges once the message is in
the operating system's buffers and syncs on a timer (``sync_interval``, 2
minutes by default; ``sync_interval: always`` forces a sync per write but
exists only from nats-server 2.10; the script tries it and reports whether the
installed server accepts it).

Usage: ``python bench/amqp_send.py [--messages 20000] [--senders 4] [--receivers 4] [--repeat 3]``
(each measurement runs ``--repeat`` times, for both systems alike; the best round is shown).
Needs ``nats-py`` and ``nats-server`` for the JetStream part (skipped with a note otherwise).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode

BATCH = 100
BODY = b"x" * 1024


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_oncebus(workdir: Path) -> tuple[subprocess.Popen[str], str]:
    config = {
        "UserConfig": {
            "Namespaces": [
                {
                    "Name": "bench",
                    "Queues": [
                        {"Name": "dedup-on", "Properties": {"RequiresDuplicateDetection": True}},
                        {"Name": "dedup-off", "Properties": {"RequiresDuplicateDetection": False}},
                        {"Name": "receive", "Properties": {"RequiresDuplicateDetection": True}},
                    ],
                }
            ]
        }
    }
    config_file = workdir / "config.json"
    config_file.write_text(json.dumps(config))
    command = [sys.executable, "-c", "import sys; from oncebus.cli import main; sys.exit(main())"]
    command += ["--data-dir", str(workdir / "data"), "serve", "--port", "0", "--config", str(config_file)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    connection_string = ""
    for line in process.stdout:
        if line.startswith("connection string: "):
            connection_string = line.split(": ", 1)[1].strip()
        if line.strip() == "ready":
            break
    if not connection_string:
        process.kill()
        raise SystemExit("oncebus serve did not start")
    return process, connection_string


# ------------------------------------------------------------------------- concurrent workers
def _shares(count: int, workers: int) -> list[range]:
    """Split message numbers 0..count-1 into ``workers`` ranges of whole batches."""
    batches = (count + BATCH - 1) // BATCH
    per = [batches // workers + (1 if i < batches % workers else 0) for i in range(workers)]
    ranges, start = [], 0
    for n in per:
        end = min(count, start + n * BATCH)
        ranges.append(range(start, end))
        start = end
    return ranges


@dataclass
class Measured:
    rate: float  # messages per second, all workers together
    client_cpu_us: float  # client CPU per message (all worker processes)
    server_cpu_us: float | None  # server CPU per message (all its threads), where /proc tells


def process_cpu(pid: int) -> float | None:
    """CPU seconds (user + system, all threads) of process ``pid``, from /proc (Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_workers(target: Callable[..., None], jobs: list[tuple[Any, ...]], server_pid: int) -> Measured:
    """Run ``target(*job, barrier, results)`` in one process per job; messages per second overall.

    Each worker connects and warms up, waits at the barrier, then works and reports
    ``(started, finished, messages, cpu)``; the rate is all messages over first start to last finish.
    """
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(len(jobs) + 1)
    results = context.Queue()
    processes = [context.Process(target=target, args=(*job, barrier, results)) for job in jobs]
    for process in processes:
        process.start()
    try:
        barrier.wait(120)  # every worker connected and warmed up
    except threading.BrokenBarrierError:
        for process in processes:
            process.terminate()
        errors = []
        while not results.empty():
            errors.append(str(results.get()))
        raise SystemExit("the workers did not start:\n" + "\n".join(errors)) from None
    server_before = process_cpu(server_pid)
    reports = [results.get(timeout=600) for _ in processes]
    server_after = process_cpu(server_pid)
    for process in processes:
        process.join(60)
    failed = [r for r in reports if isinstance(r, str)]
    if failed:
        raise SystemExit("a worker failed:\n" + "\n".join(failed))
    started = min(r[0] for r in reports)
    finished = max(r[1] for r in reports)
    messages = sum(r[2] for r in reports)
    server = None if server_before is None or server_after is None else server_after - server_before
    return Measured(
        messages / (finished - started),
        sum(r[3] for r in reports) / messages * 1e6,
        None if server is None else server / messages * 1e6,
    )


def _report(results: Any, work: Callable[[], tuple[float, float, int, float]]) -> None:
    try:
        results.put(work())
    except BaseException as exc:  # reported to the parent, which stops
        import traceback

        results.put(f"{exc!r}\n{traceback.format_exc()}")


def sdk_sender(connection_string: str, queue: str, prefix: str, numbers: range, barrier: Barrier, results: Any) -> None:
    def work() -> tuple[float, float, int, float]:
        with ServiceBusClient.from_connection_string(connection_string) as client:
            with client.get_queue_sender(queue) as sender:
                sender.send_messages(ServiceBusMessage(b"warm-up", message_id=f"warm-{uuid.uuid4()}"))
                barrier.wait(120)
                started, cpu = time.perf_counter(), time.process_time()
                for start in range(numbers.start, numbers.stop, BATCH):
                    batch = sender.create_message_batch()
                    for i in range(start, min(numbers.stop, start + BATCH)):
                        batch.add_message(ServiceBusMessage(BODY, message_id=f"{prefix}-{i}"))
                    sender.send_messages(batch)
                return started, time.perf_counter(), len(numbers), time.process_time() - cpu

    _report(results, work)


def sdk_receiver(connection_string: str, queue: str, count: int, barrier: Barrier, results: Any) -> None:
    def work() -> tuple[float, float, int, float]:
        with ServiceBusClient.from_connection_string(connection_string) as client:
            with client.get_queue_receiver(
                queue, receive_mode=ServiceBusReceiveMode.PEEK_LOCK, prefetch_count=BATCH * 2
            ) as receiver:
                barrier.wait(120)
                received = 0
                started, cpu = time.perf_counter(), time.process_time()
                while received < count:
                    messages = receiver.receive_messages(max_message_count=BATCH, max_wait_time=5)
                    if not messages:
                        break
                    for message in messages:
                        receiver.complete_message(message)
                    received += len(messages)
                return started, time.perf_counter(), received, time.process_time() - cpu

    _report(results, work)


def jetstream_sender(port: int, prefix: str, numbers: range, barrier: Barrier, results: Any) -> None:
    async def publish() -> tuple[float, float, int, float]:
        import nats

        connection = await nats.connect(f"nats://127.0.0.1:{port}")
        try:
            stream = connection.jetstream()
            await stream.publish("bench", b"warm-up", headers={"Nats-Msg-Id": f"warm-{uuid.uuid4()}"})
            barrier.wait(120)
            started, cpu = time.perf_counter(), time.process_time()
            for start in range(numbers.start, numbers.stop, BATCH):
                # JetStream has no atomic batch: the closest equivalent is 100 publishes awaited together
                await asyncio.gather(
                    *(
                        stream.publish("bench", BODY, headers={"Nats-Msg-Id": f"{prefix}-{i}"})
                        for i in range(start, min(numbers.stop, start + BATCH))
                    )
                )
            return started, time.perf_counter(), len(numbers), time.process_time() - cpu
        finally:
            await connection.close()

    _report(results, lambda: asyncio.run(publish()))


# ------------------------------------------------------------------------- JetStream server
def start_nats(workdir: Path, *, sync_always: bool) -> tuple[subprocess.Popen[bytes], int] | str:
    binary = shutil.which("nats-server") or (
        "/usr/sbin/nats-server" if Path("/usr/sbin/nats-server").exists() else None
    )
    if binary is None:
        return "nats-server not found: apt-get install -y nats-server"
    port = free_port()
    store = workdir / ("jetstream-sync" if sync_always else "jetstream")
    config = workdir / ("nats-sync.conf" if sync_always else "nats.conf")
    lines = [f"listen: 127.0.0.1:{port}", "jetstream {", f'  store_dir: "{store}"']
    if sync_always:
        lines.append("  sync_interval: always")
    config.write_text("\n".join([*lines, "}", ""]))
    checked = subprocess.run([binary, "-c", str(config), "-t"], capture_output=True, text=True)
    if checked.returncode != 0:
        return (checked.stderr or checked.stdout).strip().splitlines()[-1]
    process = subprocess.Popen([binary, "-c", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return process, port
        except OSError:
            time.sleep(0.05)
    process.kill()
    return "nats-server did not start"


async def jetstream_stream(port: int) -> None:
    import nats
    from nats.js.api import StorageType, StreamConfig

    connection = await nats.connect(f"nats://127.0.0.1:{port}")
    try:
        await connection.jetstream().add_stream(
            StreamConfig(name="BENCH", subjects=["bench"], storage=StorageType.FILE, duplicate_window=600.0)
        )
    finally:
        await connection.close()


def jetstream_run(workdir: Path, count: int, senders: int, repeat: int, *, sync_always: bool) -> Measured | str:
    started = start_nats(workdir, sync_always=sync_always)
    if isinstance(started, str):
        return started
    process, port = started
    try:
        asyncio.run(jetstream_stream(port))
        return best(
            run_workers(jetstream_sender, [(port, f"r{r}", share) for share in _shares(count, senders)], process.pid)
            for r in range(repeat)
        )
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)


def best(measurements: Iterable[Measured]) -> Measured:
    return max(measurements, key=lambda m: m.rate)


def cpu(measured: Measured) -> str:
    server = "" if measured.server_cpu_us is None else f", server {measured.server_cpu_us:.0f}"
    return f"[CPU us/msg: clients {measured.client_cpu_us:.0f}{server}]"


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000, help="messages per measurement (default 20000)")
    parser.add_argument("--senders", type=int, default=4, help="concurrent sender processes (default 4)")
    parser.add_argument("--receivers", type=int, default=4, help="concurrent receiver processes (default 4)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of each measurement; the best is shown")
    args = parser.parse_args()
    count, senders, receivers, repeat = args.messages, args.senders, args.receivers, args.repeat
    try:
        import nats  # noqa: F401
    except ImportError:
        nats_missing = True
    else:
        nats_missing = False
    print(f"before: {load()}; python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    workdir = Path(tempfile.mkdtemp(prefix="oncebus-bench-"))
    process, connection_string = start_oncebus(workdir)
    offs, ons, receives = [], [], []
    try:

        def send(queue: str, prefix: str) -> Measured:
            jobs = [(connection_string, queue, prefix, share) for share in _shares(count, senders)]
            return run_workers(sdk_sender, jobs, process.pid)

        per_receiver = (count + receivers - 1) // receivers
        for r in range(repeat):  # off and on alternate, so both see the same conditions
            offs.append(send("dedup-off", f"r{r}"))
            ons.append(send("dedup-on", f"r{r}"))
            send("receive", f"r{r}")
            jobs = [(connection_string, "receive", per_receiver)] * receivers
            receives.append(run_workers(sdk_receiver, jobs, process.pid))
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(30)
    off, on, receive = best(offs), best(ons), best(receives)
    workload = f"{count} x 1 KiB, batches of {BATCH}, {senders} sender processes; best of {repeat}"
    print(f"oncebus SDK send, dedup off:          {off.rate:10,.0f} msg/s  ({workload})")
    print(f"oncebus SDK send, dedup on:           {on.rate:10,.0f} msg/s  {cpu(on)}")
    print(f"  ratio dedup on / off:               {on.rate / off.rate:10.2f}")
    print(
        f"oncebus SDK receive + complete:       {receive.rate:10,.0f} msg/s  "
        f"(PEEK_LOCK, prefetch {BATCH * 2}, {receivers} receiver processes) {cpu(receive)}"
    )
    print("  oncebus acknowledges a send after fsync (SQLite synchronous=FULL, group commit)")
    if nats_missing:
        print("JetStream: skipped (nats-py not installed)")
    else:
        for sync_always in (False, True):
            result = jetstream_run(workdir, count, senders, repeat, sync_always=sync_always)
            what = "sync_interval: always (fsync every write)" if sync_always else "default durability"
            if isinstance(result, str):
                print(f"JetStream, {what}: not measured ({result})")
                continue
            print(
                f"JetStream publish, dup window on:     {result.rate:10,.0f} msg/s  "
                f"({what}; same workload) {cpu(result)}"
            )
            print(f"  ratio oncebus (dedup on) / JetStream: {on.rate / result.rate:8.2f}")
            if not sync_always:
                print("  (JetStream acknowledges before its data is synced: its file store syncs on a timer)")
    shutil.rmtree(workdir, ignore_errors=True)
    print(f"after: {load()}")


if __name__ == "__main__":
    main()
