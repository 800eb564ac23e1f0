"""A namespace created on a shared broker, used by the official JavaScript SDK with only its connection string
(the key name ``RootManageSharedAccessKey@<namespace>`` reaches @azure/core-amqp's token unencoded)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from oncebus.testing import OncebusServer
from tests.js.test_js_sdk import node  # noqa: F401  # the fixture: Node on PATH, npm ci of tests/js done

HERE = Path(__file__).resolve().parent


def test_the_javascript_sdk_sends_and_receives_in_a_created_namespace(
    broker: OncebusServer,
    node: str,  # noqa: F811  # the fixture imported above
) -> None:
    ns = broker.create_namespace()
    ns.create_queue("orders", requires_duplicate_detection=True)
    broker.create_queue("orders")  # the default namespace's queue of the same name stays empty
    env = dict(
        os.environ,
        ONCEBUS_CONNECTION_STRING=ns.connection_string,
        NODE_PATH=str(HERE.parent / "js" / "node_modules"),
    )
    result = subprocess.run(
        [node, str(HERE / "namespace.js"), "orders"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"received": ["js:m1", "js:m2"]}
    assert ns.stats("orders")["duplicates_dropped"] == 1
    assert broker.stats("orders")["accepted"] == 0
    broker.delete_queue("orders")
