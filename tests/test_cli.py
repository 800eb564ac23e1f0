"""The oncebus command line, run as a user runs it (subprocesses), with and without a server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ONCEBUS = [sys.executable, "-m", "oncebus.cli"]


def oncebus(*args: str, data_dir: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ONCEBUS_DATA_DIR": str(data_dir)}
    return subprocess.run([*ONCEBUS, *args], env=env, input=stdin, capture_output=True, text=True, timeout=60)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Path]:
    data_dir = tmp_path / "data"
    proc = subprocess.Popen(
        [*ONCEBUS, "--data-dir", str(data_dir), "serve", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    started = time.monotonic()
    for line in proc.stdout:
        if line.strip() == "ready":
            break
    else:
        raise AssertionError(f"serve exited: {proc.wait()}")
    assert time.monotonic() - started < 10
    yield data_dir
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0


def _roundtrip(data_dir: Path) -> None:
    made = oncebus(
        "queue",
        "create",
        "orders",
        "--duplicate-detection",
        "--window",
        "PT10M",
        "--partitioned",
        "--sessions",
        "--json",
        data_dir=data_dir,
    )
    assert made.returncode == 0, made.stderr
    props = json.loads(made.stdout)
    assert props["requires_duplicate_detection"] and props["enable_partitioning"] and props["requires_session"]
    assert props["duplicate_detection_history_time_window"] == "PT10M"
    first = oncebus("send", "orders", "hello", "--message-id", "m1", "--session-id", "s", data_dir=data_dir)
    assert first.returncode == 0 and "sequence number 1" in first.stdout
    again = oncebus("send", "orders", "--message-id", "m1", "--session-id", "s", data_dir=data_dir, stdin="hello")
    assert again.returncode == 0 and "duplicate" in again.stdout
    load = oncebus(
        "send",
        "orders",
        "x",
        "--message-id",
        "load-{i}",
        "--session-id",
        "s",
        "--count",
        "250",
        "--json",
        data_dir=data_dir,
    )
    assert json.loads(load.stdout) == {"sent": 250, "stored": 250, "duplicates_dropped": 0}
    stats = json.loads(oncebus("stats", "orders", "--json", data_dir=data_dir).stdout)[0]
    assert stats["accepted"] == 251 and stats["duplicates_dropped"] == 1 and stats["keys_held"] == 251
    table = oncebus("stats", data_dir=data_dir).stdout
    assert "DUPLICATES" in table and "orders" in table
    peeked = json.loads(oncebus("peek", "orders", "--max", "2", "--json", data_dir=data_dir).stdout)
    assert [m["message_id"] for m in peeked] == ["m1", "load-0"]
    got = json.loads(
        oncebus("receive", "orders", "--session-id", "s", "--max", "300", "--json", data_dir=data_dir).stdout
    )
    assert len(got) == 251 and got[0]["body"] == "hello"
    assert json.loads(oncebus("receive", "orders", "--session-id", "s", "--json", data_dir=data_dir).stdout) == []
    listed = oncebus("queue", "list", data_dir=data_dir).stdout
    assert "orders" in listed and "PT10M" in listed


def test_cli_without_a_server(tmp_path: Path) -> None:
    _roundtrip(tmp_path / "data")


def test_cli_through_a_running_server(server: Path) -> None:
    _roundtrip(server)
    busy = subprocess.run(
        [*ONCEBUS, "--data-dir", str(server), "serve", "--port", "0"], capture_output=True, text=True, timeout=30
    )
    assert busy.returncode == 4 and "already in use" in busy.stderr


def test_topics_and_subscriptions(tmp_path: Path) -> None:
    d = tmp_path / "data"
    assert oncebus("topic", "create", "events", "--duplicate-detection", data_dir=d).returncode == 0
    assert oncebus("subscription", "create", "events", "audit", "--max-delivery-count", "3", data_dir=d).returncode == 0
    assert oncebus("send", "events", "e", "--message-id", "x", data_dir=d).returncode == 0
    assert oncebus("send", "events", "e", "--message-id", "x", data_dir=d).returncode == 0
    got = json.loads(oncebus("receive", "events/Subscriptions/audit", "--max", "5", "--json", data_dir=d).stdout)
    assert [m["message_id"] for m in got] == ["x"]
    show = json.loads(oncebus("subscription", "show", "events", "audit", "--json", data_dir=d).stdout)
    assert show["max_delivery_count"] == 3
    assert oncebus("subscription", "delete", "events", "audit", data_dir=d).returncode == 0
    assert "(none)" in oncebus("subscription", "list", "events", data_dir=d).stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["queue", "create", "q", "--window", "PT5S"], "The value supplied must be between 00:00:20 and 7.00:00:00."),
        (["queue", "create", "q", "--window", "ten"], "not a valid duration"),
        (["send", "missing", "x"], "could not be found"),
        (["send", "q1", "x", "--message-id", "m" * 129], "at most 128"),
        (["send", "q1", "x", "--session-id", "s", "--partition-key", "t"], "differs from session_id"),
        (["queue", "update", "q1", "--no-duplicate-detection"], "cannot be changed after creation"),
        (["send", "q1", "x" * 2000], "over the limit of 1024 bytes"),
    ],
)
def test_errors_are_clear_and_exit_1(tmp_path: Path, args: list[str], message: str) -> None:
    d = tmp_path / "data"
    oncebus("queue", "create", "q1", "--duplicate-detection", "--max-message-size-kb", "1", data_dir=d)
    result = oncebus(*args, data_dir=d)
    assert result.returncode == 1
    assert message in result.stderr
    stats = json.loads(oncebus("stats", "--json", data_dir=d).stdout)
    assert all(s["accepted"] == 0 for s in stats)


def test_window_can_be_updated(tmp_path: Path) -> None:
    d = tmp_path / "data"
    oncebus("queue", "create", "q", "--duplicate-detection", data_dir=d)
    updated = oncebus("queue", "update", "q", "--window", "P7D", "--json", data_dir=d)
    assert json.loads(updated.stdout)["duplicate_detection_history_time_window"] == "P7D"


def test_usage_error_exits_2(tmp_path: Path) -> None:
    assert oncebus("queue", "frobnicate", data_dir=tmp_path).returncode == 2
