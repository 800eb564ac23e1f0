"""``oncebus serve --config``: the emulator's own file loads unchanged; a bad file is refused whole, in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_support import EMULATOR_CONFIG, Serve, assert_one_line_error, entities, oncebus


def _config(queues: list[object], topics: list[object] | None = None) -> str:
    return json.dumps(
        {"UserConfig": {"Namespaces": [{"Name": "sbemulatorns", "Queues": queues, "Topics": topics or []}]}}
    )


def _queue(name: str, **props: object) -> dict[str, object]:
    return {"Name": name, "Properties": props}


GOOD = [_queue("first", RequiresDuplicateDetection=True), _queue("second", LockDuration="PT30S")]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("[]", ["top level", "object", "a list"]),
        ('{"UserConfig": {"Namespaces": [{"Queues": ["orders"]}]}}', ["Queues[0]", "object", "string 'orders'"]),
        (_config([*GOOD, {"Properties": {}}]), ["Queues[2]", "Name"]),
        (_config([*GOOD, _queue("third", DuplicateDetectionHistoryTimeWindow="PT5S")]), ["'third'", "00:00:20"]),
        (
            '{"UserConfig": {"Namespaces": [{"Queues": [{"Name": "q", "Properties": {"MaxDeliveryCount": NaN}}]}]}}',
            ["'q'", "MaxDeliveryCount", "NaN"],
        ),
        (_config([*GOOD, _queue("third", DefaultMessageTimeToLive=1e308)]), ["'third'", "DefaultMessageTimeToLive"]),
        (_config([*GOOD, _queue("third", LockDurationn="PT1M")]), ["'third'", "LockDurationn", "LockDuration"]),
        (
            _config(GOOD, [{"Name": "t", "Subscriptions": [{"Name": "s", "Properties": "PT1M"}]}]),
            ["subscription 't/s'", "Properties", "object"],
        ),
        (_config([*GOOD, _queue("First")]), ["'First'", "Queues[0]"]),
    ],
    ids=[
        "list-at-top",
        "string-entity",
        "missing-name",
        "third-invalid",
        "nan",
        "1e308",
        "unknown-property",
        "string-properties",
        "duplicate-name",
    ],
)
def test_bad_config_exits_1_in_one_line_and_stores_nothing(tmp_path: Path, content: str, expected: list[str]) -> None:
    config = tmp_path / "bad.json"
    config.write_text(content)
    serve = Serve(tmp_path / "data", "--config", str(config)).start(expect_ready=False)
    assert serve.wait() == 1, serve.output()
    line = assert_one_line_error_output(serve.output())
    for text in expected:
        assert text in line, line
    assert entities(tmp_path / "data") == {"queue": [], "topic": [], "subscription": []}


def assert_one_line_error_output(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line]
    assert len(lines) == 1 and "Traceback" not in output, output
    assert lines[0].startswith("oncebus: error: topology file "), lines[0]
    return lines[0]


def test_bad_config_leaves_existing_entities_as_they_were(tmp_path: Path) -> None:
    d = tmp_path / "data"
    assert oncebus("queue", "create", "first", "--duplicate-detection", "--window", "PT1M", data_dir=d).returncode == 0
    config = tmp_path / "bad.json"
    changed = _queue("first", RequiresDuplicateDetection=True, DuplicateDetectionHistoryTimeWindow="P1D")
    config.write_text(_config([changed, _queue("second"), _queue("third", MaxDeliveryCount=0)]))
    serve = Serve(d, "--config", str(config)).start(expect_ready=False)
    assert serve.wait() == 1
    assert "MaxDeliveryCount" in assert_one_line_error_output(serve.output())
    assert entities(d)["queue"] == ["first"]
    shown = json.loads(oncebus("queue", "show", "first", "--json", data_dir=d).stdout)
    assert shown["duplicate_detection_history_time_window"] == "PT1M"


def test_the_emulators_example_config_loads_unchanged(tmp_path: Path) -> None:
    assert "//" in EMULATOR_CONFIG.read_text()  # the official file, comments and all
    serve = Serve(tmp_path / "data", "--config", str(EMULATOR_CONFIG)).start()
    try:
        found = entities(serve.data_dir)
        assert found == {
            "queue": ["queue.1"],
            "topic": ["topic.1"],
            "subscription": [f"topic.1/subscription.{i}" for i in (1, 2, 3, 4)],
        }
        queue = json.loads(oncebus("queue", "show", "queue.1", "--json", data_dir=serve.data_dir).stdout)
        assert queue["lock_duration"] == "PT1M" and queue["max_delivery_count"] == 3
        assert "Rules are not evaluated" not in serve.output() and "warning" not in serve.output()
        rules = json.loads(
            oncebus("rule", "list", "topic.1", "subscription.4", "--json", data_dir=serve.data_dir).stdout
        )
        assert [(r["name"], r["filter"]["type"], r["action"]["sql_expression"]) for r in rules] == [
            ("sql-filter-1", "sql", "SET sys.To = 'Entity'")
        ]
        default = json.loads(
            oncebus("rule", "list", "topic.1", "subscription.3", "--json", data_dir=serve.data_dir).stdout
        )
        assert [r["name"] for r in default] == ["$Default"]
    finally:
        assert serve.stop() == 0
    again = Serve(tmp_path / "data", "--config", str(EMULATOR_CONFIG)).start()  # applying it again changes nothing
    assert again.stop() == 0
    assert entities(tmp_path / "data")["subscription"] == [f"topic.1/subscription.{i}" for i in (1, 2, 3, 4)]


def test_unreadable_config_is_one_line(tmp_path: Path) -> None:
    missing = oncebus("serve", "--port", "0", "--config", str(tmp_path / "nope.json"), data_dir=tmp_path / "data")
    assert "nope.json" in assert_one_line_error(missing)
    broken = tmp_path / "broken.json"
    broken.write_text('{"UserConfig": {"Namespaces": [\n  // a comment\n  {"Name": "x",, }]}}')
    result = oncebus("serve", "--port", "0", "--config", str(broken), data_dir=tmp_path / "data")
    line = assert_one_line_error(result)
    assert "broken.json" in line and "line 3" in line
