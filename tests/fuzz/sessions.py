"""Real SDK sessions recorded byte for byte, replayed (mutated) at a running server, and the checks after each.

A :class:`Recorder` is a TCP proxy between the azure-servicebus SDK and ``oncebus serve``
that keeps what the client wrote, write by write. A recording is a list of
chunks; :func:`split_frames` cuts it into protocol headers and frames, which the
fuzz tests mutate and :func:`replay` sends back, a chunk at a time, waiting for
the server to answer between chunks as the SDK did.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from azure.servicebus import (
    NEXT_AVAILABLE_SESSION,
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
)
from azure.servicebus.amqp import AmqpAnnotatedMessage


@dataclass
class Recording:
    name: str
    chunks: list[bytes] = field(default_factory=list)  # what the client wrote, one entry per proxy read
    # for each chunk: did the server answer before the client's next write (the client waited for it)?
    answered: list[bool] = field(default_factory=list)


class Recorder:
    """A proxy on a free port in front of ``target_port``; each accepted connection is recorded."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.recordings: list[Recording] = []
        self.current = "session"
        self._threads: list[threading.Thread] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target_port))
            recording = Recording(self.current)
            self.recordings.append(recording)
            for source, sink, outgoing in ((client, server, True), (server, client, False)):
                thread = threading.Thread(target=self._pipe, args=(source, sink, recording, outgoing), daemon=True)
                thread.start()
                self._threads.append(thread)

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket, record: Recording, outgoing: bool) -> None:
        try:
            while chunk := source.recv(65536):
                if outgoing:
                    record.chunks.append(chunk)
                    record.answered.append(False)
                elif record.answered:
                    record.answered[-1] = True
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.listener.close()
        for thread in self._threads:
            thread.join(5)

    def connection_string(self, real: str) -> str:
        host_port = real.split("sb://", 1)[1].split(";", 1)[0]
        return real.replace(host_port, f"127.0.0.1:{self.port}")


# ------------------------------------------------------------------------------ the SDK sessions to record
def _send_session(client: ServiceBusClient) -> None:
    with client.get_queue_sender("fuzz") as sender:
        sender.send_messages(ServiceBusMessage(b"one", message_id="f-1", application_properties={"k": 1}))
        sender.send_messages([ServiceBusMessage(f"l{i}", message_id=f"f-l{i}") for i in range(3)])
        batch = sender.create_message_batch()
        for i in range(4):
            batch.add_message(ServiceBusMessage(b"b" * 100, message_id=f"f-b{i}", subject="s", content_type="t"))
        sender.send_messages(batch)
        sender.send_messages(
            AmqpAnnotatedMessage(value_body={b"key": [-1, b"d", False]}, properties={"message_id": "f-value"})
        )
        numbers = sender.schedule_messages(
            [ServiceBusMessage(b"later", message_id="f-later")], datetime.now(UTC) + timedelta(days=1)
        )
        sender.cancel_scheduled_messages(numbers)


def _receive_session(client: ServiceBusClient) -> None:
    with client.get_queue_sender("fuzz") as sender:
        sender.send_messages([ServiceBusMessage(f"r{i}", message_id=f"f-r{i}") for i in range(6)])
    with client.get_queue_receiver("fuzz", max_wait_time=2) as receiver:
        got = receiver.receive_messages(max_message_count=6, max_wait_time=3)
        actions: list[Callable[..., object]] = [
            receiver.complete_message,
            receiver.abandon_message,
            receiver.defer_message,
            receiver.dead_letter_message,
            receiver.renew_message_lock,
            receiver.complete_message,
        ]
        deferred = []
        for message, action in zip(got, actions, strict=False):
            action(message)
            if action == receiver.defer_message:
                deferred.append(message.sequence_number)
        if deferred:
            for message in receiver.receive_deferred_messages(deferred):
                receiver.complete_message(message)
        receiver.peek_messages(max_message_count=5)
    with client.get_queue_receiver("fuzz", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as receiver:
        receiver.receive_messages(max_message_count=20, max_wait_time=1)
    with client.get_queue_receiver("fuzz", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as receiver:
        for message in receiver.receive_messages(max_message_count=5, max_wait_time=1):
            receiver.complete_message(message)


def _session_session(client: ServiceBusClient) -> None:
    with client.get_queue_sender("fuzzsessions") as sender:
        sender.send_messages([ServiceBusMessage(b"s", session_id="s1", message_id=f"f-s{i}") for i in range(2)])
    with client.get_queue_receiver("fuzzsessions", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=2) as receiver:
        session = receiver.session
        assert session is not None
        session.set_state(b"state")
        session.get_state()
        session.renew_lock()
        for message in receiver.receive_messages(max_message_count=2, max_wait_time=2):
            receiver.complete_message(message)


def _topic_session(client: ServiceBusClient) -> None:
    with client.get_topic_sender("fuzztopic") as sender:
        sender.send_messages(ServiceBusMessage(b"t", message_id="f-t", partition_key="p"))
    with client.get_subscription_receiver("fuzztopic", "sub", max_wait_time=2) as receiver:
        for message in receiver.receive_messages(max_message_count=5, max_wait_time=2):
            receiver.complete_message(message)


SESSIONS: dict[str, Callable[[ServiceBusClient], None]] = {
    "send": _send_session,
    "receive": _receive_session,
    "sessions": _session_session,
    "topic": _topic_session,
}


def record_sessions(connection_string: str, port: int) -> list[Recording]:
    """Run each SDK session through a recording proxy; one recording per SDK connection."""
    recorder = Recorder(port)
    try:
        for name, session in SESSIONS.items():
            recorder.current = name
            with ServiceBusClient.from_connection_string(recorder.connection_string(connection_string)) as client:
                session(client)
            time.sleep(0.2)
    finally:
        recorder.close()
    return [r for r in recorder.recordings if r.chunks]


def record_transaction_session(port: int) -> list[Recording]:
    """python-qpid-proton's client through a recording proxy: a coordinator link, a committed transaction (sends,
    a send-via to ``fuzztxn`` through ``fuzz``, a completion), a rolled-back one, and a discharge of an unknown id."""
    import proton

    from tests.amqp.txn_client import RELEASED, TxnClient

    recorder = Recorder(port)
    recorder.current = "transaction"
    try:
        client = TxnClient(recorder.port)
        try:
            client.send("fuzz", proton.Message(body="txn-input", id="txn-input"))
            _, delivery = client.receive("fuzz")
            txn = client.declare()
            client.settle(delivery, txn)
            client.send("fuzz", proton.Message(body="txn-out", id="txn-out"), txn, via="fuzztxn")
            client.send("fuzz", proton.Message(body="txn-direct", id="txn-direct"), txn)
            client.discharge(txn)
            _, delivery = client.receive("fuzz")
            rolled_back = client.declare()
            client.settle(delivery, rolled_back, RELEASED)
            client.send("fuzz", proton.Message(body="txn-never", id="txn-never"), rolled_back)
            client.discharge(rolled_back, fail=True)
            client.discharge(b"unknown")
        finally:
            client.close()
        time.sleep(0.2)
    finally:
        recorder.close()
    return [r for r in recorder.recordings if r.chunks]


JS_SESSIONS = ("send-receive", "dedup", "schedule-peek")
"""Scenarios of tests/js/scenario.js recorded too: the JavaScript SDK speaks AMQP through rhea, another stack."""


def record_js_sessions(connection_string: str, port: int, node: str) -> list[Recording]:
    """Run the JavaScript SDK's scenarios through a recording proxy (the queues js-plain, js-dedup, js-sched)."""
    scenario = Path(__file__).resolve().parents[1] / "js" / "scenario.js"
    recorder = Recorder(port)
    try:
        for name in JS_SESSIONS:
            recorder.current = "js-" + name
            env = dict(os.environ, ONCEBUS_CONNECTION_STRING=recorder.connection_string(connection_string))
            result = subprocess.run(
                [node, str(scenario), name], cwd=scenario.parent, env=env, capture_output=True, text=True, timeout=60
            )
            if result.returncode != 0:
                raise RuntimeError(f"the JS scenario {name} failed through the recorder:\n{result.stderr[-2000:]}")
            time.sleep(0.2)
    finally:
        recorder.close()
    return [r for r in recorder.recordings if r.chunks]


# ------------------------------------------------------------------------------ cutting and replaying
def split_frames(data: bytes) -> list[bytes]:
    """Protocol headers and frames, in order (a malformed tail is kept as one last piece)."""
    pieces = []
    offset = 0
    while offset < len(data):
        if data[offset : offset + 4] == b"AMQP":
            pieces.append(data[offset : offset + 8])
            offset += 8
            continue
        if len(data) - offset < 8:
            break
        (size,) = struct.unpack_from(">I", data, offset)
        if size < 8 or offset + size > len(data):
            break
        pieces.append(data[offset : offset + size])
        offset += size
    if offset < len(data):
        pieces.append(data[offset:])
    return pieces


@dataclass
class Write:
    """One write of the client: its pieces (protocol headers and frames), and whether it waited for an answer."""

    pieces: list[bytes]
    answered: bool


def writes_of(recording: Recording) -> list[Write]:
    return [Write(split_frames(c), a) for c, a in zip(recording.chunks, recording.answered, strict=True)]


@dataclass
class ReplayResult:
    closed_by_server: bool
    received: int


def replay(port: int, writes: list[Write], *, answer_wait: float = 0.15, linger: float = 0.05) -> ReplayResult:
    """Send each write; where the SDK waited for the server's answer, wait for it too (at most ``answer_wait``)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    received = 0
    closed = False
    try:
        for write in writes:
            data = b"".join(write.pieces)
            if not data:
                continue
            try:
                sock.sendall(data)
            except OSError:
                closed = True
                break
            received, closed = _drain(sock, answer_wait if write.answered else 0.0, received)
            if closed:
                break
        if not closed:
            received, closed = _drain(sock, linger, received)
    finally:
        sock.close()
    return ReplayResult(closed, received)


def _drain(sock: socket.socket, wait: float, received: int) -> tuple[int, bool]:
    """Wait up to ``wait`` s for the server to say something, then read what is there; (bytes, closed)."""
    deadline = time.monotonic() + wait
    got_some = False
    while True:
        remaining = deadline - time.monotonic()
        sock.settimeout(max(remaining, 0.0) if not got_some else 0.0)
        try:
            chunk = sock.recv(65536)
        except (TimeoutError, BlockingIOError):
            return received, False
        except OSError:
            return received, True
        if not chunk:
            return received, True
        received += len(chunk)
        got_some = True


# ------------------------------------------------------------------------------ the checks after each example
class Checker:
    """Another client that must keep working: a ledger of acknowledged sends and a probe round trip."""

    def __init__(self, connection_string: str) -> None:
        self.client = ServiceBusClient.from_connection_string(connection_string)
        self.ledger_sender = self.client.get_queue_sender("ledger")
        self.probe_sender = self.client.get_queue_sender("probe")
        self.probe_receiver = self.client.get_queue_receiver("probe", max_wait_time=5)
        self.acknowledged: list[str] = []
        self.round_trips = 0

    def check(self) -> None:
        """One acknowledged send to the ledger, and a send and receive that must succeed."""
        tag = f"l-{len(self.acknowledged)}"
        self.ledger_sender.send_messages(ServiceBusMessage(tag, message_id=tag))
        self.acknowledged.append(tag)  # send_messages returned: the server acknowledged it
        probe = f"p-{self.round_trips}"
        self.probe_sender.send_messages(ServiceBusMessage(probe, message_id=probe))
        got = self.probe_receiver.receive_messages(max_message_count=1, max_wait_time=10)
        assert [str(m) for m in got] == [probe], f"the probe round trip failed: {got}"
        self.probe_receiver.complete_message(got[0])
        self.round_trips += 1

    def close(self) -> None:
        for handler in (self.ledger_sender, self.probe_sender, self.probe_receiver):
            with contextlib.suppress(Exception):
                handler.close()
        self.client.close()


def drain_ids(connection_string: str, queue: str) -> Iterator[str]:
    with ServiceBusClient.from_connection_string(connection_string) as client:
        with client.get_queue_receiver(queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as receiver:
            while batch := receiver.receive_messages(max_message_count=100, max_wait_time=2):
                for message in batch:
                    yield str(message.message_id)
