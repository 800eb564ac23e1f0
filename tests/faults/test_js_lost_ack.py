"""The lost-ack recipe with the official JavaScript SDK (``examples/lost_ack.js``, @azure/service-bus 7.9.5 from
tests/js): it arms the fault over HTTP with the connection string's key, and its retry policy resends."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from oncebus.testing import OncebusServer
from tests.js.test_js_sdk import node  # noqa: F401  # the fixture: Node on PATH, npm ci of tests/js done

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("dedup", [True, False], ids=["dedup", "no-dedup"])
def test_the_javascript_recipe_gets_each_message_once_only_with_duplicate_detection(
    server: OncebusServer,
    node: str,  # noqa: F811  # the fixture imported above
    dedup: bool,
) -> None:
    server.create_queue("orders", requires_duplicate_detection=dedup)
    env = dict(
        os.environ,
        ONCEBUS_CONNECTION_STRING=server.connection_string,
        NODE_PATH=str(ROOT / "tests" / "js" / "node_modules"),
    )
    result = subprocess.run(
        [node, str(ROOT / "examples" / "lost_ack.js"), "orders"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == (0 if dedup else 1), result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    if dedup:
        assert seen["received"] == seen["sent"]
        assert server.stats("orders")["duplicates_dropped"] == 1  # the SDK's resend, after its operation timeout
    else:
        assert sorted(seen["received"]) == sorted([*seen["sent"], "order 2"])
    assert server.faults() == []
