"""Running a program written with another language's official SDK (tests/go's oncebus-go, tests/js's scenario.js)
against a ``ServerProcess``, and reading its answer.

The program prints its result as the last JSON line on stdout: ``{"ok": true, "result": {...}}`` or
``{"ok": false, "error": ...}``. A ``{"restart": true}`` line asks the test to restart the server; the test
answers the new root connection string on the program's stdin.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.amqp.conftest import ServerProcess, TestClock, topology
from tests.scenarios import load_scenarios

TIMEOUT = 60  # seconds a program may run
_PROPERTY_NAMES = {
    "requires_duplicate_detection": "RequiresDuplicateDetection",
    "duplicate_detection_history_time_window": "DuplicateDetectionHistoryTimeWindow",
    "enable_partitioning": "EnablePartitioning",
}


def scenario_queues() -> dict[str, dict[str, Any]]:
    """One queue per shared dedup scenario (tests/data/scenarios.json), for ``tests.amqp.conftest.topology``."""
    return {
        s["name"].replace("_", "-"): {_PROPERTY_NAMES[k]: v for k, v in s["entity"].items()} for s in load_scenarios()
    }


@contextmanager
def clocked_server(base: Path, sas_keys: str) -> Iterator[tuple[ServerProcess, TestClock]]:
    """A server whose time the program sets (ONCEBUS_CLOCK_FILE), one queue per shared scenario, with the keys
    ``sas_keys`` (ONCEBUS_SAS_KEYS)."""
    clock = TestClock(base / "clock")
    process = ServerProcess(
        base / "data", topology(scenario_queues(), {}), clock_file=clock.path, env={"ONCEBUS_SAS_KEYS": sas_keys}
    ).start()
    try:
        yield process, clock
    finally:
        process.stop()


def connection_string(server: ServerProcess, key_name: str, key: str) -> str:
    return (
        f"Endpoint=sb://127.0.0.1:{server.port};SharedAccessKeyName={key_name};"
        f"SharedAccessKey={key};UseDevelopmentEmulator=true"
    )


def ca_file(server: ServerProcess) -> str:
    """The CA certificate the server printed (what the program trusts for HTTPS)."""
    line = next(line for line in server.output if line.startswith("CA certificate: "))
    return line.split(": ", 1)[1].split(" (", 1)[0]


def run_program(
    command: list[str],
    server: ServerProcess,
    root: str,
    env: dict[str, str],
    cwd: Path | None = None,
) -> tuple[dict[str, Any], str]:
    """``command`` run to its end (killed after ``TIMEOUT`` s): its result and its stderr. It fails unless the
    program exits 0 with ``"ok": true``. ``root`` is the root key, for the connection string answered after a
    restart."""
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    watchdog = threading.Timer(TIMEOUT, process.kill)
    watchdog.start()
    stderr: list[str] = []
    reader = threading.Thread(target=lambda: stderr.append(process.stderr.read() if process.stderr else ""))
    reader.start()
    lines = []
    try:
        assert process.stdout is not None and process.stdin is not None
        for line in process.stdout:
            if line.startswith('{"restart"'):
                server.restart()
                process.stdin.write(connection_string(server, "root", root) + "\n")
                process.stdin.flush()
            elif line.startswith("{"):
                lines.append(line)
        process.wait()
    finally:
        watchdog.cancel()
        reader.join()
    errors = "".join(stderr)
    outcome = json.loads(lines[-1]) if lines else {"ok": False, "error": "no result line"}
    name = " ".join(Path(part).name for part in command)
    assert process.returncode == 0 and outcome["ok"], f"{name}: {outcome}\nstderr:\n{errors[-3000:]}"
    return dict(outcome["result"]), errors
