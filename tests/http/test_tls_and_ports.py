"""AMQP over TLS (the SDK's data plane) on the shared port and the TLS port; /health on every port.

A user with ``UseDevelopmentEmulator=false`` (a real Azure string with the host
swapped) gets TLS on 5671: the SDK drops the endpoint's port. Tests cannot
take the fixed 5671, so they point the SDK at the free port printed by the
server with ``custom_endpoint_address`` (the SDK's own way to reach a given
host and port; with ``transport_type=TransportType.Amqp``, as it means WebSockets
otherwise), and trust the printed CA with ``connection_verify``.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusMessageBatch, TransportType
from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient
from azure.servicebus.management import ServiceBusAdministrationClient

from tests.http.conftest import Served


def _tls_client(server: Served, port: int) -> ServiceBusClient:
    return ServiceBusClient.from_connection_string(
        server.tls_connection_string(),
        custom_endpoint_address=f"sb://127.0.0.1:{port}",
        transport_type=TransportType.Amqp,  # custom_endpoint_address alone means WebSockets
        connection_verify=server.ca_file,
    )


def _create(server: Served, name: str) -> None:
    with ServiceBusAdministrationClient.from_connection_string(
        server.connection_string, connection_verify=server.ca_file
    ) as admin:
        admin.create_queue(name, requires_duplicate_detection=True)


@pytest.mark.parametrize("which", ["shared", "tls"])
def test_sdk_over_tls_send_receive_and_dedup(server: Served, name: str, which: str) -> None:
    port = server.port if which == "shared" else server.tls_port
    _create(server, name)
    with _tls_client(server, port) as client:
        with client.get_queue_sender(name) as sender:
            sender.send_messages(ServiceBusMessage("one", message_id="a"))
            sender.send_messages(ServiceBusMessage("one again", message_id="a"))  # a duplicate: dropped
            batch: ServiceBusMessageBatch = sender.create_message_batch()
            for mid in ("b", "c", "b"):
                batch.add_message(ServiceBusMessage(f"batch {mid}", message_id=mid))
            sender.send_messages(batch)
            sender.schedule_messages(ServiceBusMessage("later", message_id="d"), _in_an_hour())
        with client.get_queue_receiver(name, max_wait_time=3) as receiver:
            received = []
            for _ in range(5):
                got = receiver.receive_messages(max_message_count=10, max_wait_time=3)
                for message in got:
                    receiver.complete_message(message)
                received += [(m.message_id, str(m)) for m in got]
                if len(received) >= 3:
                    break
            assert sorted(received) == [("a", "one"), ("b", "batch b"), ("c", "batch c")]
            assert [m.message_id for m in receiver.peek_messages(5)] == ["d"]


def test_sdk_aio_over_tls(server: Served, name: str) -> None:
    _create(server, name)

    async def scenario() -> None:
        async with AsyncServiceBusClient.from_connection_string(
            server.tls_connection_string(),
            custom_endpoint_address=f"sb://127.0.0.1:{server.tls_port}",
            transport_type=TransportType.Amqp,
            connection_verify=server.ca_file,
        ) as client:
            async with client.get_queue_sender(name) as sender:
                await sender.send_messages(
                    [ServiceBusMessage("x", message_id="1"), ServiceBusMessage("x", message_id="1")]
                )
            async with client.get_queue_receiver(name, max_wait_time=3) as receiver:
                got = await receiver.receive_messages(max_message_count=10, max_wait_time=3)
                assert [m.message_id for m in got] == ["1"]
                await receiver.complete_message(got[0])

    asyncio.run(scenario())


def test_tls_with_an_untrusted_ca_fails_cleanly(server: Served, name: str) -> None:
    """Without the CA the handshake fails on the client's side: TLS is real, not a pass-through."""
    from azure.core.exceptions import ServiceRequestError

    with ServiceBusAdministrationClient.from_connection_string(server.connection_string) as admin:
        with pytest.raises(ServiceRequestError):
            admin.get_queue(name)


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_health_on_every_port(server: Served) -> None:
    urls = [
        f"http://127.0.0.1:{server.port}/health",
        f"https://127.0.0.1:{server.port}/health",
        f"https://localhost:{server.tls_port}/health",
        f"http://127.0.0.1:{server.http_port}/health",
    ]
    for url in urls:
        done = subprocess.run(
            ["curl", "-sS", "--max-time", "10", "--cacert", server.ca_file, url], capture_output=True, text=True
        )
        assert done.returncode == 0, (url, done.stderr)
        assert '"status": "ok"' in done.stdout, url
    # the TLS port takes only TLS, the HTTP port only plain HTTP
    plain_on_tls = subprocess.run(
        ["curl", "-sS", "--max-time", "10", f"http://127.0.0.1:{server.tls_port}/health"], capture_output=True
    )
    assert plain_on_tls.returncode != 0


def _in_an_hour():  # type: ignore[no-untyped-def]
    from datetime import UTC, datetime, timedelta

    return datetime.now(UTC) + timedelta(hours=1)
