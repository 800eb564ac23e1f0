"""A real full disk under ``oncebus serve``: a small tmpfs the test mounts (skipped where it cannot).

The SDK is told why its send was refused; once space is free, sends are accepted without a restart;
after SIGKILL and a restart every acknowledged message is there once, and nothing refused is.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusError

from tests.store.test_files_deleted_under_serve import Serve, _drain, cli

FULL = "database or disk is full"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "fs"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {made.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _try_send(connection_string: str, mid: str, size: int) -> ServiceBusError | None:
    with ServiceBusClient.from_connection_string(connection_string, retry_total=0) as client:
        with client.get_queue_sender("q") as sender:
            try:
                sender.send_messages(ServiceBusMessage(b"z" * size, message_id=mid))
            except ServiceBusError as exc:
                return exc
    return None


def test_a_full_disk_is_reported_to_the_sdk_and_sends_resume_once_space_is_free(small_disk: Path) -> None:
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * 2_500_000)  # freed later: room for the WAL to be checkpointed into the database
    data = small_disk / "data"
    server = Serve(data)
    try:
        cli(data, "queue", "create", "q", "--duplicate-detection")
        acked: list[str] = []
        refusal: ServiceBusError | None = None
        for i in range(100):
            refusal = _try_send(server.connection_string, f"m-{i}", 50_000)
            if refusal is not None:
                break
            acked.append(f"m-{i}")
        assert refusal is not None, "the disk never filled up"
        assert FULL in str(refusal) and "free disk space" in str(refusal), str(refusal)
        refused = f"m-{len(acked)}"
        stats = None
        for _ in range(50):  # refused while reloading; then the count is what was committed
            try:
                stats = cli(data, "stats", "q", "--json")
                break
            except AssertionError:
                time.sleep(0.1)
        assert stats is not None and f'"accepted": {len(acked)},' in stats

        filler.unlink()  # space again: no restart
        for _ in range(100):
            if _try_send(server.connection_string, refused, 50_000) is None:
                acked.append(refused)
                break
            time.sleep(0.1)
        else:
            raise AssertionError("sends were not accepted again once space was free")
        server.kill()
        full_lines = [line for line in server.output if FULL in line]
        assert len(full_lines) == 1, server.output  # logged once
        assert any("accepts writes again" in line for line in server.output)

        server = Serve(data)
        got = _drain(server.connection_string)
        assert sorted(got) == sorted(acked) and len(got) == len(set(got))
    finally:
        server.stop()
