"""The official JavaScript SDK (``@azure/service-bus`` 7.9.5, on rhea: another AMQP stack than the Python SDK's)
against ``oncebus serve``: the shared dedup scenarios (tests/data/scenarios.json, with dedup.js), send/receive,
duplicate detection, scheduling and peek on fresh links, the admin
client over HTTPS (``NODE_EXTRA_CA_CERTS``), Send/Listen/Manage refusals, the rule manager (rules over AMQP), entity
status, batch delete (``deleteMessages``/``purgeMessages``, which only 7.10.0-beta.2 has: installed beside 7.9.5
as ``@azure/service-bus-beta``), and AMQP over WebSockets (``webSocketOptions`` with the ``ws`` package).

The SDK is pinned in tests/js/package.json and package-lock.json; ``npm ci`` installs it into
tests/js/node_modules on first use. Node 20 and npm must be on PATH: without them these tests fail (they
do not skip), saying so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.amqp.conftest import ServerProcess, TestClock, topology
from tests.scenarios import SCENARIO_FILE, expected_delivered, load_scenarios
from tests.sdk_programs import ca_file, clocked_server, connection_string, run_program

HERE = Path(__file__).resolve().parent
KEYS = {"root": "root-secret", "sender": "send-secret", "listener": "listen-secret"}
ENV_KEYS = "root=root-secret; sender:Send=send-secret; listener:Listen=listen-secret"
SCENARIOS = load_scenarios()


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} is not on PATH: the JavaScript SDK tests need Node 20 and npm "
            "(https://nodejs.org); install them, or deselect tests/js"
        )
    return path


def node_ready() -> str:
    """The path of ``node``, with the pinned SDK installed in tests/js (``npm ci`` on first use)."""
    node = _tool("node")
    wanted = json.loads((HERE / "package.json").read_text())["dependencies"]
    if not all((HERE / "node_modules" / name / "package.json").exists() for name in wanted):  # one added since?
        result = subprocess.run(
            [_tool("npm"), "ci", "--no-audit", "--no-fund"], cwd=HERE, capture_output=True, text=True, timeout=300
        )
        if result.returncode != 0:
            pytest.fail(f"npm ci in {HERE} failed:\n{result.stdout}\n{result.stderr}")
    return node


@pytest.fixture(scope="module")
def node() -> str:
    return node_ready()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    queues: dict[str, dict[str, Any]] = {
        "js-plain": {},
        "js-dedup": {"RequiresDuplicateDetection": True, "DuplicateDetectionHistoryTimeWindow": "PT10M"},
        "js-sched": {},
        "js-purge": {"RequiresDuplicateDetection": True, "DuplicateDetectionHistoryTimeWindow": "PT10M"},
        "js-purge-s": {"RequiresSession": True},
        "js-status": {},
        "js-abandon": {"MaxDeliveryCount": 10},
        "js-ws": {"RequiresDuplicateDetection": True},
    }
    topics: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {"js-rules": ({}, {"sub": {}})}
    base = tmp_path_factory.mktemp("js")
    process = ServerProcess(base / "data", topology(queues, topics), env={"ONCEBUS_SAS_KEYS": ENV_KEYS}).start()
    yield process
    process.stop()


def _connection_string(server: ServerProcess, key_name: str) -> str:
    return connection_string(server, key_name, KEYS[key_name])


def run_scenario(node: str, server: ServerProcess, name: str, **extra: str) -> dict[str, Any]:
    env = dict(
        os.environ,
        **extra,
        ONCEBUS_CONNECTION_STRING=_connection_string(server, "root"),
        ONCEBUS_SEND_ONLY=_connection_string(server, "sender"),
        ONCEBUS_LISTEN_ONLY=_connection_string(server, "listener"),
        NODE_EXTRA_CA_CERTS=ca_file(server),
    )
    result, stderr = run_program([node, str(HERE / "scenario.js"), name], server, KEYS["root"], env, cwd=HERE)
    # rhea reports a disposition it cannot read (such as a null state) on stderr
    assert "unrecognised outcome" not in stderr, stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def clocked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, TestClock]]:
    """A server whose time the JavaScript program sets (ONCEBUS_CLOCK_FILE), one queue per shared scenario."""
    with clocked_server(tmp_path_factory.mktemp("js-clocked"), ENV_KEYS) as running:
        yield running


def run_dedup_scenario(node: str, server: ServerProcess, clock: TestClock, name: str) -> dict[str, Any]:
    """One shared scenario; a ``{"restart": true}`` line restarts the server (``tests.sdk_programs.run_program``)."""
    env = dict(
        os.environ,
        ONCEBUS_CONNECTION_STRING=_connection_string(server, "root"),
        NODE_EXTRA_CA_CERTS=ca_file(server),
        ONCEBUS_SCENARIO_FILE=str(SCENARIO_FILE),
        ONCEBUS_CLOCK_FILE=str(clock.path),
    )
    return run_program([node, str(HERE / "scenario.js"), "shared-dedup", name], server, KEYS["root"], env, cwd=HERE)[0]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s["name"] for s in SCENARIOS])
def test_shared_dedup_scenario(node: str, clocked: tuple[ServerProcess, TestClock], scenario: dict[str, Any]) -> None:
    """The shared duplicate-detection scenarios (tests/data/scenarios.json), as the Python, Java and Go SDKs run
    them: each step at its offset on the server's clock, restarts and window changes included."""
    server, clock = clocked
    got = run_dedup_scenario(node, server, clock, scenario["name"])
    assert [tuple(pair) for pair in got["delivered"]] == expected_delivered(scenario)
    assert len(got["refused"]) == sum(1 for step in scenario["steps"] if step.get("error"))


def test_send_and_receive(node: str, server: ServerProcess) -> None:
    assert run_scenario(node, server, "send-receive")["received"]


def test_a_duplicate_resend_is_dropped(node: str, server: ServerProcess) -> None:
    assert run_scenario(node, server, "dedup")["received"] == ["first"]


def test_amqp_over_websockets(node: str, server: ServerProcess) -> None:
    """``webSocketOptions: { webSocket: require("ws") }``: wss:// to the endpoint's own port (the main port takes
    TLS), a resend dropped, a batch and a 200 KiB message, received and completed."""
    result = run_scenario(node, server, "websocket")
    assert result == {"received": ["204800 bytes", "first", "second", "third"], "left": 0}


def test_an_abandon_counts_a_delivery_and_the_tenth_dead_letters(node: str, server: ServerProcess) -> None:
    """Failed before: the SDK's abandon (modified without delivery-failed) did not raise the delivery count, so a
    poison message abandoned by a JavaScript receiver was redelivered forever and never dead-lettered."""
    got = run_scenario(node, server, "abandon")
    assert got["counts"] == list(range(10))  # deliveryCount before each receive: 0, then 1 after one abandon, ...
    assert got["left"] == []
    [dead] = got["deadLettered"]
    assert dead["reason"] == "MaxDeliveryCountExceeded" and dead["deliveryCount"] == 10


def test_schedule_and_peek_on_fresh_links(node: str, server: ServerProcess) -> None:
    """Failed before: the SDK's token for <queue>/$management was not taken for that node (90 s of retries)."""
    got = run_scenario(node, server, "schedule-peek")
    assert len(got["scheduled"]) == 1 and got["peeked"] >= 1


def test_the_admin_client_lists_gets_and_creates_over_https(node: str, server: ServerProcess) -> None:
    """Failed before: list/getNamespaceProperties/getRule/listRules/createRule got 401 (sr = the request URL)."""
    got = run_scenario(node, server, "admin")
    assert got["queues"] and got["topics"] and got["subscriptions"] == ["red"]
    assert got["getRule"] == "red-only" and "red-only" in got["rules"]


def test_rights_refusals(node: str, server: ServerProcess) -> None:
    got = run_scenario(node, server, "rights")
    assert "Listen" in got["sendOnlyReceive"]
    assert "Send" in got["listenOnlySend"]
    assert "Manage" in got["listenOnlyManage"] or "401" in got["listenOnlyManage"]
    assert got["listenOnlyReceived"] is True


def test_rules_over_amqp_with_the_rule_manager(node: str, server: ServerProcess) -> None:
    """Failed before: add-rule, remove-rule and enumerate-rules on the subscription's $management answered 400."""
    got = run_scenario(node, server, "rules-amqp")
    assert got["initial"] == ["$Default"]
    assert "MessagingEntityAlreadyExists" in got["duplicate"] and "'red'" in got["duplicate"]
    assert "line 1" in got["badSql"] and "bad" in got["badSql"]  # core's SQL error, as the admin API gives it
    assert "MessagingEntityNotFound" in got["missing"]
    red, vip = got["rules"]
    assert red == {
        "name": "red",
        "filter": {"sqlExpression": "color = 'red'"},
        "action": {"sqlExpression": "SET seen = 'yes'"},
    }
    assert vip["name"] == "vip" and vip["action"] == {}
    given = {key: value for key, value in vip["filter"].items() if value is not None}  # the fields not given are null
    assert given == {"correlationId": "vip-1", "applicationProperties": {"tier": 3}}
    assert got["received"] == [["red", "yes"], ["vip", None]]  # blue matched no rule; the action ran on red
    assert "Manage" in got["listenOnly"]


def test_entity_status_is_set_by_the_admin_client_and_honoured_at_the_links(node: str, server: ServerProcess) -> None:
    """Failed before: any status but Active was refused (400)."""
    got = run_scenario(node, server, "status")
    assert got["sendDisabled"] == got["readBack"] == "SendDisabled"
    assert "MessagingEntityDisabled" in got["sendRefused"] and "SendDisabled" in got["sendRefused"]
    assert got["receiveWhileSendDisabled"] is None  # a SendDisabled queue still delivers
    assert got["receiveDisabled"] == "ReceiveDisabled"
    assert "MessagingEntityDisabled" in got["receiveRefused"]
    assert got["disabled"] == "Disabled" and "MessagingEntityDisabled" in got["sendRefusedDisabled"]
    assert got["active"] == "Active" and got["received"] == ["kept"]  # sent while ReceiveDisabled, kept
    assert "ReceiveDisabled" in got["topicReceiveDisabled"] and "topic" in got["topicReceiveDisabled"]
    assert got["sessionForward"].endswith("/js-status")  # a session-enabled queue that forwards: accepted


def test_delete_and_purge_messages_keep_locked_ones_and_dedup_keys(node: str, server: ServerProcess) -> None:
    """Failed before: batch-delete-messages answered 400 (the beta SDK's deleteMessages and purgeMessages)."""
    got = run_scenario(node, server, "purge")
    ids = got["ids"]
    assert got["locked"] == [ids[0]]
    assert got["deleted"] == 3  # the oldest unlocked: 1, 2, 3
    assert "500" in got["overCap"]
    assert got["sendOnlyPurge"] is not None and "Listen" in got["sendOnlyPurge"]  # refused: it needs Listen
    assert got["purged"] == 4  # 4 to 7; the locked one stays
    assert got["peeked"] == [ids[0]]
    assert got["afterResend"] == []  # the resend of a deleted id was dropped as a duplicate
    assert got["purgedDeadLetters"] == 1 and got["deadLettersLeft"] == 0  # the dead-letter queue purges too
    assert got["purgedSession"] == 2 and got["sessionsLeft"] == ["s2-2"]
    # deletes are durable once answered, and so are the deleted messages' dedup keys: SIGKILL, then start again
    assert server.process is not None
    server.process.kill()
    server.process.wait(15)
    server.process = None
    server.start()
    after = run_scenario(node, server, "purge-after-restart", ONCEBUS_PURGED_ID=ids[2])
    assert after["peeked"] == []
