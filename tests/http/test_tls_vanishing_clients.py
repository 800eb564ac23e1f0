"""A client on TLS that goes away without AMQP's close, or whose connection a fault drops, is let go quietly.

Closing an asyncio TLS transport a second time empties it, and the connection's shutdown asked the emptied
transport for its write buffer: every TLS client reset mid-connection, and every ``lost-ack`` or
``drop-connection`` fault on a TLS connection, logged an AttributeError traceback, and the rest of the
shutdown (timers, writers waiting for the socket) was skipped. Celery's kombu transport talks TLS to 5671, so
a user arming ``lost-ack`` against it met the traceback (docs/celery.md).
"""

from __future__ import annotations

import json
import socket
import ssl
import struct
import subprocess
import sys
import time

from azure.servicebus import ServiceBusClient, ServiceBusMessage, TransportType

from tests.http.conftest import Served

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
BROKEN = ("Traceback", "Exception in callback", "connection task failed")


def _cli(server: Served, *args: str) -> str:
    cmd = [sys.executable, "-c", "import sys; from oncebus.cli import main; sys.exit(main())"]
    done = subprocess.run(
        [*cmd, "--data-dir", str(server.data_dir), *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _broken_lines(server: Served, since: int, wait: float = 2.0) -> list[str]:
    """Log lines since ``since`` that tell of a failure, waiting up to ``wait`` s for one to show."""
    deadline = time.monotonic() + wait
    while True:
        broken = [line for line in server.output[since:] if any(word in line for word in BROKEN)]
        if broken or time.monotonic() > deadline:
            return broken
        time.sleep(0.1)


def test_a_tls_client_that_resets_or_ends_mid_connection_leaves_no_traceback(server: Served) -> None:
    since = len(server.output)
    context = ssl.create_default_context(cafile=server.ca_file)
    for reset in (True, False):
        with (
            socket.create_connection(("127.0.0.1", server.tls_port), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            tls.sendall(SASL_HEADER)
            assert tls.recv(8) == SASL_HEADER  # the server is in the middle of the SASL exchange
            if reset:  # closing now sends a reset, not an orderly end
                tls.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    assert _broken_lines(server, since) == []


def test_a_lost_ack_on_a_tls_connection_drops_it_quietly_and_the_resend_is_a_duplicate(
    server: Served, name: str
) -> None:
    _cli(server, "queue", "create", name, "--duplicate-detection")
    _cli(server, "fault", "arm", "lost-ack", "--entity", name)  # how=drop: the connection is cut after the commit
    since = len(server.output)
    with (
        ServiceBusClient.from_connection_string(
            server.tls_connection_string(),
            custom_endpoint_address=f"sb://127.0.0.1:{server.tls_port}",
            transport_type=TransportType.Amqp,
            connection_verify=server.ca_file,
            retry_backoff_factor=0.02,
        ) as client,
        client.get_queue_sender(name) as sender,
    ):
        sender.send_messages(ServiceBusMessage("once", message_id="m-1"))  # the SDK resends after the drop
    [row] = json.loads(_cli(server, "stats", name, "--json"))
    assert (row["accepted"], row["duplicates_dropped"]) == (1, 1), row
    assert any(f"lost-ack) fired on {name}" in line for line in server.output[since:])
    assert _broken_lines(server, since) == []
