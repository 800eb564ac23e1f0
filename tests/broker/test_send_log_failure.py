"""The send log (``serve --send-log``) only observes sends: a failure to write it (disk full, a directory gone)
must not fail a send half-way, which would leave keys judged new whose messages were never stored, so the
client's resend would be dropped as a duplicate and the message lost."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from oncebus.broker import ManualClock, Message, Namespace
from oncebus.core.timeutil import us_to_datetime
from oncebus.store.memory import MemoryStore
from oncebus.store.sendlog import SendLogWriter


def _failing_log(fail_from: int) -> Any:
    calls = [0]

    def log(record: dict[str, Any]) -> None:
        calls[0] += 1
        if calls[0] > fail_from:
            raise OSError(28, "No space left on device")

    return log


@pytest.mark.parametrize("fail_from", [0, 1, 2])
def test_a_send_log_that_fails_neither_fails_the_send_nor_loses_its_messages(fail_from: int) -> None:
    async def go() -> None:
        ns = await Namespace.open(MemoryStore(), ManualClock(), send_log=_failing_log(fail_from))
        await ns.create_queue("q", requires_duplicate_detection=True)
        batch = [Message(f"m{i}".encode(), message_id=f"m{i}") for i in range(3)]
        outcomes = await ns.send("q", batch)
        assert [o.duplicate for o in outcomes] == [False, False, False]
        assert ns.stats("q").active_message_count == 3
        again = await ns.send("q", batch)  # the resend is what it is: three duplicates of stored messages
        assert [o.duplicate for o in again] == [True, True, True]
        assert sorted(m.body for m in await ns.receive("q", 10)) == [b"m0", b"m1", b"m2"]

    asyncio.run(go())


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_the_send_log_writer_on_a_full_disk_keeps_the_broker_sending(tmp_path: Path) -> None:
    async def go() -> None:
        clock = ManualClock()
        writer = SendLogWriter(tmp_path, flush_every=0.0)
        name = f"sends-{us_to_datetime(clock.now_us()):%Y%m%dT%H}.jsonl"
        (tmp_path / name).symlink_to("/dev/full")  # every flush: ENOSPC
        ns = await Namespace.open(MemoryStore(), clock, send_log=writer)
        await ns.create_queue("q", requires_duplicate_detection=True)
        outcomes = await ns.send("q", [Message(b"a", message_id="a"), Message(b"b", message_id="b")])
        assert [o.duplicate for o in outcomes] == [False, False]
        assert ns.stats("q").active_message_count == 2

    asyncio.run(go())


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_closing_a_send_log_on_a_full_disk_does_not_raise(tmp_path: Path) -> None:
    writer = SendLogWriter(tmp_path, flush_every=3600.0)  # the line waits in the buffer until close
    (tmp_path / "sends-20261129T00.jsonl").symlink_to("/dev/full")  # the hour of the time_us below
    writer({"time_us": 1_795_912_000_000_000, "entity": "q", "key": "k"})
    writer.close()
    writer.close()
