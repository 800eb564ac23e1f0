"""A running ``oncebus serve`` and recordings of real azure-servicebus sessions with it, for the fuzz suite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.amqp.conftest import ServerProcess, topology
from tests.fuzz.sessions import (
    JS_SESSIONS,
    Recording,
    record_js_sessions,
    record_sessions,
    record_transaction_session,
)
from tests.js.test_js_sdk import node_ready
from tests.store.conftest import postgres_cluster  # noqa: F401  (the relay's fuzz test: a cluster on PostgreSQL)

QUEUES = {
    "fuzz": {"RequiresDuplicateDetection": True, "LockDuration": "PT5S", "MaxDeliveryCount": 3},
    "fuzzsessions": {"RequiresSession": True},
    "ledger": {"RequiresDuplicateDetection": True},
    "probe": {},
    "fuzztxn": {"RequiresDuplicateDetection": True},  # the transactional session's send-via destination
    # the JavaScript SDK's recorded scenarios (tests/js/scenario.js)
    "js-plain": {},
    "js-dedup": {"RequiresDuplicateDetection": True, "DuplicateDetectionHistoryTimeWindow": "PT10M"},
    "js-sched": {},
}
TOPICS = {"fuzztopic": ({"EnablePartitioning": True}, {"sub": {}})}


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("fuzz")
    env = {"ONCEBUS_AMQP_HANDSHAKE_TIMEOUT": "2"}
    process = ServerProcess(base / "data", topology(QUEUES, TOPICS), env=env).start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def recordings(fuzz_server: ServerProcess) -> list[Recording]:
    """One recording per SDK connection: the Python SDK's send, receive and settle, sessions, topic (see
    sessions.SESSIONS), python-qpid-proton's transactions and the JavaScript SDK's (sessions.JS_SESSIONS)."""
    found = record_sessions(fuzz_server.connection_string, fuzz_server.port)
    found += record_transaction_session(fuzz_server.port)
    found += record_js_sessions(fuzz_server.connection_string, fuzz_server.port, node_ready())
    wanted = {"send", "receive", "sessions", "topic", "transaction", *("js-" + name for name in JS_SESSIONS)}
    assert {r.name for r in found} >= wanted, [r.name for r in found]
    return found
