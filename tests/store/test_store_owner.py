"""One process owns a SQLite store file: the in-process API refuses a file that ``oncebus serve`` (or another
program) has open, as the CLI does, instead of writing behind its back (issue 33 item 7)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from oncebus import DataDirBusyError, SqliteStore
from tests.amqp.conftest import ServerProcess


def test_the_in_process_api_refuses_the_directory_a_running_server_serves(tmp_path: Path) -> None:
    """Failed before: ``Namespace.open(SqliteStore(...))`` on a served directory created a queue and sent into a
    queue the server did not see until it restarted (sequence numbers and dedup history diverged)."""
    server = ServerProcess(tmp_path / "data").start()
    try:
        with pytest.raises(DataDirBusyError) as refused:
            SqliteStore(tmp_path / "data" / "oncebus.db")
        text = str(refused.value)
        assert "oncebus.db" in text and "in use by another process" in text
        assert f"pid {server.process.pid}" in text  # type: ignore[union-attr]
    finally:
        server.stop()
    store = SqliteStore(tmp_path / "data" / "oncebus.db")  # the server stopped: the file is free again
    store.close()


def test_another_process_holding_the_file_refuses_it_here_until_it_closes(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import sys; from oncebus import SqliteStore; s = SqliteStore({str(tmp_path / 'oncebus.db')!r}); "
            "print('open', flush=True); sys.stdin.readline(); s.close(); print('closed', flush=True)",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(DataDirBusyError, match=f"pid {holder.pid}"):
            SqliteStore(tmp_path / "oncebus.db")
        other = SqliteStore(tmp_path / "other.db")  # another file is another store
        other.close()
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "closed"
    finally:
        holder.kill()
        holder.wait(30)
    again = SqliteStore(tmp_path / "oncebus.db")
    again.close()


def test_one_process_may_open_its_file_again_before_closing_it(tmp_path: Path) -> None:
    """As SQLite's own locks: within a process the owner lock is shared, and held until the last store closes."""
    first = SqliteStore(tmp_path / "oncebus.db")
    second = SqliteStore(tmp_path / "oncebus.db")
    first.close()
    probe = [sys.executable, "-c", f"from oncebus import SqliteStore; SqliteStore({str(tmp_path / 'oncebus.db')!r})"]
    still = subprocess.run(probe, capture_output=True, text=True, timeout=60)
    assert still.returncode != 0 and "DataDirBusyError" in still.stderr
    second.close()
    free = subprocess.run(probe, capture_output=True, text=True, timeout=60)
    assert free.returncode == 0, free.stderr


def test_a_killed_owner_frees_the_file(tmp_path: Path) -> None:
    """The lock is the kernel's: a process killed while holding the store leaves nothing to clean up."""
    script = textwrap.dedent(
        f"""
        import os, signal
        from oncebus import SqliteStore
        store = SqliteStore({str(tmp_path / "oncebus.db")!r})
        print("open", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "open" and result.returncode == -9
    store = SqliteStore(tmp_path / "oncebus.db")
    store.close()


def test_the_in_process_example_does_not_aim_at_the_servers_directory() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "in-process.md").read_text()
    assert "SqliteStore(" in page and 'SqliteStore(".oncebus/' not in page
