"""From the broker's send log to `oncebus advise`: the whole path a user takes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ONCEBUS = [sys.executable, "-m", "oncebus.cli"]


def test_send_log_then_advise(tmp_path: Path) -> None:
    data, log, out = tmp_path / "data", tmp_path / "log", tmp_path / "advice"
    env = {**os.environ, "ONCEBUS_DATA_DIR": str(data)}
    server = subprocess.Popen(
        [*ONCEBUS, "serve", "--port", "0", "--send-log", str(log)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    for line in server.stdout:
        if line.strip() == "ready":
            break
    try:

        def cli(*args: str) -> None:
            subprocess.run([*ONCEBUS, *args], env=env, check=True, capture_output=True, timeout=60)

        cli("queue", "create", "orders", "--duplicate-detection", "--window", "PT20S")
        cli("send", "orders", "x", "--message-id", "order-{i}", "--count", "50")
        cli("send", "orders", "x", "--message-id", "order-{i}", "--count", "10")  # ten resends
        time.sleep(1.2)  # the log flushes at least once a second
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
    lines = [json.loads(x) for f in log.glob("*.jsonl") for x in f.read_text().splitlines()]
    assert len(lines) == 60 and sum(1 for x in lines if x["outcome"] == "duplicate") == 10
    result = subprocess.run(
        [*ONCEBUS, "advise", str(log), "--out", str(out), "--share", "0.99"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "orders" in result.stdout
    advice = json.loads((out / "advice.json").read_text())
    assert (out / "advice.png").stat().st_size > 0
    assert "orders" in json.dumps(advice)
