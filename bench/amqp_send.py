"""One run: azure-servicebus SDK throughput against ``oncebus serve``, and the same send workload on NATS JetStream.

Prints (never asserts):
- SDK send throughput, batches of 100 messages with 1 KiB bodies and unique
  message ids, duplicate detection on versus off (ratio on / off);
- receive-and-complete throughput (PEEK_LOCK, prefetch, complete each message);
- the same send workload on NATS JetStream with its duplicate window
  (``Nats-Msg-Id``; nats-py; ``nats-server`` from Debian's package, started on
  a free loopback port with file storage), as the ratio oncebus / JetStream.

Usage: ``python bench/amqp_send.py [--messages 20000]``. Needs ``nats-py`` and
``nats-server`` for the JetStream part (skipped with a note otherwise).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

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


def sdk_send(connection_string: str, queue: str, count: int) -> float:
    """Messages per second for ``count`` messages sent as batches of 100."""
    with ServiceBusClient.from_connection_string(connection_string) as client:
        with client.get_queue_sender(queue) as sender:
            sender.send_messages(ServiceBusMessage(b"warm-up", message_id=f"warm-{uuid.uuid4()}"))
            started = time.perf_counter()
            for start in range(0, count, BATCH):
                batch = sender.create_message_batch()
                for i in range(start, min(count, start + BATCH)):
                    batch.add_message(ServiceBusMessage(BODY, message_id=f"{queue}-{i}"))
                sender.send_messages(batch)
            return count / (time.perf_counter() - started)


def sdk_receive_and_complete(connection_string: str, queue: str, count: int) -> float:
    with ServiceBusClient.from_connection_string(connection_string) as client:
        with client.get_queue_receiver(
            queue, receive_mode=ServiceBusReceiveMode.PEEK_LOCK, prefetch_count=BATCH * 2
        ) as receiver:
            received = 0
            started = time.perf_counter()
            while received < count:
                messages = receiver.receive_messages(max_message_count=BATCH, max_wait_time=5)
                if not messages:
                    break
                for message in messages:
                    receiver.complete_message(message)
                received += len(messages)
            return received / (time.perf_counter() - started)


def start_nats(workdir: Path) -> tuple[subprocess.Popen[bytes], int] | None:
    binary = shutil.which("nats-server") or (
        "/usr/sbin/nats-server" if Path("/usr/sbin/nats-server").exists() else None
    )
    if binary is None:
        return None
    port = free_port()
    process = subprocess.Popen(
        [binary, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(workdir / "jetstream")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return process, port
        except OSError:
            time.sleep(0.05)
    process.kill()
    return None


async def jetstream_send(port: int, count: int) -> float:
    import nats
    from nats.js.api import StorageType, StreamConfig

    connection = await nats.connect(f"nats://127.0.0.1:{port}")
    try:
        stream = connection.jetstream()
        await stream.add_stream(
            StreamConfig(name="BENCH", subjects=["bench"], storage=StorageType.FILE, duplicate_window=600.0)
        )
        await stream.publish("bench", b"warm-up", headers={"Nats-Msg-Id": f"warm-{uuid.uuid4()}"})
        started = time.perf_counter()
        for start in range(0, count, BATCH):
            # JetStream has no atomic batch: the closest equivalent is 100 publishes awaited together
            await asyncio.gather(
                *(
                    stream.publish("bench", BODY, headers={"Nats-Msg-Id": f"bench-{i}"})
                    for i in range(start, min(count, start + BATCH))
                )
            )
        return count / (time.perf_counter() - started)
    finally:
        await connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000, help="messages per measurement (default 20000)")
    args = parser.parse_args()
    count = args.messages
    workdir = Path(tempfile.mkdtemp(prefix="oncebus-bench-"))
    process, connection_string = start_oncebus(workdir)
    try:
        off = sdk_send(connection_string, "dedup-off", count)
        on = sdk_send(connection_string, "dedup-on", count)
        sdk_send(connection_string, "receive", count)
        receive = sdk_receive_and_complete(connection_string, "receive", count)
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(30)
    print(f"oncebus SDK send, dedup off:        {off:10,.0f} msg/s  ({count} x 1 KiB, batches of {BATCH})")
    print(f"oncebus SDK send, dedup on:         {on:10,.0f} msg/s")
    print(f"  ratio dedup on / off:             {on / off:10.2f}")
    print(f"oncebus SDK receive + complete:     {receive:10,.0f} msg/s  (PEEK_LOCK, prefetch {BATCH * 2})")
    nats_server = start_nats(workdir)
    if nats_server is None:
        print("JetStream: skipped (nats-server not found: apt-get install -y nats-server)")
    else:
        nats_process, port = nats_server
        try:
            try:
                jetstream = asyncio.run(jetstream_send(port, count))
            except ImportError:
                print("JetStream: skipped (nats-py not installed)")
                return
        finally:
            nats_process.send_signal(signal.SIGTERM)
            nats_process.wait(30)
        print(f"JetStream publish, dup window on:   {jetstream:10,.0f} msg/s  (Nats-Msg-Id, file storage)")
        print(f"  ratio oncebus (dedup on) / JetStream: {on / jetstream:6.2f}")
    shutil.rmtree(workdir, ignore_errors=True)
    print(f"(python {sys.version.split()[0]}, {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
