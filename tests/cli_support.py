"""Running the ``oncebus`` command line as a user does: subprocesses, a real ``oncebus serve``, its control socket."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ONCEBUS = [sys.executable, "-m", "oncebus.cli"]
EMULATOR_CONFIG = Path(__file__).parent / "data" / "emulator" / "Config.json"


def oncebus(*args: str, data_dir: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ONCEBUS_DATA_DIR": str(data_dir)}
    env.pop("ONCEBUS_CLOCK_FILE", None)
    return subprocess.run([*ONCEBUS, *args], env=env, input=stdin, capture_output=True, text=True, timeout=60)


def entities(data_dir: Path) -> dict[str, list[str]]:
    """Every queue, topic and subscription in the data directory (read through the CLI)."""
    out: dict[str, list[str]] = {}
    for kind in ("queue", "topic"):
        listed = oncebus(kind, "list", "--json", data_dir=data_dir)
        assert listed.returncode == 0, listed.stderr
        out[kind] = [e["name"] for e in json.loads(listed.stdout)]
    out["subscription"] = []
    for topic in out["topic"]:
        listed = oncebus("subscription", "list", topic, "--json", data_dir=data_dir)
        assert listed.returncode == 0, listed.stderr
        out["subscription"] += [f"{topic}/{s['name']}" for s in json.loads(listed.stdout)]
    return out


def assert_one_line_error(result: subprocess.CompletedProcess[str], *, codes: tuple[int, ...] = (1,)) -> str:
    """A refusal: the expected exit code and one error line on stderr, no traceback; returns that line.

    A usage error (exit 2) is argparse's: the command's usage, then the one error line.
    """
    assert result.returncode in codes, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    if result.returncode == 2 and len(lines) > 1:
        assert lines[0].startswith("usage: oncebus"), result.stderr
        lines = lines[-1:]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("oncebus") and ": error: " in lines[0], lines[0]
    return lines[0]


class Serve:
    """``oncebus serve --port 0`` on a temp data directory; its whole output goes to a log file."""

    def __init__(self, data_dir: Path, *extra: str) -> None:
        self.data_dir = data_dir
        self.log = data_dir.parent / f"{data_dir.name}-serve.log"
        self.command = [*ONCEBUS, "--data-dir", str(data_dir), "serve", "--port", "0", *extra]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, *, expect_ready: bool = True) -> Serve:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("ONCEBUS_CLOCK_FILE", None)
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if "ready" in self.output().splitlines():
                return self
            if self.process.poll() is not None:
                if expect_ready:
                    raise AssertionError(f"serve exited {self.process.returncode}: {self.output()}")
                return self
            time.sleep(0.05)
        raise AssertionError(f"serve did not start: {self.output()}")

    def wait(self, timeout: float = 30) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=15)

    def info(self) -> dict[str, Any]:
        return dict(json.loads((self.data_dir / "server.json").read_text()))

    def control(self) -> ControlClient:
        info = self.info()
        return ControlClient(int(info["control_port"]), str(info["control_token"]))


class ControlClient:
    """A raw connection to the control socket: bytes in, reply lines out."""

    def __init__(self, port: int, token: str) -> None:
        self.token = token
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.file = self.sock.makefile("rb")

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def reply(self) -> dict[str, Any]:
        line = self.file.readline()
        assert line.endswith(b"\n"), f"no reply line (connection closed?): {line[:200]!r}"
        reply = json.loads(line)
        assert isinstance(reply, dict)
        return reply

    def request(self, op: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
        self.send_raw(json.dumps({"token": self.token, "op": op, "args": args or {}}).encode() + b"\n")
        return self.reply()

    def close(self) -> None:
        self.file.close()
        self.sock.close()
