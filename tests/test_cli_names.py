"""Entity names ending in a newline (issue 18, item 6): refused by every door, nothing stored, listing unharmed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_support import Serve, assert_one_line_error, entities, oncebus


@pytest.mark.parametrize(
    "args",
    [
        ["queue", "create", "x\n"],
        ["topic", "create", "t\n"],
        ["subscription", "create", "t", "s\n"],
        ["queue", "create", "x\r\n"],
    ],
    ids=["queue", "topic", "subscription", "crlf"],
)
def test_cli_refuses_a_name_ending_in_a_newline(tmp_path: Path, args: list[str]) -> None:
    d = tmp_path / "data"
    assert oncebus("topic", "create", "t", data_dir=d).returncode == 0
    line = assert_one_line_error(oncebus(*args, data_dir=d))
    assert "is not valid" in line and "letters, digits" in line, line
    assert entities(d) == {"queue": [], "topic": ["t"], "subscription": []}
    assert oncebus("queue", "list", data_dir=d).returncode == 0


def test_config_refuses_a_name_ending_in_a_newline(tmp_path: Path) -> None:
    config = tmp_path / "c.json"
    queues = [{"Name": "ok", "Properties": {}}, {"Name": "cfgq\n", "Properties": {}}]
    config.write_text(json.dumps({"UserConfig": {"Namespaces": [{"Name": "n", "Queues": queues, "Topics": []}]}}))
    serve = Serve(tmp_path / "data", "--config", str(config)).start(expect_ready=False)
    assert serve.wait() == 1, serve.output()
    assert "'cfgq\\n'" in serve.output() and "is not valid" in serve.output(), serve.output()
    assert entities(tmp_path / "data") == {"queue": [], "topic": [], "subscription": []}


def test_cli_refuses_an_id_of_128_emoji(tmp_path: Path) -> None:
    d = tmp_path / "data"
    assert oncebus("queue", "create", "q", data_dir=d).returncode == 0
    line = assert_one_line_error(oncebus("send", "q", "x", "--message-id", "\N{GRINNING FACE}" * 128, data_dir=d))
    assert "256 UTF-16 code units" in line and "at most 128" in line, line
    assert oncebus("send", "q", "x", "--message-id", "\N{GRINNING FACE}" * 64, data_dir=d).returncode == 0
