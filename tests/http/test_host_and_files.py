"""Issue 18, item 11: the HTTP doors answer only the names the server answers to (DNS rebinding), and the data
directory and its database are private to the user who runs ``oncebus serve``."""

from __future__ import annotations

import http.client
import stat
import time
from pathlib import Path

import pytest

from oncebus.auth import DEFAULT_KEY, DEFAULT_KEY_NAME, make_token
from tests.http.conftest import Served, start_server


def _request(served: Served, method: str, path: str, host: str, body: bytes = b"") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", served.http_port, timeout=10)
    try:
        uri = f"http://{host}{path}"
        token = make_token(uri, DEFAULT_KEY_NAME, DEFAULT_KEY, int(time.time()) + 600)
        conn.putrequest(method, path, skip_host=True)
        conn.putheader("Host", host)
        conn.putheader("Authorization", token)
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


QUEUE_BODY = (
    b'<entry xmlns="http://www.w3.org/2005/Atom"><content type="application/xml">'
    b'<QueueDescription xmlns="http://schemas.microsoft.com/netservices/2010/10/servicebus/connect"/>'
    b"</content></entry>"
)


def test_a_rebound_name_is_refused_and_changes_nothing(server: Served, name: str) -> None:
    status, body = _request(server, "PUT", f"/{name}?api-version=2021-05", "evil.example:5300", QUEUE_BODY)
    assert status == 403, (status, body)
    assert b"evil.example" in body and b"ONCEBUS_HTTP_ALLOWED_HOSTS" in body, body
    status, _ = _request(server, "GET", "/health", "evil.example")
    assert status == 403
    status, _ = _request(server, "GET", f"/{name}?api-version=2021-05", f"localhost:{server.http_port}")
    assert status == 404  # nothing was created
    for host in (f"localhost:{server.http_port}", "127.0.0.1", f"[::1]:{server.http_port}", "app.localhost"):
        status, _ = _request(server, "GET", "/health", host)
        assert status == 200, host


def test_names_can_be_added(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONCEBUS_HTTP_ALLOWED_HOSTS", "oncebus, .svc.example")
    served = start_server(tmp_path / "data")
    try:
        for host, expected in (("oncebus:5300", 200), ("bus.svc.example", 200), ("other.example", 403)):
            status, _ = _request(served, "GET", "/health", host)
            assert status == expected, host
    finally:
        served.stop()


def test_the_data_directory_and_database_are_private(tmp_path: Path) -> None:
    served = start_server(tmp_path / "data")
    try:
        data = tmp_path / "data"
        assert stat.S_IMODE(data.stat().st_mode) == 0o700, oct(data.stat().st_mode)
        files = [p for p in data.iterdir() if p.name.startswith("oncebus.db")]
        assert {p.name for p in files} >= {"oncebus.db"}
        for path in files:
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, (path.name, oct(path.stat().st_mode))
    finally:
        served.stop()
