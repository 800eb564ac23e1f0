"""The per-minute duplicate log line from ``oncebus serve --log-format json`` (time from a clock file)."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from oncebus.logs import configure_logging

S = 1_000_000
CLI = [sys.executable, "-c", "import sys; from oncebus.cli import main; sys.exit(main())"]


def test_json_formatter_writes_one_object_per_record_with_its_extra_fields() -> None:
    stream = io.StringIO()
    handler = configure_logging("json", stream=stream)
    try:
        logging.getLogger("oncebus.duplicates").info(
            "orders: %d", 3, extra={"entity": "orders", "duplicates_dropped": 3}
        )
        logging.getLogger("oncebus.test").debug("not shown below INFO")
    finally:
        logging.getLogger("oncebus").removeHandler(handler)
    (line,) = stream.getvalue().splitlines()
    record = json.loads(line)
    assert record["level"] == "INFO" and record["logger"] == "oncebus.duplicates"
    assert record["message"] == "orders: 3"
    assert record["entity"] == "orders" and record["duplicates_dropped"] == 3
    assert record["time"].endswith("+00:00")


def test_serve_logs_duplicates_once_a_minute_as_json(tmp_path: Path) -> None:
    data_dir, clock_file = tmp_path / "data", tmp_path / "clock"
    start = 1_800_000_000 * S
    clock_file.write_text(str(start))
    env = dict(os.environ, ONCEBUS_CLOCK_FILE=str(clock_file), PYTHONUNBUFFERED="1")
    serve = subprocess.Popen(
        [*CLI, "--data-dir", str(data_dir), "serve", "--port", "0", "--log-format", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    stdout: list[str] = []
    stderr: list[str] = []
    ready = threading.Event()

    def read(stream: object, lines: list[str], marker: str | None) -> None:
        for line in stream:  # type: ignore[attr-defined]
            lines.append(line.rstrip("\n"))
            if marker is not None and line.strip() == marker:
                ready.set()
        ready.set()

    threading.Thread(target=read, args=(serve.stdout, stdout, "ready"), daemon=True).start()
    threading.Thread(target=read, args=(serve.stderr, stderr, None), daemon=True).start()
    try:
        assert ready.wait(60) and serve.poll() is None, stdout + stderr

        def cli(*args: str) -> None:
            done = subprocess.run([*CLI, "--data-dir", str(data_dir), *args], capture_output=True, text=True, env=env)
            assert done.returncode == 0, done.stderr

        cli("queue", "create", "orders", "--duplicate-detection", "--window", "PT5M")
        cli("queue", "create", "quiet", "--duplicate-detection")
        for _ in range(3):
            cli("send", "orders", "x", "--message-id", "order-1")  # one accepted, two duplicates
        cli("send", "quiet", "x", "--message-id", "q-1")
        clock_file.write_text(str(start + 61 * S))
        deadline = time.monotonic() + 30
        lines: list[dict] = []
        while time.monotonic() < deadline and not lines:
            time.sleep(0.1)
            lines = [json.loads(line) for line in list(stderr) if line.startswith("{")]
            lines = [line for line in lines if line.get("logger") == "oncebus.duplicates"]
        assert len(lines) == 1, stderr
        (line,) = lines
        assert line["level"] == "INFO"
        assert line["entity"] == "orders"
        assert (line["accepted"], line["duplicates_dropped"], line["late_resends"]) == (1, 2, 0)
        assert line["window_seconds"] == 300
        assert (
            line["message"]
            == "orders: 1 accepted, 2 duplicates dropped, 0 late resends in the last minute (window PT5M)"
        )
        assert "order-1" not in json.dumps(line)  # counts, never ids
    finally:
        serve.terminate()
        serve.wait(30)
