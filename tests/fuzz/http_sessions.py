"""Real ServiceBusAdministrationClient requests recorded as plain HTTP, cut into requests, replayed mutated.

The administration client speaks HTTPS to the port of the connection string. The
:class:`TlsRecorder` stands there instead: it terminates TLS with the server's own
certificate (from the data directory, so the client trusts it with the same CA
file), keeps the plaintext the client wrote, and forwards it to the server's plain
HTTP port. What it kept is cut into requests (head and body, by Content-Length),
which the HTTP fuzz test mutates and sends back.
"""

from __future__ import annotations

import contextlib
import re
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from azure.servicebus.management import ServiceBusAdministrationClient, SqlRuleFilter

from oncebus.server.certs import CA_FILE, SERVER_FILE, SERVER_KEY_FILE, TLS_DIR


@dataclass(frozen=True)
class Request:
    head: bytes  # request line and headers, up to and including the blank line
    body: bytes

    @property
    def raw(self) -> bytes:
        return self.head + self.body


class TlsRecorder:
    """A TLS proxy on a free port: plaintext in from the client, recorded, plain HTTP out to ``http_port``."""

    def __init__(self, data_dir: Path, http_port: int) -> None:
        tls = Path(data_dir) / TLS_DIR
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(tls / SERVER_FILE, tls / SERVER_KEY_FILE)
        self.ca_file = str(tls / CA_FILE)
        self.http_port = http_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.written: list[bytes] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                raw, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        try:
            client = self.context.wrap_socket(raw, server_side=True)
        except (OSError, ssl.SSLError):
            raw.close()
            return
        upstream = socket.create_connection(("127.0.0.1", self.http_port))
        record = bytearray()
        back = threading.Thread(target=self._pipe, args=(upstream, client), daemon=True)
        back.start()
        try:
            while chunk := client.recv(65536):
                record += chunk
                upstream.sendall(chunk)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                upstream.shutdown(socket.SHUT_WR)
            back.join(5)
            client.close()
            upstream.close()
            with self._lock:
                self.written.append(bytes(record))

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass

    def close(self) -> None:
        self.listener.close()

    def connection_string(self, real: str) -> str:
        host_port = real.split("sb://", 1)[1].split(";", 1)[0]
        return real.replace(host_port, f"127.0.0.1:{self.port}")


def split_requests(data: bytes) -> list[Request]:
    """HTTP/1.1 requests in order, each with the body its Content-Length names."""
    requests = []
    offset = 0
    while (end := data.find(b"\r\n\r\n", offset)) >= 0:
        head = data[offset : end + 4]
        match = re.search(rb"\r\ncontent-length:\s*(\d+)", head, re.IGNORECASE)
        length = int(match.group(1)) if match else 0
        requests.append(Request(head, data[end + 4 : end + 4 + length]))
        offset = end + 4 + length
    return requests


def admin_session(admin: ServiceBusAdministrationClient) -> None:
    """What a user does with the administration client: every kind of entity and rule, created to deleted."""
    admin.get_namespace_properties()
    admin.create_queue(
        "rec-q",
        requires_duplicate_detection=True,
        duplicate_detection_history_time_window=timedelta(seconds=30),
        lock_duration=timedelta(seconds=20),
        max_delivery_count=4,
    )
    queue = admin.get_queue("rec-q")
    queue.duplicate_detection_history_time_window = timedelta(minutes=5)
    admin.update_queue(queue)
    admin.get_queue_runtime_properties("rec-q")
    list(admin.list_queues())
    admin.create_topic("rec-t", requires_duplicate_detection=True, enable_partitioning=True)
    admin.create_subscription(
        "rec-t", "rec-s", max_delivery_count=3, forward_to="rec-q"
    )  # no sessions: Azure refuses both
    admin.create_rule("rec-t", "rec-s", "rec-r", filter=SqlRuleFilter("color = 'red' AND size > 3"))
    list(admin.list_rules("rec-t", "rec-s"))
    list(admin.list_subscriptions_runtime_properties("rec-t"))
    admin.delete_rule("rec-t", "rec-s", "rec-r")
    admin.delete_subscription("rec-t", "rec-s")
    admin.delete_topic("rec-t")
    admin.delete_queue("rec-q")


def record_admin_requests(connection_string: str, data_dir: Path, http_port: int) -> list[Request]:
    recorder = TlsRecorder(data_dir, http_port)
    try:
        with ServiceBusAdministrationClient.from_connection_string(
            recorder.connection_string(connection_string), connection_verify=recorder.ca_file
        ) as admin:
            admin_session(admin)
        time.sleep(0.2)
    finally:
        recorder.close()
    return [request for written in recorder.written for request in split_requests(written)]
