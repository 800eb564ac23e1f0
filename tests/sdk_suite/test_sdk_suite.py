"""azure-servicebus 7.15.0's own tests against ``oncebus serve`` (issue 35, item 4): the strictest outsider there is.

The pinned source release is downloaded from PyPI with pip (sha256 checked; kept in pytest's cache between runs),
and its tests run unchanged in a pytest subprocess, with our stand-ins for what they import from the Azure SDK
repository (standins/: ``devtools_testutils`` live only, ``servicebus_preparer`` creating entities through the
administration API), each test in a namespace of its own on one ``oncebus serve``, several at once (runner.py).

Every test must pass, except those listed below with the reason: EXPECTED_FAILURES must still fail (a fix, or a
new SDK, shows here and the entry goes), RACES may fail only with the error their own race gives, NOT_RUN are
skipped for the time they take. The lists name tests that must exist: a renamed test fails this module rather than
dropping out unseen. A test the release itself skips or marks xfail is counted apart. About six minutes on two
cores (the run prints its counts and time).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SUMMARY_PROPERTY
from tests.sdk_suite import runner

DATA_PLANE = [
    "test_queues.py",
    "test_sessions.py",
    "test_topic.py",
    "test_subscriptions.py",
    "test_list_sessions.py",
    "test_message.py",
]
ADMINISTRATION = [
    "mgmt_tests/test_mgmt_queues.py",
    "mgmt_tests/test_mgmt_topics.py",
    "mgmt_tests/test_mgmt_subscriptions.py",
    "mgmt_tests/test_mgmt_rules.py",
    "mgmt_tests/test_mgmt_namespaces.py",
    "mgmt_tests/test_topic_filter_counts.py",
    "mgmt_tests/test_topic_filter_counts_live.py",
    "mgmt_tests/async",  # the aio administration client: a few seconds
]
# tests/test_sb_client.py is not run: it imports azure-mgmt-servicebus and azure-common, which the suite does not
# install. The aio data-plane tests are not run (their waits would double the time); the aio administration ones are.

QUEUES = "test_queues.py::TestServiceBusQueue::"
SESSIONS = "test_sessions.py::TestServiceBusSession::"

EXPECTED_FAILURES: dict[str, str] = {
    f"{QUEUES}test_queue_operation_negative[pyamqp]": (
        "stale: its stand-in for the transport's settle_messages lacks the await_outcome keyword 7.15 passes "
        "(TypeError: unexpected keyword argument 'await_outcome')"
    ),
    f"{SESSIONS}test_next_available_session_timeout_value[pyamqp]": (
        "the 7.15 changelog (Breaking Changes) shortened a session wait: receive_messages(max_wait_time=5) on a "
        "receiver not yet open now bounds connecting to NEXT_AVAILABLE_SESSION too (5 s); the test still expects "
        "the receiver's max_wait_time=70 to govern it (> 65 s)"
    ),
    "test_message.py::TestServiceBusMessageBackcompat::test_message_property[pyamqp]": (
        "SDK 7.15: its decoder cannot read a decimal128, its own or .NET's (it takes the exponent from the first "
        "bytes shifted by 9 bits where Microsoft.Azure.Amqp's DecimalEncoding, which it follows, shifts by 7: "
        "Decimal('1.2345') reads as an overflow), so the receive-and-delete receive drops the message it took"
    ),
}

# tests that race a lock of their own against a wait of their own: Azure would decide the race as oncebus does, by
# the clock. Each passes, or fails with exactly the error its race gives (any other failure fails this module).
RACES: dict[str, tuple[str, str]] = {
    f"{SESSIONS}test_session_by_queue_client_conn_str_receive_handler_receiveanddelete[pyamqp]": (
        "azure.servicebus.exceptions.SessionLockLostError: the lock on session ",
        "its queue's session lock is 5 s (PT5S), taken when the receiver opens, and the receiver iterates until no "
        "message came for max_wait_time=5 s: the lock expires first (the link is detached with session-lock-lost, "
        "as Azure does) once its ten receives take longer than the broker's timer tick (0.5 s) after the accept, "
        "which they do when ten tests share the two cores",
    ),
}

NOT_RUN: dict[str, str] = {
    f"{QUEUES}test_queue_receive_keep_conn_alive[pyamqp]": "waits 305 s (the service's 240 s idle timeout, then 60 s)",
    f"{QUEUES}test_queue_receiver_sender_resume_after_link_timeout[pyamqp]": "waits 300 s",
    f"{QUEUES}test_queue_receive_handler_with_autolockrenew_many_msgs[pyamqp]": (
        "waits 100 s while the AutoLockRenewer keeps 300 locks of 55 s: passes alone (110 s here), but loses "
        "locks when the suite's other tests share the two cores"
    ),
    f"{SESSIONS}test_session_cancel_scheduled_messages[pyamqp]": "waits 260 s (13 receives of 20 s that get nothing)",
    "test_topic.py::TestServiceBusTopics::test_topic_by_servicebus_client_send_large_messages_w_sleep[pyamqp]": (
        "waits 100 s, and each send waits for the SDK's keep-alive thread, which blocks 60 s in a read with "
        "socket_timeout=60 (passes in 470 s here)"
    ),
}

WORKERS = 10  # the tests mostly wait (messages scheduled minutes ahead, locks expiring): several at once
# the tests that take long, with their time here (seconds): started first, side by side (runner.run)
DURATIONS: dict[str, float] = {
    f"{QUEUES}test_github_issue_6178[pyamqp]": 185,
    f"{SESSIONS}test_session_schedule_multiple_messages[pyamqp]": 132,
    f"{QUEUES}test_queue_cancel_scheduled_messages[pyamqp]": 123,
    f"{QUEUES}test_queue_schedule_multiple_messages[pyamqp]": 122,
    f"{SESSIONS}test_session_schedule_message[pyamqp]": 120,
    f"{QUEUES}test_queue_schedule_message[pyamqp]": 120,
    f"{QUEUES}test_queue_by_queue_client_conn_str_receive_handler_release_messages[pyamqp]": 87,
    f"{QUEUES}test_queue_by_queue_client_conn_str_receive_handler_with_autolockrenew[pyamqp]": 76,
    f"{SESSIONS}test_session_by_servicebus_client_session_pool[pyamqp]": 72,
    f"{QUEUES}test_queue_message_lock_renew[pyamqp]": 59,
    f"{QUEUES}test_queue_by_servicebus_client_renew_message_locks[pyamqp]": 53,
    f"{QUEUES}test_queue_send_twice[pyamqp]": 50,
    f"{QUEUES}test_queue_by_queue_client_conn_str_receive_handler_receiveanddelete_prefetch[pyamqp]": 45,
    f"{SESSIONS}test_session_by_servicebus_client_renew_client_locks[pyamqp]": 43,
    f"{QUEUES}test_queue_by_queue_client_conn_str_receive_handler_with_auto_autolockrenew[pyamqp]": 38,
    f"{SESSIONS}test_next_available_session_timeout_value[pyamqp]": 36,
    f"{SESSIONS}test_session_by_conn_str_receive_handler_with_auto_autolockrenew[pyamqp]": 35,
    f"{QUEUES}test_queue_message_expiry[pyamqp]": 34,
    f"{SESSIONS}test_session_by_conn_str_receive_handler_with_autolockrenew[pyamqp]": 33,
    f"{QUEUES}test_queue_message_time_to_live[pyamqp]": 33,
    f"{QUEUES}test_queue_by_servicebus_client_iter_messages_with_retrieve_deferred_not_found[pyamqp]": 30,
    f"{QUEUES}test_queue_by_servicebus_conn_str_client_iter_messages_with_abandon[pyamqp]": 30,
    f"{QUEUES}test_queue_by_queue_client_conn_str_receive_handler_receiveanddelete[pyamqp]": 27,
    f"{QUEUES}test_queue_by_servicebus_client_iter_messages_with_retrieve_deferred_receiver_deadletter[pyamqp]": 26,
    "test_list_sessions.py::TestServiceBusListSessions::test_list_subscription_sessions_updated_after[pyamqp]": 25,
    "test_list_sessions.py::TestServiceBusListSessions::test_list_queue_sessions_updated_after[pyamqp]": 25,
    f"{QUEUES}test_queue_message_receive_and_delete[pyamqp]": 24,
    f"{SESSIONS}test_session_by_session_client_conn_str_receive_handler_with_no_session[pyamqp]": 24,
    f"{QUEUES}test_queue_receive_batch_without_setting_prefetch[pyamqp]": 23,
    f"{QUEUES}test_queue_by_servicebus_client_iter_messages_simple[pyamqp]": 23,
    f"{QUEUES}test_queue_receiver_alive_after_timeout[pyamqp]": 22,
    "test_subscriptions.py::TestServiceBusSubscription::test_subscription_receive_and_delete_with_send_and_wait"
    "[pyamqp]": 22,
}
PREFIX = "tests/"


def _cache_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    cache = getattr(request.config, "cache", None)
    if os.environ.get("ONCEBUS_SDK_SUITE_CACHE"):
        return Path(os.environ["ONCEBUS_SDK_SUITE_CACHE"])
    return cache.mkdir("sdk-suite") if cache is not None else tmp_path / "cache"


def _plane(node_id: str) -> str:
    return "administration" if node_id.startswith(f"{PREFIX}mgmt_tests/") else "data plane"


def _lost_race(node: str, outcome: dict[str, Any]) -> bool:
    """A test listed in RACES that failed with exactly the error its race gives."""
    race = RACES.get(node.removeprefix(PREFIX))
    return race is not None and outcome["outcome"] == "failed" and str(outcome["message"]).startswith(race[0])


def _summary(outcomes: dict[str, dict[str, Any]], seconds: float) -> list[str]:
    lines = [f"azure-servicebus {runner.SDK_VERSION}'s own tests against oncebus ({seconds:.0f} s):"]
    for plane in ("data plane", "administration"):
        counts = Counter(str(o["outcome"]) for n, o in outcomes.items() if _plane(n) == plane)
        not_run = sum(1 for n in outcomes if _plane(n) == plane and n.removeprefix(PREFIX) in NOT_RUN)
        expected = sum(1 for n in outcomes if _plane(n) == plane and n.removeprefix(PREFIX) in EXPECTED_FAILURES)
        races = sum(1 for n, o in outcomes.items() if _plane(n) == plane and _lost_race(n, o))
        run = sum(counts.values()) - not_run
        lines.append(
            f"  {plane}: {counts['passed']} passed of {run} run ({counts['failed']} failed, of them {expected} "
            f"listed and {races} lost a race of their own; {counts['skipped'] - not_run} skipped and "
            f"{counts['xfailed']} xfailed by the tests themselves, {counts['xpassed']} xpassed); {not_run} not run "
            "(waits)"
        )
    return lines


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_sdks_own_tests_pass_against_oncebus(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    record_property: Callable[[str, object], None],
) -> None:
    archive = runner.obtain_sdist(_cache_dir(request, tmp_path))
    work = runner.prepare(archive, tmp_path / "work")
    server = runner.Server(tmp_path / "data").start()
    try:
        result = runner.run(
            work,
            server,
            DATA_PLANE + ADMINISTRATION,
            WORKERS,
            not_run={PREFIX + node: reason for node, reason in NOT_RUN.items()},
            durations={PREFIX + node: seconds for node, seconds in DURATIONS.items()},
        )
    finally:
        server.stop()
    outcomes = result.outcomes
    summary = _summary(outcomes, result.seconds)
    with capsys.disabled():
        print("\n" + "\n".join(summary))
    record_property(SUMMARY_PROPERTY, "\n".join(summary))  # tests/conftest.py prints it in the terminal summary

    assert outcomes, f"no test ran:\n{result.output[-5000:]}"
    report = f"(the run's report: {work / 'output.txt'})"
    missing = sorted(n for n in [*EXPECTED_FAILURES, *NOT_RUN, *RACES] if PREFIX + n not in outcomes)
    assert missing == [], f"listed tests the release no longer has: {missing}"
    unexpected = {
        node: str(o["message"])[:500]
        for node, o in outcomes.items()
        if o["outcome"] == "failed" and node.removeprefix(PREFIX) not in EXPECTED_FAILURES and not _lost_race(node, o)
    }
    assert unexpected == {}, f"failed, not listed {report}:\n" + "\n".join(f"{n}: {m}" for n, m in unexpected.items())
    fixed = sorted(n for n in EXPECTED_FAILURES if outcomes[PREFIX + n]["outcome"] != "failed")
    assert fixed == [], f"listed as failing but did not fail (remove them from EXPECTED_FAILURES): {fixed}"
    skipped = sorted(n for n in NOT_RUN if "not run: " not in str(outcomes[PREFIX + n]["message"]))
    assert skipped == [], f"listed as not run but ran: {skipped}"
