"""The official Go SDK (``azservicebus`` 1.11.0, on go-amqp: a third AMQP stack beside the Python SDK's and rhea)
against ``oncebus serve``: the shared dedup scenarios (tests/data/scenarios.json, read by the Go program too), send
and receive, ``ReceiveMessages`` credit, sessions, settlement, scheduling, peek, the ``admin.Client`` over HTTPS
(``SSL_CERT_FILE``), and AMQP over WebSockets (``NewWebSocketConn`` with github.com/coder/websocket).

The SDK is pinned in tests/go/go.mod and go.sum; the program is built once per run with ``go build`` into a temp
dir (the module proxy serves the SDK on first use, Go's caches keep it). Go (1.25 or newer) must be on PATH:
without it these tests fail (they do not skip), saying so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.amqp.conftest import ServerProcess, TestClock, topology
from tests.docs.pages import blocks
from tests.scenarios import SCENARIO_FILE, expected_delivered, load_scenarios
from tests.sdk_programs import TIMEOUT, ca_file, clocked_server, connection_string, run_program

HERE = Path(__file__).resolve().parent
GO_PAGE = HERE.parents[1] / "docs" / "go.md"
BUILD_TIMEOUT = 600
KEYS = {"root": "root-secret", "listener": "listen-secret"}
ENV_KEYS = "root=root-secret; listener:Listen=listen-secret"
SCENARIOS = load_scenarios()


def go_environment() -> dict[str, str]:
    # GOFLAGS=-buildvcs=false: the module sits in a git worktree whose metadata Go need not (and may not) read
    return dict(os.environ, GOFLAGS=f"{os.environ.get('GOFLAGS', '')} -buildvcs=false".strip())


def build_program(directory: Path, source: Path = HERE) -> Path:
    """``go build`` of the module in ``source`` (tests/go) into ``directory``; fails (does not skip) without Go."""
    go = shutil.which("go")
    if go is None:
        pytest.fail(
            "go is not on PATH: the Go SDK tests need Go 1.25 or newer (https://go.dev/dl/); install it, "
            "or deselect tests/go"
        )
    program = directory / "oncebus-go"
    built = subprocess.run(
        [go, "build", "-o", str(program), "."],
        cwd=source,
        env=go_environment(),
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
    )
    if built.returncode != 0:
        pytest.fail(f"go build in {source} failed:\n{built.stdout}\n{built.stderr}")
    return program


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_program(tmp_path_factory.mktemp("go-build"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    queues: dict[str, dict[str, Any]] = {
        "go-plain": {},
        "go-credit": {},
        "go-settle": {"MaxDeliveryCount": 3},
        "go-modify": {},
        "quickstart": {"RequiresDuplicateDetection": True},  # docs/go.md's example
        "go-sched": {},
        "go-peek": {},
        "go-sessions": {"RequiresSession": True},
        "go-ws": {"RequiresDuplicateDetection": True},
        "go-ws-sessions": {"RequiresSession": True},
    }
    topics: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
        "go-topic": ({}, {"all": {}}),
        "go-rules": ({}, {}),
    }
    base = tmp_path_factory.mktemp("go")
    process = ServerProcess(base / "data", topology(queues, topics), env={"ONCEBUS_SAS_KEYS": ENV_KEYS}).start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def clocked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, TestClock]]:
    """A server whose time the Go program sets (ONCEBUS_CLOCK_FILE), one queue per shared scenario."""
    with clocked_server(tmp_path_factory.mktemp("go-clocked"), ENV_KEYS) as running:
        yield running


def _connection_string(server: ServerProcess, key_name: str) -> str:
    return connection_string(server, key_name, KEYS[key_name])


def run_scenario(program: Path, server: ServerProcess, name: str, *args: str, **extra: str) -> dict[str, Any]:
    """Run one scenario of the Go program (``tests.sdk_programs.run_program``: a restart line restarts the server)."""
    env = dict(
        go_environment(),
        **extra,
        ONCEBUS_CONNECTION_STRING=_connection_string(server, "root"),
        ONCEBUS_LISTEN_ONLY=_connection_string(server, "listener"),
        SSL_CERT_FILE=ca_file(server),
    )
    return run_program([str(program), name, *args], server, KEYS["root"], env)[0]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s["name"] for s in SCENARIOS])
def test_shared_dedup_scenario(
    program: Path, clocked: tuple[ServerProcess, TestClock], scenario: dict[str, Any]
) -> None:
    server, clock = clocked
    got = run_scenario(
        program,
        server,
        "dedup",
        scenario["name"],
        ONCEBUS_SCENARIO_FILE=str(SCENARIO_FILE),
        ONCEBUS_CLOCK_FILE=str(clock.path),
    )
    assert [tuple(pair) for pair in got["delivered"]] == expected_delivered(scenario)
    assert len(got["refused"]) == sum(1 for step in scenario["steps"] if step.get("error"))
    # a partition key that differs from the session id: amqp:not-allowed (Service Bus's InvalidOperationException),
    # which the Go SDK takes as final. Failed before: com.microsoft:argument-error, a condition the Go SDK does not
    # know, so it retried the send on new connections and reported CodeConnectionLost
    assert all("amqp:not-allowed" in text and "connlost" not in text for text in got["refused"]), got["refused"]


def test_send_receive_and_complete(program: Path, server: ServerProcess) -> None:
    got = run_scenario(program, server, "send-receive")
    assert got["ids"] == ["sr-1", "sr-2", "sr-3"] and got["left"] == []  # one send, then a batch of two
    assert got["sequenceNumbers"] == sorted(got["sequenceNumbers"]) and len(set(got["sequenceNumbers"])) == 3
    assert (got["body"], got["subject"], got["contentType"]) == ("hello from go", "greeting", "text/plain")
    assert (got["correlationId"], got["to"], got["replyTo"]) == ("corr-1", "someone", "go-reply")
    assert got["ttlSeconds"] == 600 and got["expiresAt"]  # ExpiresAt = EnqueuedTime + TimeToLive
    assert got["deliveryCount"] == 1 and got["state"] == 0 and got["lockTokenSet"]
    assert got["enqueuedTimeSet"] and got["lockedUntilAfterEnqueued"]
    # application properties come back with their Go types (go-amqp's encodings kept as sent)
    assert got["propertyTypes"] == {
        "text": "string",
        "number": "int64",
        "small": "int32",
        "flag": "bool",
        "ratio": "float64",
        "when": "time.Time",
    }
    assert got["properties"]["number"] == 42 and got["properties"]["ratio"] == 2.5 and got["whenRoundTrips"]
    assert got["fanned"] == ["fan-1"]  # a topic's subscription


def test_amqp_over_websockets(program: Path, server: ServerProcess) -> None:
    """``ClientOptions.NewWebSocketConn`` with github.com/coder/websocket (the SDK's own example): the SDK hands it
    wss://<endpoint host:port>/$servicebus/websocket, the main port takes TLS (SSL_CERT_FILE), and every AMQP
    connection goes through it: a resend dropped, a batch, a 200 KiB message, received and completed; a session
    accepted by name, with its state."""
    got = run_scenario(program, server, "websocket")
    assert got["received"] == ["ws-1 (12 bytes)", "ws-2 (12 bytes)", "ws-3 (12 bytes)", "ws-large (204800 bytes)"]
    assert got["left"] == 0
    assert got["session"] == ["a-1", "a-2"] and got["sessionId"] == "ws-s" and got["state"] == "ws-state"
    assert got["dialed"] and set(got["dialed"]) == {f"wss://127.0.0.1:{server.port}/$servicebus/websocket"}


def test_receive_messages_asks_only_the_credit_it_lacks_and_returns_at_its_deadline(
    program: Path, server: ServerProcess
) -> None:
    got = run_scenario(program, server, "credit")
    assert got["calls"] == [["c-1", "c-2"], ["c-3", "c-4", "c-5"], ["c-6", "c-7"]]  # counts 2, 3, 5; 7 sent
    # nothing there: the call ends with its context (1.5 s), no messages, the context's error
    assert got["empty"] == 0 and got["emptyDeadline"] and 1400 <= got["waitedMs"] < 3000
    # sent between calls onto the link's leftover credit: the SDK releases them, and a release is no
    # delivery attempt (DeliveryCount 1 is the first delivery)
    assert got["late"] == ["c-8", "c-9", "c-10"] and got["lateDeliveryCounts"] == [1, 1, 1]
    # asking for 100 with 2 there returns the 2 soon after the first, not at the 10 s deadline
    assert got["many"] == ["c-11", "c-12"] and got["manyMs"] < 5000


def test_sessions_accept_state_lock_and_next_available(program: Path, server: ServerProcess) -> None:
    """Failed before: the Go SDK's session filter is a described value; the server took its text
    ('Described(ulong(...), 's1')') as the session id and echoed it bare, which go-amqp cannot decode."""
    got = run_scenario(program, server, "sessions")
    # Service Bus answers both with amqp:not-allowed, which the Go SDK does not retry: with its default retry options
    # the refusal comes back at once. Failed before: com.microsoft:argument-error, which it retried on new
    # connections for about half a minute, then reported as CodeConnectionLost
    assert "SessionId was not set" in got["noSessionRefused"] and "amqp:not-allowed" in got["noSessionRefused"]
    assert "connlost" not in got["noSessionRefused"] and got["noSessionRefusedMs"] < 3000
    assert "non-sessionful" in got["plainReceiverRefused"] and "amqp:not-allowed" in got["plainReceiverRefused"]
    assert "connlost" not in got["plainReceiverRefused"] and got["plainReceiverRefusedMs"] < 3000
    assert got["listed"] == ["s1", "s2"]
    assert got["sessionId"] == "s1" and got["lockedUntilAhead"]
    assert got["s1"] == ["s1-a", "s1-b"] and got["s1SessionIds"] == ["s1", "s1"]
    assert got["stateBefore"] is None and got["state"] == "step-2" and got["renewMoved"]
    assert "session-cannot-be-locked" in got["busy"]  # s1 is held by the first receiver
    assert got["next"] == "s2" and got["s2"] == ["s2-a"]
    assert got["listedAfter"] == ["s1"]  # no messages left, but its state is set
    assert got["stateAgain"] == "step-2"  # the state outlives the lock
    assert got["clearedLength"] == 0  # SetSessionState(nil): the SDK sends an empty binary
    assert got["emptySession"] == 0 and got["emptySessionDeadline"]
    # no session has messages: the SDK asks the broker to wait until just before the context's deadline
    # (com.microsoft:timeout, less a random jitter of at most 1 %); the broker's timeout (CodeTimeout) or the
    # context's deadline ends it, whichever comes first, as the SDK's own tests accept
    assert "noneSession" not in got
    assert got["noneTimeout"] or got["none"] == "context deadline exceeded", got["none"]
    assert 2800 <= got["noneWaitedMs"] < 4000


def test_settle_complete_abandon_defer_dead_letter_and_renew(program: Path, server: ServerProcess) -> None:
    got = run_scenario(program, server, "settle")
    # three abandons on MaxDeliveryCount 3: the count rises, then the message is dead-lettered
    assert got["abandonCounts"] == [1, 2, 3]
    by_id = {letter["id"]: letter for letter in got["deadLettered"]}
    assert by_id["abandoned"]["reason"] == "MaxDeliveryCountExceeded"
    assert by_id["dead"]["reason"] == "BadOrder" and by_id["dead"]["description"] == "the order has no lines"
    assert got["deferredReceived"] == ["deferred"] and got["deferredState"] == 1  # MessageStateDeferred
    assert got["deferredCompleteError"] == ""  # settled on the management link
    assert got["deferredAfterComplete"] == [] and "404" in got["deferredAfterCompleteError"]
    assert got["renewError"] == "" and got["renewMoved"] and got["completeRenewed"] == ""
    assert got["left"] == []


def test_settle_with_properties_to_modify(program: Path, server: ServerProcess) -> None:
    """Abandon, defer and dead-letter with PropertiesToModify: the message carries them afterwards, as on Service
    Bus. Failed before: an abandon's properties were stored but a receiver got the message as sent; a defer's
    and a dead-letter's were dropped."""
    got = run_scenario(program, server, "settle-modify")
    assert got["abandoned"] == {"origin": "go", "note": "abandoned once", "attempt": 7}  # merged with the sender's
    assert got["deferred"] == {"deferredBy": "go"}
    assert got["deadLettered"]["deadBy"] == "go" and got["deadLettered"]["DeadLetterReason"] == "BadOrder"


def test_schedule_cancel_and_peek_scheduled(program: Path, server: ServerProcess) -> None:
    got = run_scenario(program, server, "schedule")
    assert got["sequenceNumbers"] == 2 and got["distinct"]
    assert got["peekedStates"] == {"later-1": 2, "later-2": 2, "soon": 2}  # MessageStateScheduled
    assert got["cancelError"] == ""
    # scheduled 1.5 s ahead: received when due, with its scheduled time
    assert got["received"] == ["soon"] and got["receivedSequence"] == got["soonSequence"]
    assert 1000 <= got["waitedMs"] < 5000 and got["scheduledEnqueueTime"] and got["completeError"] == ""
    assert got["leftPeeked"] == ["later-2"]  # the cancelled one is gone


def test_peek_pages_from_the_last_peeked_and_takes_no_lock(program: Path, server: ServerProcess) -> None:
    got = run_scenario(program, server, "peek")
    assert got["empty"] == 0  # nothing there: an empty page, no error
    assert got["first"] == ["p-1", "p-2", "p-3"] and got["next"] == ["p-4", "p-5"]
    assert got["from"] == ["p-2", "p-3"]  # FromSequenceNumber
    assert not got["peekedLockToken"]
    assert got["received"] == [f"p-{i}" for i in range(1, 6)] and got["deliveryCounts"] == [1] * 5
    assert got["lockedPeek"] == got["received"]  # locked messages are peeked too


def test_admin_client_queues_topics_and_subscriptions(program: Path, server: ServerProcess) -> None:
    got = run_scenario(program, server, "admin")
    assert got["namespace"]["sku"] == "Standard"
    made = {
        "lockDuration": "PT45S",
        "requiresDuplicateDetection": True,
        "duplicateDetectionHistoryTimeWindow": "PT2M",
        "maxDeliveryCount": 7,
        "defaultMessageTimeToLive": "P2D",
        "userMetadata": "made by go",
        "deadLetteringOnMessageExpiration": True,
        "status": "Active",
    }
    for view in (got["created"], got["got"]):
        assert {key: view[key] for key in made} == made
    assert got["defaults"]["lockDuration"] == "PT1M" and got["defaults"]["maxDeliveryCount"] == 10
    assert got["defaults"]["requiresDuplicateDetection"] is False
    changed = {key: got["updated"][key] for key in ("maxDeliveryCount", "lockDuration", "userMetadata")}
    assert changed == {"maxDeliveryCount": 9, "lockDuration": "PT1M", "userMetadata": "changed by go"}
    assert got["updated"]["duplicateDetectionHistoryTimeWindow"] == "PT3M"
    assert {"go-admin-q", "go-admin-q2", "go-admin-q3", "go-plain"} <= set(got["queues"])
    assert got["queuePages"] >= len(got["queues"]) / 2  # pages of 2
    assert got["runtime"] == {
        "active": 2,
        "total": 2,
        "deadLetter": 0,
        "scheduled": 0,
        "sizeSet": True,
        "createdAt": True,
        "createdRecently": True,
    }
    assert got["listedRuntime"] == 2
    assert got["topic"] == {
        "requiresDuplicateDetection": True,
        "window": "PT5M",
        "ttl": "PT1H",
        "supportOrdering": True,
    }
    assert got["topicWindow"] == "PT7M"
    assert got["subscription"] == {
        "lockDuration": "PT30S",
        "maxDeliveryCount": 4,
        "deadLetteringOnMessageExpiration": True,
        "userMetadata": "sub by go",
    }
    assert got["subscriptionMaxDeliveryCount"] == 6 and got["subscriptions"] == ["go-sub", "go-sub2"]
    assert got["subscriptionActive"] == 1
    # api-version 2024-05 (the SDK's since 1.11): the filter counts include each subscription's $Default
    assert got["topicRuntime"] == {"subscriptionCount": 2, "sqlFilterCount": 2, "correlationFilterCount": 0}
    assert "go-admin-t" in got["topics"]
    for kind in ("Subscription", "Topic", "Queue"):  # a deleted entity reads back as nil, no error
        assert got[f"deleted{kind}Nil"] and got[f"deleted{kind}Error"] == ""
    assert not {"go-admin-q", "go-admin-q2", "go-admin-q3"} & set(got["queuesAfter"])


def test_admin_client_rules(program: Path, server: ServerProcess) -> None:
    got = run_scenario(program, server, "admin-rules")
    red = {
        "name": "red",
        "filter": {"sql": "color = @wanted", "parameters": {"@wanted": "red"}},
        "action": "SET seen = 'yes'",
    }
    assert got["red"] == got["gotRed"] == red
    assert got["vip"] == {
        "name": "vip",
        "filter": {"correlationId": "vip-1", "subject": None, "properties": {"tier": 3}},
    }
    assert sorted(got["rules"], key=lambda rule: rule["name"]) == [
        red,
        {"name": "tier3", "filter": {"correlationId": None, "subject": None, "properties": {"tier": 3}}},
        {"name": "vip", "filter": {"correlationId": None, "subject": "urgent", "properties": None}},
    ]
    assert (got["duplicateStatus"], got["badSqlStatus"], got["deleteAgainStatus"]) == (409, 400, 404)
    assert got["missingNil"] and got["missingError"] == ""
    # red matches the SQL filter and its action ran; blue matches nothing; vip-1 by tier3 (the int 3; vip was
    # updated to the subject), the text "3" not
    assert got["routed"] == [["m-red", "yes"], ["m-vip", None], ["m-urgent", None]]


def test_admin_client_refusals(program: Path, server: ServerProcess) -> None:
    got = run_scenario(program, server, "admin-errors")
    assert (got["exists"], got["updateMissing"], got["deleteMissing"], got["subscriptionNoTopic"]) == (
        409,
        404,
        404,
        404,
    )
    assert got["badWindow"] == 400 and "between 00:00:20 and 7.00:00:00" in got["badWindowText"]
    assert got["runtimeMissingNil"] and got["runtimeMissingError"] == ""
    assert got["listenOnlyCreate"] == got["listenOnlyList"] == 401


def test_rights_a_listen_only_key(program: Path, server: ServerProcess) -> None:
    got = run_scenario(program, server, "rights")
    assert got["sendUnauthorized"] and "Send" in got["sendRefused"]
    assert got["received"] == ["for-listener"]


def test_the_go_page_example_runs(program: Path, server: ServerProcess, tmp_path: Path) -> None:
    """docs/go.md's program, built against the pinned SDK and run: the resend is dropped."""
    [example] = [block for block in blocks(GO_PAGE.read_text()) if block.lang == "go" and block.save_as == "main.go"]
    assert (example.save_as, example.run) == ("main.go", "go run .")
    source = tmp_path / "quickstart"
    source.mkdir()
    for name in ("go.mod", "go.sum"):  # the page's `go get` of the same release
        (source / name).write_text((HERE / name).read_text())
    code = example.code.replace("127.0.0.1:5672", f"127.0.0.1:{server.port}")
    code = code.replace("RootManageSharedAccessKey", "root").replace("SAS_KEY_VALUE", KEYS["root"])
    (source / "main.go").write_text(code)
    built = build_program(tmp_path, source)
    ran = subprocess.run([str(built)], capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == ["greeting-4 from go"]
