"""The data directory's files are deleted under a running ``oncebus serve``: nothing acknowledged is lost.

The real SDK sends before and after the deletion; the server is then killed (SIGKILL: nothing is written
on the way out) and started again: every acknowledged message is there once, and the dedup history too.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from azure.servicebus import ServiceBusClient, ServiceBusMessage

ONCEBUS = [sys.executable, "-m", "oncebus.cli"]


class Serve:
    def __init__(self, data_dir: Path, env: dict[str, str] | None = None, args: tuple[str, ...] = ()) -> None:
        self.data_dir = data_dir
        self.output: list[str] = []
        self.connection_string = ""
        env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        env.pop("ONCEBUS_CLOCK_FILE", None)
        self.process = subprocess.Popen(
            [*ONCEBUS, "--data-dir", str(data_dir), "serve", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        ready = threading.Event()

        def read() -> None:
            assert self.process.stdout is not None
            for line in self.process.stdout:
                self.output.append(line.rstrip())
                if line.startswith("connection string: "):
                    self.connection_string = line.split(": ", 1)[1].strip()
                if line.strip() == "ready":
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        assert ready.wait(60) and self.connection_string, "\n".join(self.output)

    def children(self) -> list[int]:
        """The server's child processes (a dedup checkpoint being written)."""
        pid = self.process.pid
        with contextlib.suppress(OSError):
            return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        return []

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(30)


def cli(data_dir: Path, *args: str) -> str:
    result = subprocess.run([*ONCEBUS, "--data-dir", str(data_dir), *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _send(connection_string: str, ids: list[str]) -> list[str]:
    """Send one message per id; returns the ids whose send was acknowledged."""
    acked = []
    with ServiceBusClient.from_connection_string(connection_string) as client, client.get_queue_sender("q") as sender:
        for mid in ids:
            sender.send_messages(ServiceBusMessage(mid.encode(), message_id=mid))
            acked.append(mid)
    return acked


def _drain(connection_string: str) -> list[str]:
    got: list[str] = []
    with ServiceBusClient.from_connection_string(connection_string) as client:
        with client.get_queue_receiver("q", max_wait_time=2) as receiver:
            while True:
                batch = receiver.receive_messages(max_message_count=50, max_wait_time=2)
                if not batch:
                    return got
                for message in batch:
                    got.append(str(message.message_id))
                    receiver.complete_message(message)


def _wait_for(condition: object, what: str) -> None:
    for _ in range(100):
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_deleting_the_data_files_under_a_running_server_loses_nothing_acknowledged(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = Serve(data)
    try:
        cli(data, "queue", "create", "q", "--duplicate-detection")
        acked = _send(server.connection_string, [f"before-{i}" for i in range(20)])
        deleted = sorted(os.listdir(data))
        assert "oncebus.db" in deleted and "server.json" in deleted and "lock" in deleted
        for name in deleted:  # the files and the tls/ folder
            if (data / name).is_dir():
                shutil.rmtree(data / name)
            else:
                os.unlink(data / name)
        acked += _send(server.connection_string, [f"after-{i}" for i in range(20)])
        _wait_for(lambda: (data / "oncebus.db").exists() and (data / "server.json").exists(), "files restored")
        stats = json.loads(cli(data, "stats", "q", "--json"))[0]  # the CLI still finds the server
        assert stats["accepted"] == 40
        busy = subprocess.run(
            [*ONCEBUS, "--data-dir", str(data), "serve", "--port", "0"], capture_output=True, text=True, timeout=30
        )
        assert busy.returncode == 4  # nobody else could take the directory meanwhile
        server.kill()
        assert any("was deleted while oncebus ran; recreated it" in line for line in server.output), server.output

        server = Serve(data)
        assert _send(server.connection_string, ["before-0", "after-19"]) == ["before-0", "after-19"]  # duplicates
        got = _drain(server.connection_string)
        assert sorted(got) == sorted(acked) and len(got) == len(set(got)) == 40
        stats = json.loads(cli(data, "stats", "q", "--json"))[0]
        assert stats["accepted"] == 40 and stats["duplicates_dropped"] == 2
    finally:
        server.stop()
