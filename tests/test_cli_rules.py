"""``oncebus rule create|list|show|delete`` and the forwarding options, run as a user runs them.

With no server (the CLI opens the data directory itself) and against a
running ``oncebus serve`` (through its control socket): the same operations.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oncebus.cli_rules import correlation_filter
from oncebus.core.errors import InvalidArgumentError
from oncebus.core.rules import filter_from_dict
from tests.cli_support import Serve, assert_one_line_error, oncebus


def _ok(*args: str, data_dir: Path) -> str:
    result = oncebus(*args, data_dir=data_dir)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _rules_roundtrip(d: Path) -> None:
    _ok("topic", "create", "events", data_dir=d)
    _ok("subscription", "create", "events", "audit", data_dir=d)
    assert "$Default: filter TRUE" in _ok("rule", "list", "events", "audit", data_dir=d)
    made = json.loads(
        _ok(
            "rule", "create", "events", "audit", "red",
            "--sql", "color = 'red' AND sys.Label LIKE 'order%'",
            "--action", "SET sys.To = 'pager'",
            "--json",
            data_dir=d,
        )
    )  # fmt: skip
    assert made["filter"] == {"type": "sql", "sql_expression": "color = 'red' AND sys.Label LIKE 'order%'"}
    assert made["action"] == {"sql_expression": "SET sys.To = 'pager'"}
    out = _ok(
        "rule", "create", "events", "audit", "vip", "--correlation", "label=vip", "--correlation", "tier:=3",
        "--correlation", "region=eu", data_dir=d,
    )  # fmt: skip
    assert 'created rule vip: filter correlation label=vip tier=3 region="eu"' in out
    listed = json.loads(_ok("rule", "list", "events", "audit", "--json", data_dir=d))
    assert [r["name"] for r in listed] == ["$Default", "red", "vip"]
    assert listed[2]["filter"] == {"type": "correlation", "label": "vip", "properties": {"tier": 3, "region": "eu"}}
    shown = _ok("rule", "show", "events", "audit", "red", data_dir=d)
    assert shown.strip() == "red: filter color = 'red' AND sys.Label LIKE 'order%'; action SET sys.To = 'pager'"

    bad = oncebus("rule", "create", "events", "audit", "bad", "--sql", "color = = 'red'", data_dir=d)
    line = assert_one_line_error(bad)
    assert "line 1, column 9" in line
    taken = oncebus("rule", "create", "events", "audit", "RED", "--true", data_dir=d)
    assert "already" in assert_one_line_error(taken)

    assert _ok("rule", "delete", "events", "audit", "$Default", data_dir=d).strip() == "deleted rule $Default"
    _ok("rule", "delete", "events", "audit", "vip", data_dir=d)
    _ok("rule", "delete", "events", "audit", "red", data_dir=d)
    assert "(no rules: the subscription receives nothing)" in _ok("rule", "list", "events", "audit", data_dir=d)
    missing = oncebus("rule", "delete", "events", "audit", "red", data_dir=d)
    assert "could not be found" in assert_one_line_error(missing)


def test_rule_commands_without_a_server(tmp_path: Path) -> None:
    _rules_roundtrip(tmp_path / "data")


def test_rule_commands_through_a_running_server(tmp_path: Path) -> None:
    serve = Serve(tmp_path / "data").start()
    try:
        _rules_roundtrip(serve.data_dir)
    finally:
        assert serve.stop() == 0


def test_forwarding_and_auto_delete_options(tmp_path: Path) -> None:
    d = tmp_path / "data"
    _ok("queue", "create", "sink", data_dir=d)
    made = json.loads(
        _ok("queue", "create", "source", "--forward-to", "sink", "--auto-delete-on-idle", "PT10M", "--json", data_dir=d)
    )
    assert (made["forward_to"], made["auto_delete_on_idle"]) == ("sink", "PT10M")
    _ok("topic", "create", "events", data_dir=d)
    sub = json.loads(
        _ok(
            "subscription", "create", "events", "s", "--forward-dead-lettered-to", "sink",
            "--no-dead-letter-on-filter-exceptions", "--json", data_dir=d,
        )
    )  # fmt: skip
    assert sub["forward_dead_lettered_messages_to"] == "sink"
    assert sub["dead_lettering_on_filter_evaluation_exceptions"] is False
    cleared = json.loads(_ok("queue", "update", "source", "--forward-to", "", "--json", data_dir=d))
    assert cleared["forward_to"] is None
    short = oncebus("queue", "create", "idle", "--auto-delete-on-idle", "PT1M", data_dir=d)
    assert "at least 5 minutes" in assert_one_line_error(short)
    nowhere = oncebus("queue", "create", "lost", "--forward-to", "nope", data_dir=d)
    assert "nope" in assert_one_line_error(nowhere)
    _ok("queue", "update", "source", "--forward-to", "sink", data_dir=d)
    loop = oncebus("queue", "update", "sink", "--forward-to", "source", data_dir=d)
    assert "loop" in assert_one_line_error(loop)


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        (["label=vip"], {"type": "correlation", "label": "vip"}),
        (["Subject=vip", "CorrelationId=c"], {"type": "correlation", "label": "vip", "correlation_id": "c"}),
        (
            ["to=x", "n:=3", "ok:=true", "r:=0.5"],
            {"type": "correlation", "to": "x", "properties": {"n": 3, "ok": True, "r": 0.5}},
        ),
        (['label:="typed"'], {"type": "correlation", "properties": {"label": "typed"}}),  # := is a property
        (["url=a=b"], {"type": "correlation", "properties": {"url": "a=b"}}),
    ],
)
def test_correlation_items(items: list[str], expected: dict[str, object]) -> None:
    data = correlation_filter(items)
    assert data == expected
    filter_from_dict(data)  # a valid filter


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["novalue"], "use KEY=VALUE"),
        (["=x"], "the key is empty"),
        (["n:=nope"], "not a JSON value"),
        (["n:=[1]"], "string, number or boolean"),
        (["label=a", "subject=b"], "given twice"),
    ],
)
def test_bad_correlation_items(items: list[str], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        correlation_filter(items)
