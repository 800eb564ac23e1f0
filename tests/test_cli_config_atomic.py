"""Issue 18, item 7: a SIGKILL during a ``--config`` apply leaves the old topology or the whole new one, never half."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

from tests.cli_support import Serve, oncebus

QUEUES, TOPICS, SUBSCRIPTIONS_PER_TOPIC = 600, 60, 5


def _config(path: Path) -> None:
    queues = [{"Name": f"q{i:04}", "Properties": {}} for i in range(QUEUES)]
    queues.append(
        {
            "Name": "existing",
            "Properties": {"RequiresDuplicateDetection": True, "DuplicateDetectionHistoryTimeWindow": "PT2M"},
        }
    )
    topics = [
        {
            "Name": f"t{i:03}",
            "Properties": {},
            "Subscriptions": [{"Name": f"s{j}", "Properties": {}} for j in range(SUBSCRIPTIONS_PER_TOPIC)],
        }
        for i in range(TOPICS)
    ]
    namespace = {"Name": "sbemulatorns", "Queues": queues, "Topics": topics}
    path.write_text(json.dumps({"UserConfig": {"Namespaces": [namespace]}}))


def _listed(data_dir: Path, *args: str) -> list[str]:
    result = oncebus(*args, "--json", data_dir=data_dir)
    assert result.returncode == 0, result.stderr
    return [e["name"] for e in json.loads(result.stdout)]


def _state(data_dir: Path) -> str:
    """'old' or 'new'; anything in between fails the test."""
    queues = _listed(data_dir, "queue", "list")
    topics = _listed(data_dir, "topic", "list")
    window = json.loads(oncebus("queue", "show", "existing", "--json", data_dir=data_dir).stdout)[
        "duplicate_detection_history_time_window"
    ]
    if queues == ["existing"] and topics == [] and window == "PT1M":
        return "old"
    assert len(queues) == QUEUES + 1 and len(topics) == TOPICS and window == "PT2M", (len(queues), len(topics), window)
    for topic in (topics[0], topics[-1]):
        assert len(_listed(data_dir, "subscription", "list", topic)) == SUBSCRIPTIONS_PER_TOPIC
    return "new"


def test_a_killed_config_apply_keeps_the_old_topology_or_the_whole_new_one(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    _config(config)
    rng = random.Random(18)
    # how long a whole apply takes here, to kill within it
    full = tmp_path / "full"
    assert (
        oncebus("queue", "create", "existing", "--duplicate-detection", "--window", "PT1M", data_dir=full).returncode
        == 0
    )
    started = time.monotonic()
    serve = Serve(full, "--config", str(config)).start()
    took = time.monotonic() - started
    serve.stop()
    assert _state(full) == "new"
    seen = []
    for run in range(4):
        data = tmp_path / f"run{run}"
        assert (
            oncebus(
                "queue", "create", "existing", "--duplicate-detection", "--window", "PT1M", data_dir=data
            ).returncode
            == 0
        )
        env = dict(os.environ)
        env.pop("ONCEBUS_CLOCK_FILE", None)
        command = Serve(data, "--config", str(config)).command
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        time.sleep(rng.uniform(0.3, 0.9) * took)
        process.send_signal(signal.SIGKILL)
        process.wait()
        seen.append(_state(data))
    assert set(seen) <= {"old", "new"}, seen  # (which one depends on the moment; _state fails anything between)
