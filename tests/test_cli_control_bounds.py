"""Issue 18, item 9: the control socket checks the token before it reads a large line, and bounds its connections."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator

import pytest

from oncebus.server.control import MAX_CONTROL_CONNECTIONS
from tests.cli_support import Serve, oncebus


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    serve = Serve(tmp_path_factory.mktemp("control-bounds") / "data").start()
    yield serve
    assert serve.alive(), serve.output()
    assert serve.stop() == 0


def _connect(serve: Serve) -> socket.socket:
    return socket.create_connection(("127.0.0.1", int(serve.info()["control_port"])), timeout=5)


def test_a_long_line_without_the_token_is_refused_before_it_is_read(server: Serve) -> None:
    sock = _connect(server)
    try:
        sock.sendall(b'{"token": "not-the-token", "op": "ping", "args": "')
        chunk = b"x" * 65536
        with contextlib.suppress(OSError):  # the server stops reading and closes: the rest cannot be sent
            for _ in range(16 * 16):  # up to 16 MiB, never ended by a newline
                sock.sendall(chunk)
        reply = json.loads(sock.makefile("rb").readline())
    finally:
        sock.close()
    assert reply["ok"] is False and reply["error"] == "UnauthorizedError", reply
    assert "must start with the control token" in reply["message"], reply
    assert oncebus("queue", "list", data_dir=server.data_dir).returncode == 0


def test_control_connections_are_bounded_and_the_cli_still_gets_in(server: Serve) -> None:
    held = [_connect(server) for _ in range(2 * MAX_CONTROL_CONNECTIONS)]
    try:
        for sock in held:
            sock.sendall(b'{"tok')  # never finished, never shows the token
        time.sleep(0.5)
        assert oncebus("queue", "list", data_dir=server.data_dir).returncode == 0
        still_open = 0
        for sock in held:
            sock.setblocking(False)
            try:
                still_open += sock.recv(1) != b""
            except BlockingIOError:
                still_open += 1
            except OSError:
                pass
        assert still_open <= MAX_CONTROL_CONNECTIONS, still_open
    finally:
        for sock in held:
            sock.close()
