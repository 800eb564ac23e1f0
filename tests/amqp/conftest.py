"""The real azure-servicebus SDK against ``oncebus serve`` run as a subprocess on a free port."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import azure.servicebus
import pytest

START_TIMEOUT = 30.0
# the azure-servicebus under test: CI runs these tests with 7.15 and 7.14 (.ci/run)
SDK_VERSION = tuple(int(part) for part in azure.servicebus.__version__.split(".")[:2])


def topology(queues: dict[str, dict[str, Any]], topics: dict[str, tuple[dict[str, Any], dict[str, Any]]]) -> dict:
    """An emulator-format config.json: queues {name: Properties}, topics {name: (Properties, {sub: Properties})}."""
    return {
        "UserConfig": {
            "Namespaces": [
                {
                    "Name": "sbemulatorns",
                    "Queues": [{"Name": name, "Properties": props} for name, props in queues.items()],
                    "Topics": [
                        {
                            "Name": name,
                            "Properties": props,
                            "Subscriptions": [{"Name": sub, "Properties": sp} for sub, sp in subs.items()],
                        }
                        for name, (props, subs) in topics.items()
                    ],
                }
            ]
        }
    }


class ServerProcess:
    """``oncebus serve`` on a temp data dir (optionally on a test clock file); restartable on the same dir."""

    def __init__(
        self,
        data_dir: Path,
        config: dict | None = None,
        *,
        clock_file: Path | None = None,
        env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
    ) -> None:
        self.data_dir = data_dir
        self.env = dict(env or {})
        self.args = args  # more serve options (e.g. --cluster)
        self.config_file: Path | None = None
        if config is not None:
            self.config_file = data_dir.parent / f"{data_dir.name}-config.json"
            self.config_file.write_text(json.dumps(config))
        self.clock_file = clock_file
        self.process: subprocess.Popen[str] | None = None
        self.connection_string = ""
        self.output: list[str] = []

    def command(self) -> list[str]:
        cmd = [sys.executable, "-c", "import sys; from oncebus.cli import main; sys.exit(main())"]
        cmd += ["--data-dir", str(self.data_dir), "serve", "--port", "0"]
        return cmd + (["--config", str(self.config_file)] if self.config_file else []) + list(self.args)

    def start(self) -> ServerProcess:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("ONCEBUS_CLOCK_FILE", None)
        env.update(self.env)  # e.g. ONCEBUS_AMQP_HANDSHAKE_TIMEOUT: the AMQP limits (oncebus.amqp.limits)
        if self.clock_file is not None:  # the broker's time is read from this file (integer microseconds)
            env["ONCEBUS_CLOCK_FILE"] = str(self.clock_file)
        self.process = subprocess.Popen(
            self.command(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        ready = threading.Event()

        def read() -> None:
            assert self.process is not None and self.process.stdout is not None
            for line in self.process.stdout:
                self.output.append(line.rstrip())
                if line.startswith("connection string: "):
                    self.connection_string = line.split(": ", 1)[1].strip()
                if line.strip() == "ready":
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(START_TIMEOUT) or not self.connection_string:
            self.stop()
            raise RuntimeError("oncebus serve did not start:\n" + "\n".join(self.output))
        return self

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def cli(self, *args: str) -> str:
        cmd = [sys.executable, "-c", "import sys; from oncebus.cli import main; sys.exit(main())"]
        result = subprocess.run(
            [*cmd, "--data-dir", str(self.data_dir), *args], capture_output=True, text=True, timeout=60
        )
        if result.returncode != 0:
            raise RuntimeError(f"oncebus {' '.join(args)} failed: {result.stdout}{result.stderr}")
        return result.stdout

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def port(self) -> int:
        return int(self.connection_string.split("sb://", 1)[1].split(";", 1)[0].rsplit(":", 1)[1])

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wrong_key_connection_string(self) -> str:
        return self.connection_string.replace("SharedAccessKey=SAS_KEY_VALUE", "SharedAccessKey=not-the-key")


class TestClock:
    """Writes the broker's time (microseconds since the epoch) to the file ``ONCEBUS_CLOCK_FILE`` names."""

    __test__ = False

    def __init__(self, path: Path) -> None:
        self.path = path
        self.now_us = time.time_ns() // 1000
        self.set(self.now_us)

    def set(self, now_us: int) -> None:
        assert now_us >= self.now_us, "the broker's clock only moves forward"
        self.now_us = now_us
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(str(now_us))
        temporary.replace(self.path)


QUEUES: dict[str, dict[str, Any]] = {
    "plain": {},
    "dedup": {"RequiresDuplicateDetection": True, "DuplicateDetectionHistoryTimeWindow": "PT10M"},
    "lookalike": {"RequiresDuplicateDetection": True},
    "modes": {},
    "prefetch": {},
    "iterate": {},
    "settle": {"MaxDeliveryCount": 5},
    "scheduled": {"RequiresDuplicateDetection": True},
    "peek": {},
    "locks": {"LockDuration": "PT5S"},
    "lost": {"LockDuration": "PT5S"},
    "renew": {"LockDuration": "PT10S"},
    "renewaio": {"LockDuration": "PT10S"},
    "small": {"MaxMessageSizeInKilobytes": 64},
    "shrinking": {},
    "badinput": {"RequiresDuplicateDetection": True},
    "sessions": {"RequiresSession": True},
    "nextsession": {"RequiresSession": True},
    "sessionlost": {"RequiresSession": True, "LockDuration": "PT5S"},
    "aio": {"RequiresDuplicateDetection": True},
    "restart": {"RequiresDuplicateDetection": True},
    "window20": {"RequiresDuplicateDetection": True, "DuplicateDetectionHistoryTimeWindow": "PT20S"},
    "valuebody": {},
    "typedids": {"RequiresDuplicateDetection": True},
    "badfields": {"RequiresDuplicateDetection": True},
}
TOPICS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "events": ({"RequiresDuplicateDetection": True}, {"audit": {}, "billing": {}}),
}


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("oncebus")
    process = ServerProcess(base / "data", topology(QUEUES, TOPICS)).start()
    yield process
    process.stop()


@pytest.fixture
def connection_string(server: ServerProcess) -> str:
    """Read at each test: a test that restarts the session's server (on a new free port) changes it, and with
    pytest-xdist the files a worker runs come in any order."""
    return server.connection_string
