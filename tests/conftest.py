"""The whole suite's hooks: the ``quick`` subset a contributor runs while working (``pytest -m quick``), and the
pass count of each official SDK's suite in the terminal summary.

Quick are the pure and in-process layers: the rule and the models (``tests/core``), the broker on the memory store
(``tests/broker``), and the repository's own checks (layering, exported names, the README). They start no server,
no browser, no JVM and no Spark, and run in well under two minutes on two cores; everything else runs in CI.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
QUICK_FOLDERS = ("core", "broker")
QUICK_FILES = ("test_layering.py", "test_exported_members.py", "test_readme.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        relative = item.path.resolve().relative_to(HERE) if item.path.resolve().is_relative_to(HERE) else None
        if relative is None:
            continue
        if relative.parts[0] in QUICK_FOLDERS or (len(relative.parts) == 1 and relative.name in QUICK_FILES):
            item.add_marker(pytest.mark.quick)


# ------------------------------------------------------------------------------------- the SDK suites' pass counts
# Each official SDK's suite (and the Python SDK's own tests, which run as one pytest case) says how many of its tests
# passed at the end of every run, with -q and with -n (xdist hands the workers' reports to these hooks): CI's log
# shows them without -s.
SDK_SUITES = {
    "tests/java/": "Java SDK (azure-messaging-servicebus, tests/java)",
    "tests/go/": "Go SDK (azservicebus, tests/go)",
    "tests/js/": "JavaScript SDK (@azure/service-bus, tests/js)",
    "tests/sdk_suite/": "azure-servicebus's own tests (tests/sdk_suite)",
}
SUMMARY_PROPERTY = "sdk_suite_summary"  # a test's record_property: lines added under its suite's count
_outcomes: dict[str, Counter[str]] = {}
_details: dict[str, list[str]] = {}


def _suite_of(nodeid: str) -> str | None:
    return next((prefix for prefix in SDK_SUITES if nodeid.startswith(prefix)), None)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    suite = _suite_of(report.nodeid)
    if suite is None:
        return
    counts = _outcomes.setdefault(suite, Counter())
    if report.when == "call" or (report.when == "setup" and not report.passed):
        if hasattr(report, "wasxfail"):
            counts["xfailed" if report.skipped else "xpassed"] += 1
        else:
            counts[report.outcome] += 1
    for name, value in report.user_properties:
        if name == SUMMARY_PROPERTY and report.when == "call":
            _details.setdefault(suite, []).extend(str(value).splitlines())


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _outcomes:
        return
    terminalreporter.section("official SDK suites")
    for suite, label in SDK_SUITES.items():
        counts = _outcomes.get(suite)
        if counts is None:
            continue
        extra = "".join(f", {counts[kind]} {kind}" for kind in ("skipped", "xfailed", "xpassed") if counts[kind])
        terminalreporter.write_line(f"{label}: {counts['passed']} passed, {counts['failed']} failed{extra}")
        for line in _details.get(suite, []):
            terminalreporter.write_line(f"    {line}")
