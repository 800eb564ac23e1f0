"""The tier from the command line: ``serve --tier``, ``$ONCEBUS_TIER`` (also for commands run with no server)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.cli_support import ONCEBUS, Serve, assert_one_line_error, oncebus


def test_commands_without_a_server_take_the_tier_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = tmp_path / "data"
    refused = oncebus("queue", "create", "big", "--max-message-size-kb", "2048", data_dir=d)
    assert "'MaxMessageSizeInKilobytes' (2048) can be raised above 256 only" in assert_one_line_error(refused)
    monkeypatch.setenv("ONCEBUS_TIER", "premium")
    assert oncebus("queue", "create", "big", "--max-message-size-kb", "2048", data_dir=d).returncode == 0
    body = tmp_path / "body"
    body.write_bytes(b"x" * 300 * 1024)  # over Standard's 256 KB, within the entity's 2,048 KB
    assert oncebus("send", "big", "--file", str(body), data_dir=d).returncode == 0
    monkeypatch.setenv("ONCEBUS_TIER", "basic")
    wrong = oncebus("queue", "list", data_dir=d)
    assert "ONCEBUS_TIER='basic' is not allowed: give standard or premium" in assert_one_line_error(wrong, codes=(2,))
    monkeypatch.setenv("ONCEBUS_TIER", "standard")
    assert oncebus("queue", "list", data_dir=d).returncode == 0  # the refusal left the directory usable


def test_serve_refuses_a_tier_it_does_not_know(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    serve = [*ONCEBUS, "--data-dir", str(tmp_path / "data"), "serve", "--port", "0"]
    usage = subprocess.run([*serve, "--tier", "basic"], capture_output=True, text=True, timeout=60)
    assert "invalid choice: 'basic'" in assert_one_line_error(usage, codes=(2,))
    monkeypatch.setenv("ONCEBUS_TIER", "gold")
    refused = subprocess.run(serve, capture_output=True, text=True, timeout=60)
    assert "ONCEBUS_TIER='gold' is not allowed: give standard or premium" in assert_one_line_error(refused, codes=(2,))


def test_the_data_directory_keeps_its_tier(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A namespace served as Premium stays Premium when served again without --tier, and for commands run with no
    server; --tier (or $ONCEBUS_TIER) changes it, saying so."""
    monkeypatch.delenv("ONCEBUS_TIER", raising=False)
    d = tmp_path / "data"
    first = Serve(d, "--tier", "premium").start()
    assert "(Premium tier" in first.output()
    assert first.stop() == 0
    again = Serve(d).start()
    assert "(Premium tier" in again.output() and "tier changes" not in again.output()
    assert again.stop() == 0
    body = tmp_path / "body"
    body.write_bytes(b"x" * 300 * 1024)  # over Standard's 256 KB: only a Premium namespace takes it
    assert oncebus("queue", "create", "big", data_dir=d).returncode == 0
    assert oncebus("send", "big", "--file", str(body), data_dir=d).returncode == 0
    changed = Serve(d, "--tier", "standard").start()
    assert "the tier changes from Premium to Standard" in changed.output() and "(Standard tier" in changed.output()
    assert changed.stop() == 0
    refused = oncebus("send", "big", "--file", str(body), data_dir=d)
    assert refused.returncode != 0
