"""The store as a user of the command line meets it: a damaged or unreadable file, entity deletion, the lock."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from oncebus.cli import main
from oncebus.server.datadir import DataDir
from oncebus.store.sqlite_layout import SCHEMA_VERSION


def _damage_a_table(path: Path) -> None:
    """A file that opens as SQLite but whose message table is garbage."""
    main(["--data-dir", str(path.parent), "queue", "create", "q"])
    db = sqlite3.connect(path)
    (root,) = db.execute("SELECT rootpage FROM sqlite_master WHERE name = 'message'").fetchone()
    (page_size,) = db.execute("PRAGMA page_size").fetchone()
    db.close()
    with open(path, "r+b") as handle:
        handle.seek((root - 1) * page_size)
        handle.write(b"\xff" * page_size)


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda p: p.write_bytes(b"definitely not a database " * 200), "is not a readable oncebus database"),
        (lambda p: p.mkdir(), "cannot open"),
        (_damage_a_table, "could not be read"),
    ],
    ids=["garbage", "a-directory", "a-damaged-table"],
)
def test_a_damaged_store_gives_one_clear_line_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: object, expected: str
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    store = data / "oncebus.db"
    damage(store)  # type: ignore[operator]
    capsys.readouterr()
    code = main(["--data-dir", str(data), "queue", "list"])
    err = capsys.readouterr().err
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert expected in lines[0] and str(store) in lines[0]
    assert "Traceback" not in err


def test_serve_on_a_damaged_store_exits_with_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "oncebus.db").write_bytes(b"\x00garbage" * 1000)
    result = subprocess.run(
        [sys.executable, "-m", "oncebus.cli", "--data-dir", str(data), "serve", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "is not a readable oncebus database" in lines[0] and "backup" in lines[0], lines


def test_a_store_from_a_newer_release_is_refused_by_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    assert main(["--data-dir", str(data), "queue", "create", "q"]) == 0
    db = sqlite3.connect(data / "oncebus.db")
    db.execute("PRAGMA user_version = 99")
    db.commit()
    db.close()
    capsys.readouterr()
    assert main(["--data-dir", str(data), "queue", "list"]) == 1
    assert f"newer oncebus (store schema 99; this version reads up to {SCHEMA_VERSION})" in capsys.readouterr().err


def test_deleting_a_queue_from_the_cli_keeps_the_queue_named_under_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"

    def cli(*args: str) -> str:
        capsys.readouterr()
        assert main(["--data-dir", str(data), *args]) == 0, capsys.readouterr().err
        return capsys.readouterr().out

    cli("queue", "create", "orders", "--duplicate-detection")
    cli("queue", "create", "orders/eu", "--duplicate-detection")
    cli("send", "orders/eu", "hello", "--message-id", "eu-1")
    cli("queue", "delete", "orders")
    assert [q["name"] for q in json.loads(cli("queue", "list", "--json"))] == ["orders/eu"]
    assert [m["message_id"] for m in json.loads(cli("peek", "orders/eu", "--json"))] == ["eu-1"]
    assert json.loads(cli("send", "orders/eu", "again", "--message-id", "eu-1", "--json"))["duplicates_dropped"] == 1


def test_the_lock_holds_when_the_data_directorys_files_are_deleted(tmp_path: Path) -> None:
    owner = DataDir(tmp_path / "data")
    assert owner.try_lock()
    owner.write_server_info({"pid": os.getpid(), "control_port": 1})
    for name in os.listdir(owner.path):
        os.unlink(owner.path / name)
    other = DataDir(tmp_path / "data")
    assert not other.try_lock()  # the directory itself is locked, not only the file that was deleted
    owner._restore()  # what the watcher does every second
    assert owner.owner_pid() == str(os.getpid())
    assert other.read_server_info() == {"pid": os.getpid(), "control_port": 1}
    owner.unlock()
    assert other.try_lock()
    other.unlock()


@pytest.mark.parametrize(("name", "value"), [("ONCEBUS_CHECKPOINT_KEYS", "lots"), ("ONCEBUS_CHECKPOINT_SECONDS", "-1")])
def test_a_bad_checkpoint_setting_in_the_environment_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    assert (
        main(["--data-dir", str(tmp_path / "data"), "queue", "list"]) == 2
    )  # a usage error, named before the data directory is opened
    err = capsys.readouterr().err
    assert f"{name}={value!r} is not" in err and "internal error" not in err
