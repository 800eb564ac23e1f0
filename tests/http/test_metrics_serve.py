"""``oncebus serve`` serves /metrics and the dashboard on every HTTP door: the HTTP port, and HTTP and HTTPS on the
shared main port; the counters move as the real SDK sends."""

from __future__ import annotations

import json
import ssl
import urllib.request
from pathlib import Path

from azure.servicebus import ServiceBusClient, ServiceBusMessage
from prometheus_client.parser import text_string_to_metric_families

from tests.cli_support import oncebus
from tests.http.conftest import start_server
from tests.http.observe_server import samples


def _get(url: str, ca_file: str | None = None) -> tuple[int, str, bytes]:
    context = ssl.create_default_context(cafile=ca_file) if ca_file else None
    with urllib.request.urlopen(url, timeout=20, context=context) as response:
        return response.status, response.headers["content-type"], response.read()


def test_metrics_and_dashboard_on_every_http_door(tmp_path: Path) -> None:
    served = start_server(tmp_path / "data")
    try:
        created = oncebus("queue", "create", "orders", "--duplicate-detection", data_dir=served.data_dir)
        assert created.returncode == 0, created.stderr
        with ServiceBusClient.from_connection_string(served.connection_string) as client:
            with client.get_queue_sender("orders") as sender:
                for _ in range(3):
                    sender.send_messages(ServiceBusMessage("x", message_id="order-1"))
                doors = [
                    f"http://127.0.0.1:{served.http_port}",
                    f"http://127.0.0.1:{served.port}",
                    f"https://127.0.0.1:{served.port}",
                    f"https://localhost:{served.tls_port}",
                ]
                for door in doors:
                    ca = served.ca_file if door.startswith("https") else None
                    status, content_type, body = _get(door + "/metrics", ca)
                    assert status == 200 and content_type.startswith("text/plain; version="), door
                    got = samples(text_string_to_metric_families(body.decode()))
                    assert got[("oncebus_messages_accepted_total", (("entity", "orders"),))] == 1, door
                    assert got[("oncebus_duplicates_dropped_total", (("entity", "orders"),))] == 2, door
                    assert got[("oncebus_connections_open", ())] >= 1, door  # the sender's connection
                    assert got[("oncebus_links_open", ())] >= 1, door
                    assert got[("oncebus_store_commit_seconds_count", ())] >= 2, door
                    status, content_type, body = _get(door + "/", ca)
                    assert status == 200 and content_type.startswith("text/html") and b"dashboard.js" in body, door
                    status, content_type, body = _get(door + "/api/dashboard", ca)
                    state = json.loads(body)
                    (orders,) = [e for e in state["entities"] if e["name"] == "orders"]
                    assert (orders["accepted"], orders["duplicates_dropped"], orders["keys_held"]) == (1, 2, 1), door
        status, _, body = _get(f"http://127.0.0.1:{served.http_port}/health")
        assert status == 200 and json.loads(body)["status"] == "ok"  # the HTTP app's own routes still answer
    finally:
        served.stop()
