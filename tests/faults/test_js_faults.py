"""Server busy and a lost lock with the official JavaScript SDK (tests/faults/faults.js): the error codes it
raises, its retry policy at work, and what the queues hold afterwards."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from oncebus.testing import OncebusServer
from tests.js.test_js_sdk import node  # noqa: F401  # the fixture: Node on PATH, npm ci of tests/js done

HERE = Path(__file__).resolve().parent


def test_server_busy_and_a_lost_lock_as_the_javascript_sdk_meets_them(
    server: OncebusServer,
    node: str,  # noqa: F811  # the fixture imported above
) -> None:
    server.create_queue("busy")
    server.create_queue("locks")
    env = dict(
        os.environ,
        ONCEBUS_CONNECTION_STRING=server.connection_string,
        NODE_PATH=str(HERE.parent / "js" / "node_modules"),
    )
    result = subprocess.run(
        [node, str(HERE / "faults.js"), "busy", "locks"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen == {
        "busyWithoutRetries": "ServiceBusy",  # ServiceBusError.code
        "busyWithRetries": None,  # two refusals, then the SDK's third attempt went through
        "lockLostOnComplete": "MessageLockLost",
        "redelivered": {"body": "l0", "deliveryCount": 1},
    }
    assert server.faults() == []
    assert [m["message_id"] for m in server.peek("busy")] == ["b1"]  # the refused sends stored nothing
    assert server.stats("locks")["active_message_count"] == 0
