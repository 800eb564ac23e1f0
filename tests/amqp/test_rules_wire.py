"""Rules, forwarding and auto-delete over the wire: the real SDK against ``oncebus serve`` on a test clock.

- Every rule scenario of tests/data/scenarios.json: topics, subscriptions and
  rules come from an emulator-format ``--config`` (the scenarios' rules
  written as the emulator's ``Rules``), messages go out through the SDK's
  topic sender, and each subscription's receiver gets exactly what the
  scenario says (actions applied, duplicates dropped at the topic reaching no
  subscription, scheduled messages routed when due).
- The emulator's own example Config.json routes as its comments say.
- A forwarding chain topic -> subscription -> queue -> queue, with each hop's
  duplicate detection judging with its own window.
- ``auto_delete_on_idle``: an idle queue disappears once the test clock has
  moved past its idle time (it runs last: the clock jumps minutes ahead).

The broker's time is the file ``ONCEBUS_CLOCK_FILE`` names; the server's timer
still ticks every half second of real time, so a due message or an idle
entity is handled within a second of the clock being set.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import MessagingEntityNotFoundError, ServiceBusError

from oncebus.core.timeutil import us_to_datetime
from tests.amqp.conftest import ServerProcess
from tests.amqp.test_scenarios_wire import TestClock
from tests.scenarios import load_rule_scenarios, projected_deliveries

SCENARIOS = load_rule_scenarios()
EMULATOR_CONFIG = Path(__file__).parents[1] / "data" / "emulator" / "Config.json"
FIELDS = (
    "message_id",
    "correlation_id",
    "subject",
    "content_type",
    "reply_to",
    "reply_to_session_id",
    "to",
    "session_id",
)
_CORRELATION = {
    "correlation_id": "CorrelationId",
    "message_id": "MessageId",
    "to": "To",
    "reply_to": "ReplyTo",
    "label": "Label",
    "session_id": "SessionId",
    "reply_to_session_id": "ReplyToSessionId",
    "content_type": "ContentType",
}
_TOPIC_PROPERTIES = {
    "requires_duplicate_detection": "RequiresDuplicateDetection",
    "duplicate_detection_history_time_window": "DuplicateDetectionHistoryTimeWindow",
}


def topic_name(scenario: dict[str, Any]) -> str:
    return "rules-" + str(scenario["name"]).replace("_", "-")


def emulator_rule(rule: dict[str, Any]) -> dict[str, Any]:
    """A scenario rule (``RuleProperties.to_dict()`` form) in the emulator's ``Rules`` format."""
    data = rule["filter"]
    if data["type"] == "correlation":
        spec = {_CORRELATION[k]: v for k, v in data.items() if k in _CORRELATION}
        if data.get("properties"):
            spec["Properties"] = data["properties"]
        props: dict[str, Any] = {"FilterType": "Correlation", "CorrelationFilter": spec}
    else:
        assert not data.get("parameters"), "the emulator's format has no parameters"
        text = {"true": "1=1", "false": "1=0"}.get(data["type"], data.get("sql_expression"))
        props = {"FilterType": "Sql", "SqlFilter": {"SqlExpression": text}}
    if rule.get("action"):
        props["Action"] = {"SqlExpression": rule["action"]["sql_expression"]}
    return {"Name": rule["name"], "Properties": props}


def config() -> dict[str, Any]:
    topics = []
    for scenario in SCENARIOS:
        subscriptions = []
        for name, rules in scenario["subscriptions"].items():
            entry: dict[str, Any] = {"Name": name}
            if rules:
                entry["Rules"] = [emulator_rule(r) for r in rules]
            subscriptions.append(entry)
        properties = {_TOPIC_PROPERTIES[k]: v for k, v in scenario["topic"].items()}
        topics.append({"Name": topic_name(scenario), "Properties": properties, "Subscriptions": subscriptions})
    topics.append(
        {
            "Name": "fwd-topic",
            "Properties": {"RequiresDuplicateDetection": True, "DuplicateDetectionHistoryTimeWindow": "PT20S"},
            "Subscriptions": [{"Name": "to-mid", "Properties": {"ForwardTo": "fwd-mid"}}, {"Name": "kept"}],
        }
    )
    queues = [
        {"Name": "fwd-mid", "Properties": {"ForwardTo": "fwd-end"}},
        {
            "Name": "fwd-end",
            "Properties": {"RequiresDuplicateDetection": True, "DuplicateDetectionHistoryTimeWindow": "PT10M"},
        },
        {"Name": "idle-queue", "Properties": {"AutoDeleteOnIdle": "PT5M"}},
        {"Name": "busy-queue", "Properties": {"AutoDeleteOnIdle": "PT5M"}},
    ]
    return {"UserConfig": {"Namespaces": [{"Name": "sbemulatorns", "Queues": queues, "Topics": topics}]}}


@pytest.fixture(scope="module")
def clocked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, TestClock]]:
    base = tmp_path_factory.mktemp("rules-wire")
    clock = TestClock(base / "clock")
    process = ServerProcess(base / "data", config(), clock_file=clock.path).start()
    for scenario in SCENARIOS:  # an empty list of rules has no form in the emulator's format
        for name, rules in scenario["subscriptions"].items():
            if rules == []:
                process.cli("rule", "delete", topic_name(scenario), name, "$Default")
    yield process, clock
    process.stop()


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def as_fields(message: Any) -> dict[str, Any]:
    fields = {f: _text(getattr(message, f)) for f in FIELDS}
    fields["message_id"] = str(message.message_id)
    fields["application_properties"] = {_text(k): _text(v) for k, v in (message.application_properties or {}).items()}
    return fields


def drain(client: ServiceBusClient, topic: str, subscription: str, wait: float = 1.0) -> list[dict[str, Any]]:
    out = []
    with client.get_subscription_receiver(topic, subscription) as receiver:
        while batch := receiver.receive_messages(max_message_count=50, max_wait_time=wait):
            for message in batch:
                out.append(as_fields(message))
                receiver.complete_message(message)
            wait = 1.0
    return out


def sdk_message(spec: dict[str, Any]) -> ServiceBusMessage:
    fields = {f: spec[f] for f in FIELDS if spec.get(f) is not None}
    return ServiceBusMessage(b"x", application_properties=dict(spec.get("application_properties", {})), **fields)


def run_steps(
    client: ServiceBusClient, clock: TestClock, topic: str, steps: list[dict[str, Any]], now: Callable[[], int]
) -> None:
    start_us = now()
    with client.get_topic_sender(topic) as sender:
        for step in steps:
            clock.set(start_us + round(step["at"] * 1_000_000))
            if "send" in step:
                sender.send_messages(sdk_message(step["send"]))
            elif "schedule" in step:
                when = us_to_datetime(start_us) + timedelta(seconds=step["at"] + step["enqueue_after"])
                sender.schedule_messages(sdk_message(step["schedule"]), when)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s["name"] for s in SCENARIOS])
def test_rule_scenario_over_the_wire(clocked: tuple[ServerProcess, TestClock], scenario: dict[str, Any]) -> None:
    server, clock = clocked
    topic = topic_name(scenario)
    with ServiceBusClient.from_connection_string(server.connection_string, retry_total=0) as client:
        run_steps(client, clock, topic, scenario["steps"], lambda: clock.now_us + 1_000_000)
        clock.set(clock.now_us + 1_000_000)
        got = {name: drain(client, topic, name, wait=2.0) for name in scenario["subscriptions"]}
    received, expected = projected_deliveries(got, scenario)
    assert received == expected


def test_the_emulators_example_config_routes_as_its_comments_say(tmp_path: Path) -> None:
    """The official Config.json as it is (comments and all); the messages of the scenario that spells out
    its comments ('emulator_example_config_routes') go to topic.1 and land where the comments say."""
    scenario = next(s for s in SCENARIOS if s["name"] == "emulator_example_config_routes")
    clock = TestClock(tmp_path / "clock")
    server = ServerProcess(tmp_path / "data", clock_file=clock.path)
    server.config_file = EMULATOR_CONFIG
    server.start()
    try:
        with ServiceBusClient.from_connection_string(server.connection_string, retry_total=0) as client:
            run_steps(client, clock, "topic.1", scenario["steps"], lambda: clock.now_us + 1_000_000)
            got = {name: drain(client, "topic.1", name) for name in scenario["subscriptions"]}
        received, expected = projected_deliveries(got, scenario)
        assert received == expected
    finally:
        server.stop()


def test_a_forwarding_chain_judges_duplicates_at_every_hop(clocked: tuple[ServerProcess, TestClock]) -> None:
    """topic (window 20 s) -> subscription to-mid -> queue fwd-mid (no dedup) -> queue fwd-end (window 10 min)."""
    server, clock = clocked
    with ServiceBusClient.from_connection_string(server.connection_string, retry_total=0) as client:
        with client.get_topic_sender("fwd-topic") as sender:
            sender.send_messages(ServiceBusMessage(b"1", message_id="order-1", subject="first"))
            sender.send_messages(ServiceBusMessage(b"1", message_id="order-1", subject="resent"))  # topic drops it
            clock.set(clock.now_us + 30_000_000)  # past the topic's window, within fwd-end's
            sender.send_messages(ServiceBusMessage(b"1", message_id="order-1", subject="late"))  # fwd-end drops it
            sender.send_messages(ServiceBusMessage(b"2", message_id="order-2", subject="second"))
        with client.get_queue_receiver("fwd-end", max_wait_time=2) as receiver:
            got = [(str(m.message_id), m.subject) for m in receiver.receive_messages(10, max_wait_time=2)]
            for m in receiver.receive_messages(10, max_wait_time=1):
                got.append((str(m.message_id), m.subject))
        assert sorted(got) == [("order-1", "first"), ("order-2", "second")]
        kept = drain(client, "fwd-topic", "kept")
        assert [(m["message_id"], m["subject"]) for m in kept] == [
            ("order-1", "first"),
            ("order-1", "late"),  # the topic accepted it again: its own window had passed
            ("order-2", "second"),
        ]
        with client.get_queue_receiver("fwd-mid", max_wait_time=1) as receiver:
            assert receiver.receive_messages(10, max_wait_time=1) == []  # a forwarding queue keeps nothing
    stats = {s["name"]: s for s in __import__("json").loads(server.cli("stats", "--json"))}
    assert (stats["fwd-end"]["accepted"], stats["fwd-end"]["duplicates_dropped"]) == (2, 1)
    assert (stats["fwd-topic"]["accepted"], stats["fwd-topic"]["duplicates_dropped"]) == (3, 1)


def test_an_idle_queue_is_deleted_when_the_clock_passes_its_idle_time(clocked: tuple[ServerProcess, TestClock]) -> None:
    """Runs last in this module: the clock jumps minutes ahead."""
    server, clock = clocked
    with ServiceBusClient.from_connection_string(server.connection_string, retry_total=0) as client:
        for queue in ("idle-queue", "busy-queue"):  # both active now
            with client.get_queue_sender(queue) as sender:
                sender.send_messages(ServiceBusMessage(b"x", message_id="m"))
        clock.set(clock.now_us + 4 * 60_000_000)
        with client.get_queue_sender("busy-queue") as sender:
            sender.send_messages(ServiceBusMessage(b"x", message_id="n"))  # busy-queue: active again 4 minutes in
        clock.set(clock.now_us + 90_000_000)  # idle-queue: 5.5 minutes idle; busy-queue: 1.5
        deadline = time.monotonic() + 10
        while "idle-queue" in server.cli("queue", "list") and time.monotonic() < deadline:
            time.sleep(0.2)
        listed = server.cli("queue", "list")
        assert "idle-queue" not in listed and "busy-queue" in listed
        with pytest.raises((MessagingEntityNotFoundError, ServiceBusError)):
            with client.get_queue_sender("idle-queue") as sender:
                sender.send_messages(ServiceBusMessage(b"x", message_id="again"))
