"""The official Java SDK (``com.azure:azure-messaging-servicebus`` 7.17.19 under ``azure-sdk-bom`` 1.3.8; its
own AMQP stack, proton-j, and its own HTTP pipeline) against ``oncebus serve``: the shared dedup scenarios
(tests/data/scenarios.json), sessions, peek-lock settlement, scheduling, peek, the processor client,
transactions, the administration client over HTTPS, and AMQP over WebSockets (``AMQP_WEB_SOCKETS``).

tests/java is a Maven project (pom.xml pins every version); ``mvn -q -B package`` builds it once per run, with
Maven's local repository (~/.m2) as the cache. One JVM then runs every scenario and prints one JSON line for
each (``oncebus.sdk.Main``); each test here asserts on its scenario's line. Java 17 and Maven must be on PATH:
without them these tests fail (they do not skip), saying so.

Two servers: one on a clock file (``ONCEBUS_CLOCK_FILE``) that the Java program sets to each dedup step's
offset, and restarts through this driver (it prints ``{"request": "restart"}`` and reads the new connection
string); one on the real clock for everything else. The administration client trusts the server's CA through
a PKCS12 truststore made with ``keytool`` (``-Djavax.net.ssl.trustStore``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.amqp.conftest import ServerProcess, TestClock, topology
from tests.amqp.test_transactions_crash import kill_and_restart
from tests.scenarios import SCENARIO_FILE, expected_delivered, load_scenarios

HERE = Path(__file__).resolve().parent
SDK_VERSION = "7.17.19"
BUILD_TIMEOUT = 300  # the first build downloads the SDK and Maven's plugins into ~/.m2
RUN_TIMEOUT = 300
TRUSTSTORE_PASSWORD = "oncebus-test"
SCENARIOS = load_scenarios()
_PROPERTY_NAMES = {
    "requires_duplicate_detection": "RequiresDuplicateDetection",
    "duplicate_detection_history_time_window": "DuplicateDetectionHistoryTimeWindow",
    "enable_partitioning": "EnablePartitioning",
}
QUEUES: dict[str, dict[str, Any]] = {
    "java-sessions": {"RequiresSession": True},
    "java-settle": {"MaxDeliveryCount": 10},
    "java-sched": {},
    "java-peek": {},
    "java-processor": {"MaxDeliveryCount": 10},
    "java-txn-commit": {"RequiresDuplicateDetection": True, "DuplicateDetectionHistoryTimeWindow": "PT10M"},
    "java-txn-rollback": {
        "RequiresDuplicateDetection": True,
        "DuplicateDetectionHistoryTimeWindow": "PT10M",
        "LockDuration": "PT5S",
    },
    "java-txn-a": {},
    "java-txn-b": {},
    "java-txn-c": {},
    "java-txn-d": {},
    "java-ws": {"RequiresDuplicateDetection": True},
    "java-ws-sessions": {"RequiresSession": True},
    "java-wss": {"RequiresDuplicateDetection": True},
    "java-wss-sessions": {"RequiresSession": True},
}

CLOCKED_QUEUES: dict[str, dict[str, Any]] = {"java-crash-a": {}, "java-crash-b": {}}  # killed and restarted

pytestmark = pytest.mark.timeout(BUILD_TIMEOUT + RUN_TIMEOUT + 60)  # the first test waits for the whole run


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} is not on PATH: the Java SDK tests need Java 17 (java, keytool) and Maven (mvn); "
            "install them (Debian: openjdk-17-jdk-headless maven), or deselect tests/java"
        )
    return path


def build() -> list[str]:
    """``mvn -q -B package`` in tests/java; the class path of the program (its classes, then the SDK's jars)."""
    result = subprocess.run(
        [_tool("mvn"), "-q", "-B", "-Dstyle.color=never", "package"],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
    )
    if result.returncode != 0:
        pytest.fail(f"mvn package in {HERE} failed:\n{result.stdout[-5000:]}\n{result.stderr[-3000:]}")
    jars = (HERE / "target" / "classpath.txt").read_text().strip()
    return [str(HERE / "target" / "classes"), *jars.split(os.pathsep)]


def ca_file(server: ServerProcess) -> str:
    line = next(line for line in server.output if line.startswith("CA certificate: "))
    return line.split(": ", 1)[1].split(" (", 1)[0]


def port_of(server: ServerProcess, label: str) -> int:
    """The port ``oncebus serve`` printed for ``label`` ("TLS", "HTTP")."""
    for line in server.output:
        if m := re.match(rf"{label} on [^ ]+:(\d+) ", line):
            return int(m.group(1))
    raise AssertionError(f"no {label} port in {server.output}")


def truststore(servers: list[ServerProcess], directory: Path) -> Path:
    """A PKCS12 truststore holding the servers' CAs (each data directory has its own), for
    ``-Djavax.net.ssl.trustStore``."""
    store = directory / "truststore.p12"
    for number, server in enumerate(servers):
        result = subprocess.run(
            [
                _tool("keytool"),
                "-importcert",
                "-noprompt",
                "-alias",
                f"oncebus-ca-{number}",
                "-file",
                ca_file(server),
                "-keystore",
                str(store),
                "-storetype",
                "PKCS12",
                "-storepass",
                TRUSTSTORE_PASSWORD,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stdout + result.stderr
    return store


def run_java(
    classpath: list[str], env: dict[str, str], store: Path, clocked: ServerProcess, scenarios: list[str], log: Path
) -> dict[str, dict[str, Any]]:
    """One JVM runs ``scenarios`` (all when empty); its result lines by scenario. Restarts ``clocked`` when asked."""
    command = [
        _tool("java"),
        f"-Djavax.net.ssl.trustStore={store}",
        f"-Djavax.net.ssl.trustStorePassword={TRUSTSTORE_PASSWORD}",
        "-Djavax.net.ssl.trustStoreType=PKCS12",
        "-cp",
        os.pathsep.join(classpath),
        "oncebus.sdk.Main",
        *scenarios,
    ]
    results: dict[str, dict[str, Any]] = {}
    with log.open("w") as stderr:
        process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env, cwd=HERE
        )
        timer = threading.Timer(RUN_TIMEOUT, process.kill)
        timer.start()
        try:
            assert process.stdout is not None and process.stdin is not None
            for text in process.stdout:
                if not text.startswith("{"):
                    stderr.write(text)  # the SDK's own prints (proton-j's PN_TRACE_FRM=1 frame trace)
                    continue
                line = json.loads(text)
                if line.get("request") in ("restart", "crash"):
                    if line["request"] == "crash":
                        kill_and_restart(clocked)
                    else:
                        clocked.restart()
                    process.stdin.write(clocked.connection_string + "\n")
                    process.stdin.flush()
                else:
                    results[line["scenario"]] = line
            process.wait(30)
        finally:
            timer.cancel()
            if process.poll() is None:
                process.kill()
    return results


class JavaRun:
    """The results of the one JVM run, or why there are none, and what a test needs to explain a failure."""

    def __init__(self, results: dict[str, dict[str, Any]], log: Path | None, seconds: float, error: str = "") -> None:
        self.results = results
        self.log = log
        self.seconds = seconds
        self.error = error  # the build or the run failed: every test fails with this

    def result(self, scenario: str) -> dict[str, Any]:
        if self.error:
            pytest.fail(self.error, pytrace=False)
        line = self.results.get(scenario)
        stderr = self.log.read_text()[-4000:] if self.log is not None and self.log.exists() else ""
        assert line is not None, f"no result line for {scenario} (the JVM stopped?); stderr:\n{stderr}"
        assert line["ok"], f"{scenario}: {line.get('error')}\nstderr:\n{stderr}"
        return dict(line["result"])


@pytest.fixture(scope="module")
def java(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JavaRun]:
    """Builds the project and runs every scenario in one JVM, once for the module (a failure is kept, not retried
    by each test)."""
    started = time.monotonic()
    try:
        for tool in ("java", "keytool"):
            _tool(tool)
        classpath = build()
    except pytest.fail.Exception as failure:
        yield JavaRun({}, None, 0.0, error=str(failure))
        return
    base = tmp_path_factory.mktemp("java")
    clock = TestClock(base / "clock")
    dedup_queues = {
        s["name"].replace("_", "-"): {_PROPERTY_NAMES[k]: v for k, v in s["entity"].items()} for s in SCENARIOS
    }
    clocked = ServerProcess(
        base / "clocked", topology(dedup_queues | CLOCKED_QUEUES, {}), clock_file=clock.path
    ).start()
    server = ServerProcess(base / "data", topology(QUEUES, {})).start()
    try:
        env = dict(
            os.environ,
            ONCEBUS_CONNECTION_STRING=server.connection_string,
            ONCEBUS_CLOCKED_CONNECTION_STRING=clocked.connection_string,
            ONCEBUS_CLOCK_FILE=str(clock.path),
            ONCEBUS_SCENARIO_FILE=str(SCENARIO_FILE),
            ONCEBUS_TLS_PORT=str(port_of(server, "TLS")),
        )
        log = base / "java-stderr.log"
        results = run_java(classpath, env, truststore([server, clocked], base), clocked, [], log)
        yield JavaRun(results, log, time.monotonic() - started)
    finally:
        server.stop()
        clocked.stop()


def test_the_pinned_sdk_ran(java: JavaRun) -> None:
    got = java.result("sdk-version")
    assert got == {
        "azure-messaging-servicebus": SDK_VERSION,
        "azure-core-amqp": "2.12.0",
        "azure-core": "1.58.1",
        "java": "17",
    }


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s["name"] for s in SCENARIOS])
def test_dedup_scenario(java: JavaRun, scenario: dict[str, Any]) -> None:
    got = java.result("dedup:" + scenario["name"])
    assert [tuple(pair) for pair in got["delivered"]] == expected_delivered(scenario)
    errors = [step for step in scenario["steps"] if step.get("error")]
    assert [refusal["refused"] for refusal in got["refusals"]] == [True] * len(errors), got["refusals"]


def test_sessions_named_and_next_available_with_state(java: JavaRun) -> None:
    got = java.result("sessions")
    assert got["named"] == ["a1", "a2"] and got["namedSessionIds"] == ["s1", "s1"]
    assert got["stateBefore"] is None and got["state"] == "state-1"
    assert got["renewedIntoTheFuture"] is True
    assert got["nextSessionId"] == "s2" and got["next"] == ["b1"]
    assert got["stateAfterReopen"] == "state-1" and got["leftInS1"] == []


def test_peek_lock_settlement(java: JavaRun) -> None:
    got = java.result("settle")
    assert got["completed"] == "complete-me"
    assert got["abandonCounts"] == [0, 1, 2]  # each abandon counts a delivery
    assert got["modifiedProperty"] == 2  # the abandon's properties to modify
    assert got["afterDefer"] == []  # a deferred message is delivered only by its sequence number
    assert got["deferred"] == "defer-me" and got["deferredState"] == "DEFERRED"
    assert got["deadLettered"] == {
        "body": "dead-letter-me",
        "reason": "bad",
        "description": "because",
        "state": "ACTIVE",
    }
    assert got["left"] == []


def test_schedule_and_cancel(java: JavaRun) -> None:
    got = java.result("schedule")
    assert got["peekedState"] == "SCHEDULED" and got["peekedAtScheduledTime"] is True
    assert got["pairSequenceNumbers"] == 2
    assert got["peekAfterCancel"] == []
    assert got["beforeDue"] == [] and got["due"] == ["due-soon"]
    assert got["enqueuedNotBeforeSchedule"] is True


def test_peek(java: JavaRun) -> None:
    got = java.result("peek")
    assert (got["first"], got["second"], got["fromFourth"]) == ("p1", "p2", "p4")
    assert got["rest"] == ["p3", "p4"]  # on from the last peeked: a peek from a sequence number does not move it
    assert got["afterAll"] is None
    assert got["received"] == ["p1", "p2", "p3", "p4"] and got["deliveryCounts"] == [0, 0, 0, 0]
    assert got["peekFromStartWhenEmpty"] == []


def test_processor_client(java: JavaRun) -> None:
    got = java.result("processor")
    assert got["allHandled"] is True
    assert got["handled"] == ["fail-once", "m1", "m2", "m4", "m5"]
    assert got["failingDeliveryCounts"] == [0, 1]  # the failed handler's message was abandoned, then redelivered
    assert len(got["errors"]) == 1 and "the handler fails once" in got["errors"][0]
    assert got["left"] == []  # the processor completed what its handler took


def test_transaction_commit(java: JavaRun) -> None:
    got = java.result("transaction-commit")
    assert got["transactionIdLength"] == 16
    assert got["peekBeforeCommit"] == ["in"]  # the send is not visible, the completion not applied
    assert got["peekAfterCommit"] == ["out"]
    assert got["receivedAfterCommit"] == ["out"]  # the committed send's id is held: its resend was dropped


def test_transaction_rollback(java: JavaRun) -> None:
    got = java.result("transaction-rollback")
    assert got["peekAfterRollback"] == ["keep"]
    # the SDK forgets a message once it settled it in a transaction, committed or not: it refuses to abandon it
    assert got["abandonAfterRollback"]["type"] == "IllegalArgumentException"
    assert "already settled" in got["abandonAfterRollback"]["message"]
    # the rolled-back id was not held; "keep" came again when its lock expired, a delivery counted
    assert sorted(got["receivedAfterRollback"]) == ["keep", "never, sent again"]
    assert sorted(got["deliveryCounts"]) == [0, 1]


def test_cross_entity_transaction(java: JavaRun) -> None:
    """enableCrossEntityTransactions: one AMQP session for all of the client's links, opened after a coordinator, no
    com.microsoft:transfer-destination-address; the first entity used is the send-via entity (as Service Bus infers
    it). Commit and rollback; a receiver on another entity from that client is refused (amqp:not-allowed)."""
    got = java.result("transaction-cross-entity")
    assert got["transactionalSend"] == "returned"
    assert got["destinationBeforeCommit"] == []
    assert got["sourceAfterCommit"] == [] and got["destinationAfterCommit"] == ["shipped"]
    assert got["rolledBackSend"] == "returned" and got["destinationAfterRollback"] == []
    assert got["sourceAfterRollback"] == ["second order"]  # still locked by the receiver, not completed
    assert got["plainSend"] == ["plain"]
    # the SDK ends the receiver when its attach is refused (amqp:not-allowed on the wire, as Service Bus answers)
    refused = got["receiverOnDestination"]
    assert isinstance(refused, dict) and "terminated" in refused["message"], refused


def test_cross_entity_transaction_and_a_crash_before_the_commit(java: JavaRun) -> None:
    """The clocked server killed (SIGKILL) between the cross-entity transaction's operations and its commit: after
    the restart nothing of it is there, and the completed message is back."""
    got = java.result("transaction-cross-entity-crash")
    assert got["transactionalSend"] == "returned"
    assert got["destinationAfterCrash"] == [] and got["sourceAfterCrash"] == ["order"]


def test_a_refused_transactional_send_looks_sent_to_the_java_sdk(java: JavaRun) -> None:
    """Java SDK 7.17 (azure-core-amqp 2.12.0, ReactorSender): a send given a delivery state (a transaction's) is
    reported as done whatever the broker answered. oncebus refuses a send on another entity than the transaction's
    (amqp:not-allowed, as Service Bus does without send-via); the SDK returns, the commit succeeds, the message is
    nowhere."""
    got = java.result("transaction-refused-send")
    assert got["transactionalSend"] == "returned" and got["committed"] is True
    assert got["settledAfterCommit"] == []  # the completion in the transaction was applied
    assert got["otherAfterCommit"] == []  # the refused send was not


def test_admin_client_queues(java: JavaRun) -> None:
    got = java.result("admin-queues")
    created = {
        "name": "java-admin-q",
        "requiresDuplicateDetection": True,
        "window": "PT5M",
        "lockDuration": "PT45S",
        "maxDeliveryCount": 7,
        "requiresSession": False,
        "partitioned": False,
        "status": "Active",
        "userMetadata": "made in Java",
    }
    assert got["created"] == created and got["got"] == created and got["exists"] is True
    assert got["createAgain"]["type"] == "ResourceExistsException"
    updated = dict(created, maxDeliveryCount=9, window="PT2M", lockDuration="PT30S")
    assert got["updated"] == updated and got["gotAfterUpdate"] == updated
    assert got["runtime"] == {"active": 1, "scheduled": 1, "deadLetter": 0, "total": 2}
    assert "java-admin-q" in got["listed"] and "java-settle" in got["listed"]
    assert got["existsAfterDelete"] is False
    assert got["getAfterDelete"]["type"] == "ResourceNotFoundException"


def test_admin_client_topics_subscriptions_rules(java: JavaRun) -> None:
    got = java.result("admin-topics")
    assert got["topicWindow"] == "PT3M" and got["topicWindowUpdated"] == "PT4M"
    assert "java-admin-t" in got["topics"]
    assert got["redMaxDeliveryCount"] == 4 and got["redMaxDeliveryCountUpdated"] == 6
    assert sorted(got["subscriptions"]) == ["plain", "red"]
    red_only = {"name": "red-only", "sql": "color = 'red'", "filterType": "SqlRuleFilter", "action": "SET seen = 'yes'"}
    assert got["gotRule"] == red_only
    # the Java SDK writes every correlation-filter property as a string (RuleProperties: value.toString(),
    # i:type="d6p1:string"): the int 3 given is held as "3", and matches a message's "3", not its 3
    vip = {"name": "vip", "correlationId": "vip-1", "properties": {"tier": "3"}, "filterType": "CorrelationRuleFilter"}
    assert got["rules"] == [red_only, vip]
    assert got["received"] == [["red", "yes"], ["vip-text", None]]  # blue matched no rule; the action ran on red
    assert got["ruleUpdated"] == dict(red_only, sql="color = 'crimson'")
    assert got["rulesAfterDelete"] == ["red-only"]
    assert got["plainExists"] is False and got["topicExists"] is False


WS_ROUND_TRIP = {
    "received": ["204800 bytes", "first", "second", "third"],  # the resend of ws-1 dropped
    "left": [],
    "session": ["a1", "a2"],
    "sessionIds": ["ws-s", "ws-s"],
    "state": "ws-state",
}


def test_amqp_over_websockets_with_the_printed_connection_string(java: JavaRun) -> None:
    """``transportType(AmqpTransportType.AMQP_WEB_SOCKETS)`` with the emulator string: wss:// to the endpoint's own
    port (always TLS over WebSockets; the emulator flag only skips checking the certificate); a 200 KiB message in
    proton-j's 4 KiB frames. Failed before: the SDK's upgrade names its target in absolute form
    (``GET https://127.0.0.1/$servicebus/websocket``), which oncebus routed to the application (501): no connection."""
    assert java.result("websocket") == WS_ROUND_TRIP


def test_amqp_over_websockets_with_tls_and_a_custom_endpoint(java: JavaRun) -> None:
    """An Azure-style string (no port, no emulator flag) would go to wss://127.0.0.1:443; ``customEndpointAddress``
    names the TLS port; the CA is trusted through the JVM's truststore, the certificate's name checked."""
    got = java.result("websocket-tls")
    assert got.pop("connectionString").startswith("Endpoint=sb://127.0.0.1;")
    assert got == WS_ROUND_TRIP


def test_the_admin_client_drops_the_endpoint_port(java: JavaRun) -> None:
    """The Java administration client keeps only the host of the connection string's endpoint (it ignores
    UseDevelopmentEmulator): it calls https://127.0.0.1/... on port 443. The scenarios add a pipeline policy that
    puts the port back (docs/java.md); the SAS audience is https://<host>, which oncebus accepts."""
    got = java.result("admin-connection-string-alone")
    assert got["url"].startswith("https://127.0.0.1/java-peek?")
    assert f":{got['endpointPort']}" not in got["url"]
    assert got["audience"] == "https://127.0.0.1"
