"""The conftest.py of the SDK's tests run against oncebus (copied beside their ``tests`` folder by
tests/sdk_suite/test_sdk_suite.py, so it is loaded before theirs).

- routes the SDK's connections for ``localhost`` to ``oncebus serve`` and trusts its CA (oncebus_live.route);
- gives each test a namespace of its own, and the environment variables ``sb_env_loader.ServiceBusPreparer``
  reads for it (live, the tests' PowerShellPreparer reads ``SERVICEBUS_*``);
- provides the ``test_proxy`` fixture their conftest.py asks for (nothing: there is no recording proxy);
- writes each test's outcome to ``ONCEBUS_SUITE_OUTCOMES`` (JSON), for the runner to compare with its list;
- puts back the SDK's transport classes after each test: ``test_queue_receive_handler_peek_check_uniq_corr_id``
  sets ``receiver._amqp_transport.parse_received_message`` (the class itself) and never restores it, so
  whichever tests its worker ran next met its hack (two of test_message.py's, when xdist handed them to it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import oncebus_live
import pytest

oncebus_live.route()

OUTCOMES: dict[str, dict[str, Any]] = {}


def pytest_configure(config: pytest.Config) -> None:
    for marker in ("liveTest", "live_test_only", "playback_test_only", "asyncio"):
        config.addinivalue_line("markers", f"{marker}: (azure-servicebus's tests)")


@pytest.fixture(scope="session")
def test_proxy() -> None:
    return None


@pytest.fixture(autouse=True)
def oncebus_namespace(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    import sb_env_loader  # the release's tests/sb_env_loader.py (on sys.path once their conftest.py is loaded)

    name = oncebus_live.open_namespace()
    live = {
        "servicebus_connection_str": oncebus_live.connection_string(),
        "servicebus_fully_qualified_namespace": oncebus_live.HOST,
        "servicebus_sas_policy": oncebus_live.key_name(),
        "servicebus_sas_key": oncebus_live.key(),
    }
    # the others (entity names the pipeline's ARM template makes, which the chosen tests do not use) keep their fakes
    for variable, fake in sb_env_loader.ServiceBusPreparer.keywords.items():
        monkeypatch.setenv(variable.upper(), live.get(variable, fake))
    try:
        yield name
    finally:
        oncebus_live.close_namespace()


@pytest.fixture(autouse=True)
def transport_classes_restored() -> Iterator[None]:
    from azure.servicebus._transport._pyamqp_transport import PyamqpTransport

    saved = dict(vars(PyamqpTransport))
    try:
        yield
    finally:
        for name in [n for n in vars(PyamqpTransport) if n not in saved]:
            delattr(PyamqpTransport, name)
        for name, value in saved.items():
            if vars(PyamqpTransport).get(name) is not value:
                setattr(PyamqpTransport, name, value)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests the runner leaves out (``ONCEBUS_SUITE_NOT_RUN``: node id -> reason) are skipped with their reason,
    so a renamed or removed one shows as missing rather than silently not run. With several workers, the tests
    known to take long (``ONCEBUS_SUITE_DURATIONS``: node id -> seconds) go first, longest first, so that they run
    side by side rather than one after another at the end (xdist ``--dist load --maxschedchunk 1`` hands each
    worker two tests, then one at a time: the first two of each are paired long with shorter)."""
    not_run = json.loads(os.environ.get("ONCEBUS_SUITE_NOT_RUN", "{}"))
    for item in items:
        if item.nodeid in not_run:
            item.add_marker(pytest.mark.skip(reason=f"not run: {not_run[item.nodeid]}"))
    durations = json.loads(os.environ.get("ONCEBUS_SUITE_DURATIONS", "{}"))
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    known = sorted((i for i in items if i.nodeid in durations), key=lambda i: -float(durations[i.nodeid]))
    if workers < 2 or not known:
        return
    rest = [i for i in items if i.nodeid not in durations]
    if len(known) >= 2 * workers:
        longest, next_longest = known[:workers], known[workers : 2 * workers]
        first = [test for pair in zip(longest, reversed(next_longest), strict=True) for test in pair]
        known = first + known[2 * workers :]
    items[:] = known + rest


def _record(report: pytest.TestReport | pytest.CollectReport, outcome: str) -> None:
    entry = OUTCOMES.setdefault(report.nodeid, {"outcome": "passed", "duration": 0.0, "message": ""})
    entry["duration"] += getattr(report, "duration", 0.0)
    if outcome != "passed" and entry["outcome"] != "failed":
        entry["outcome"] = outcome
        if report.longrepr is not None:
            crash = getattr(report.longrepr, "reprcrash", None)
            entry["message"] = crash.message if crash is not None else str(report.longrepr)
            if isinstance(report.longrepr, tuple):  # a skip: (file, line, reason)
                entry["message"] = str(report.longrepr[2])
        if outcome == "xfailed":
            entry["message"] = f"xfail: {getattr(report, 'wasxfail', '')} ({entry['message']})"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    outcome = report.outcome
    if hasattr(report, "wasxfail"):  # the test's own xfail mark: met (xfailed) or not (xpassed)
        outcome = "xfailed" if report.skipped else "xpassed"
    if report.when == "call" or outcome != "passed":
        _record(report, outcome)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _record(report, "failed")


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("ONCEBUS_SUITE_OUTCOMES")
    if path and not hasattr(session.config, "workerinput"):  # the xdist controller (or a run without xdist)
        with open(path, "w", encoding="utf-8") as out:
            json.dump(OUTCOMES, out, indent=1, sort_keys=True)
