"""``oncebus serve`` as a subprocess on free ports and a temp data dir; tests use only what it prints."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

START_TIMEOUT = 30.0


@dataclass
class Served:
    """What ``oncebus serve`` printed: the connection string, its ports and the CA file."""

    process: subprocess.Popen[str]
    data_dir: Path
    connection_string: str = ""
    port: int = 0
    tls_port: int = 0
    http_port: int = 0
    ca_file: str = ""
    output: list[str] = field(default_factory=list)

    def tls_connection_string(self) -> str:
        """A real-Azure-style string (TLS): what a user who only swapped the host would have."""
        return self.connection_string.replace(";UseDevelopmentEmulator=true", "")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def start_server(data_dir: Path, *extra: str) -> Served:
    cmd = [sys.executable, "-c", "import sys; from oncebus.cli import main; sys.exit(main())"]
    cmd += ["--data-dir", str(data_dir), "serve", "--port", "0", *extra]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("ONCEBUS_CLOCK_FILE", None)
    env.pop("REQUESTS_CA_BUNDLE", None)
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    served = Served(process, data_dir)
    ready = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            line = line.rstrip()
            served.output.append(line)
            if m := re.match(r"AMQP on [^ ]+:(\d+) ", line):
                served.port = int(m.group(1))
            elif m := re.match(r"TLS on [^ ]+:(\d+) ", line):
                served.tls_port = int(m.group(1))
            elif m := re.match(r"HTTP on [^ ]+:(\d+) ", line):
                served.http_port = int(m.group(1))
            elif line.startswith("connection string: "):
                served.connection_string = line.split(": ", 1)[1]
            elif line.startswith("CA certificate: "):
                served.ca_file = line.split(": ", 1)[1].split(" (", 1)[0]
            elif line == "ready":
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(START_TIMEOUT) or not served.connection_string:
        served.stop()
        raise RuntimeError("oncebus serve did not start:\n" + "\n".join(served.output))
    return served


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    served = start_server(tmp_path_factory.mktemp("http-serve") / "data")
    yield served
    served.stop()


@pytest.fixture
def name() -> str:
    """A fresh entity name per test (the server is shared by the session)."""
    return "t-" + uuid.uuid4().hex[:10]


def trust_ca_for_old_sdks(ca_file: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """azure-servicebus 7.14 drops ``connection_verify`` for its administration client (it builds the
    transport without the client's keyword arguments): trust the CA the other documented way, by environment
    (``REQUESTS_CA_BUNDLE`` for requests, ``SSL_CERT_FILE`` for aiohttp's default context)."""
    from azure.servicebus import __version__ as sdk_version

    if tuple(int(part) for part in sdk_version.split(".")[:2]) < (7, 15):
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", ca_file)
        monkeypatch.setenv("SSL_CERT_FILE", ca_file)
