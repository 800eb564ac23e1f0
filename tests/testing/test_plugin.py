"""The pytest plugin, run the way users run it: generated test files in a fresh pytest process (``pytester``)."""

from __future__ import annotations

import json

import pytest

RUN_TIMEOUT = 240

HELPERS = """
import json, os
from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode


def send(ns, queue, *messages):
    with ServiceBusClient.from_connection_string(ns.connection_string) as client:
        with client.get_queue_sender(queue) as sender:
            for body, message_id in messages:
                sender.send_messages(ServiceBusMessage(body, message_id=message_id))


def receive(ns, queue, count, wait=5):
    with ServiceBusClient.from_connection_string(ns.connection_string) as client:
        with client.get_queue_receiver(queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as receiver:
            return [str(m) for m in receiver.receive_messages(max_message_count=count, max_wait_time=wait)]
"""


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=RUN_TIMEOUT)


def test_a_generated_test_file_using_the_fixtures_passes(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
import pytest

@pytest.fixture(scope="session")
def oncebus_config():
    return {"UserConfig": {"Namespaces": [{"Queues": [{"Name": "everywhere"}]}]}}
"""
    )
    pytester.makepyfile(
        HELPERS
        + """
pytestmark = pytest.mark.oncebus_entities(queues=["module-queue"])


@pytest.mark.oncebus_entities(
    queues={"orders": {"RequiresDuplicateDetection": True}},
    topics={"events": {"subscriptions": ["audit", "billing"]}},
)
def test_declared_entities_and_the_sdk(oncebus_namespace):
    queues = {q["name"] for q in oncebus_namespace.control("queue.list")}
    assert queues == {"everywhere", "module-queue", "orders"}
    with ServiceBusClient.from_connection_string(oncebus_namespace.connection_string) as client:
        with client.get_topic_sender("events") as sender:
            sender.send_messages(ServiceBusMessage("e", message_id="e1"))
        with client.get_subscription_receiver("events", "billing") as receiver:
            (got,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            receiver.complete_message(got)
    send(oncebus_namespace, "orders", ("a", "o1"), ("a", "o1"))
    assert oncebus_namespace.stats("orders")["duplicates_dropped"] == 1
    assert oncebus_namespace.stats("events")["subscriptions"]["audit"]["active_message_count"] == 1


def test_the_session_server_is_the_namespace_server(oncebus_server, oncebus_namespace):
    assert oncebus_server is oncebus_namespace
    assert oncebus_server.port > 0 and oncebus_server.data_dir.is_dir()
    assert {q["name"] for q in oncebus_namespace.control("queue.list")} == {"everywhere", "module-queue"}
"""
    )
    result = run(pytester)
    result.assert_outcomes(passed=2)


def test_two_tests_in_one_file_do_not_see_each_others_messages(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        HELPERS
        + """
pytestmark = pytest.mark.oncebus_entities(queues={"orders": {"requires_duplicate_detection": True}})
servers = []


def test_first_leaves_a_message_behind(oncebus_namespace):
    servers.append(oncebus_namespace.info["pid"])
    send(oncebus_namespace, "orders", ("from the first test", "m1"))
    assert oncebus_namespace.stats("orders")["active_message_count"] == 1


def test_second_starts_empty_with_no_dedup_history(oncebus_namespace):
    assert servers == [oncebus_namespace.info["pid"]]  # the same broker process: the namespace was reset
    assert oncebus_namespace.peek("orders") == []
    assert receive(oncebus_namespace, "orders", 10, wait=1) == []
    send(oncebus_namespace, "orders", ("from the second test", "m1"))  # same message_id: not a duplicate here
    stats = oncebus_namespace.stats("orders")
    assert (stats["accepted"], stats["duplicates_dropped"]) == (1, 0)
    assert receive(oncebus_namespace, "orders", 1) == ["from the second test"]
"""
    )
    result = run(pytester)
    result.assert_outcomes(passed=2)


def test_advancing_the_clock_past_the_window_lets_a_resend_in(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        HELPERS
        + """
pytestmark = pytest.mark.oncebus_entities(
    queues={"payments": {"requires_duplicate_detection": True, "duplicate_detection_history_time_window": "PT1M"}}
)


def test_a_resend_after_the_window_is_accepted(oncebus_namespace):
    send(oncebus_namespace, "payments", ("charge", "p1"), ("charge again", "p1"))
    oncebus_namespace.advance(timedelta(minutes=1, seconds=1))
    send(oncebus_namespace, "payments", ("charge, much later", "p1"))
    stats = oncebus_namespace.stats("payments")
    assert (stats["accepted"], stats["duplicates_dropped"], stats["late_resends"]) == (2, 1, 1)
    assert receive(oncebus_namespace, "payments", 2) == ["charge", "charge, much later"]


def test_the_next_test_is_back_on_the_real_clock(oncebus_namespace):
    assert abs(oncebus_namespace.now() - datetime.now(UTC)) < timedelta(seconds=30)
"""
    )
    result = run(pytester)
    result.assert_outcomes(passed=2)


def test_xdist_runs_one_broker_per_worker(pytester: pytest.Pytester) -> None:
    records = pytester.path / "records"
    records.mkdir()
    pytester.makepyfile(
        HELPERS
        + f"""
RECORDS = {str(records)!r}


@pytest.mark.parametrize("n", range(6))
@pytest.mark.oncebus_entities(queues={{"orders": {{"requires_duplicate_detection": True}}}})
def test_each_test_has_its_own_namespace(oncebus_namespace, n):
    send(oncebus_namespace, "orders", ("same", "same-id"))
    stats = oncebus_namespace.stats("orders")
    assert (stats["accepted"], stats["duplicates_dropped"]) == (1, 0)
    worker = os.environ["PYTEST_XDIST_WORKER"]
    record = {{"worker": worker, "port": oncebus_namespace.port, "pid": oncebus_namespace.info["pid"]}}
    with open(os.path.join(RECORDS, f"{{n}}.json"), "w") as out:
        json.dump(record, out)
"""
    )
    result = run(pytester, "-p", "xdist", "-n", "2")
    result.assert_outcomes(passed=6)
    seen = [json.loads(path.read_text()) for path in records.iterdir()]
    by_worker: dict[str, set[tuple[int, int]]] = {}
    for record in seen:
        by_worker.setdefault(record["worker"], set()).add((record["port"], record["pid"]))
    assert set(by_worker) == {"gw0", "gw1"}
    assert all(len(brokers) == 1 for brokers in by_worker.values())  # one broker for the worker's session
    assert by_worker["gw0"] != by_worker["gw1"]


def test_a_marker_used_wrongly_is_a_clear_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
import pytest

@pytest.mark.oncebus_entities(queues="orders")
def test_string_instead_of_names(oncebus_namespace):
    pass

@pytest.mark.oncebus_entities(subscriptions=["a"])
def test_unknown_keyword(oncebus_namespace):
    pass
"""
    )
    result = run(pytester)
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*queues: give a list of names or a {name: properties} dict, not a string*"])
    result.stdout.fnmatch_lines(["*oncebus_entities(config=None, *, queues=None, topics=None)*subscriptions*"])


def test_the_ini_option_names_a_config_file(pytester: pytest.Pytester) -> None:
    (pytester.path / "servicebus.json").write_text(
        json.dumps({"UserConfig": {"Namespaces": [{"Topics": [{"Name": "events", "Subscriptions": [{"Name": "a"}]}]}]}})
    )
    pytester.makeini("[pytest]\noncebus_config = servicebus.json\n")
    pytester.makepyfile(
        """
def test_config_entities(oncebus_namespace):
    assert [s["name"] for s in oncebus_namespace.control("subscription.list", topic="events")] == ["a"]
"""
    )
    run(pytester).assert_outcomes(passed=1)


def test_thread_mode_serves_the_fixtures_from_the_test_process(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        HELPERS
        + """
@pytest.mark.oncebus_entities(queues={"orders": {"requires_duplicate_detection": True}})
def test_in_process(oncebus_namespace):
    assert oncebus_namespace.mode == "thread" and oncebus_namespace.info["pid"] == os.getpid()
    send(oncebus_namespace, "orders", ("a", "o1"), ("a", "o1"))
    oncebus_namespace.advance(timedelta(minutes=11))
    send(oncebus_namespace, "orders", ("b", "o1"))
    stats = oncebus_namespace.stats("orders")
    assert (stats["accepted"], stats["duplicates_dropped"]) == (2, 1)


def test_fresh(oncebus_namespace):
    assert oncebus_namespace.stats() == {}
"""
    )
    run(pytester, "--oncebus-mode", "thread").assert_outcomes(passed=2)
