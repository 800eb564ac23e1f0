"""The test clock file and the timer task: a bad value or a failing tick never stops the timers."""

from __future__ import annotations

import asyncio
import logging
import os
from datetime import timedelta
from pathlib import Path

import pytest

from oncebus.broker import ManualClock, Message, Namespace
from oncebus.broker.clock import FileClock
from oncebus.core.timeutil import MAX_US, us_to_datetime
from oncebus.store.memory import MemoryStore


def _write(path: Path, text: str, stamp: int) -> None:
    path.write_text(text)
    os.utime(path, ns=(stamp, stamp))  # a new mtime each write, however fast the test writes


def test_a_bad_value_in_the_clock_file_keeps_the_last_good_time_and_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "clock"
    clock = FileClock(path)
    _write(path, "1700000000000000", 1)
    assert clock.now_us() == 1_700_000_000_000_000
    with caplog.at_level(logging.ERROR, logger="oncebus.clock"):
        for stamp, bad in enumerate(["soon", "soon", "12.5", str(MAX_US + 1)], start=2):
            _write(path, bad, stamp)
            assert clock.now_us() == 1_700_000_000_000_000
            assert clock.now_us() == 1_700_000_000_000_000
    logged = [r.getMessage() for r in caplog.records if r.name == "oncebus.clock"]
    assert len(logged) == 3  # 'soon' once, then each other bad value once
    assert "'soon'" in logged[0] and str(path) in logged[0] and "keeping the last good time" in logged[0]
    _write(path, "1700000005000000", 9)
    assert clock.now_us() == 1_700_000_005_000_000


class _FlakyClock:
    """A ManualClock that raises on the reads it is told to, as a broken clock source would (it holds one rather
    than derives from it: the compiled ManualClock takes no interpreted subclass)."""

    def __init__(self) -> None:
        self.manual = ManualClock()
        self.fail_next = 0

    def now_us(self) -> int:
        if self.fail_next:
            self.fail_next -= 1
            raise ValueError("invalid literal for int() with base 10: 'soon'")
        return self.manual.now_us()

    def advance(self, seconds: float = 0.0) -> int:
        return self.manual.advance(seconds)


def test_the_timer_task_survives_a_failing_tick(caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> None:
        clock = _FlakyClock()
        ns = await Namespace.open(MemoryStore(), clock)
        await ns.create_queue("q")
        await ns.schedule_messages("q", Message(b"x", message_id="later"), us_to_datetime(clock.now_us() + 10**6))
        timers = asyncio.create_task(ns.run_timers(0.001))
        clock.fail_next = 5  # five ticks in a row fail
        while clock.fail_next:
            await asyncio.sleep(0.001)
        clock.advance(2)
        for _ in range(2500):  # the task still ticks: the scheduled message becomes active
            if ns.stats("q").active_message_count == 1:
                break
            await asyncio.sleep(0.002)
        assert not timers.done()
        assert ns.stats("q").active_message_count == 1
        timers.cancel()

    with caplog.at_level(logging.ERROR, logger="oncebus.broker"):
        asyncio.run(go())
    failures = [r for r in caplog.records if "timer tick failed" in r.getMessage()]
    assert len(failures) == 1  # logged once for the same error in a row


def test_a_clock_file_far_ahead_still_gives_times_a_receiver_can_read(tmp_path: Path) -> None:
    async def go() -> None:
        path = tmp_path / "clock"
        _write(path, str(MAX_US - 1_000_000), 1)  # a second before the end of year 9999
        ns = await Namespace.open(MemoryStore(), FileClock(path))
        await ns.create_queue("q", lock_duration="PT5M", default_message_time_to_live=timedelta(days=1))
        await ns.send("q", Message(b"x", message_id="m"))
        got = await ns.receive("q")
        assert got[0].locked_until_utc is not None and got[0].locked_until_utc.year == 9999
        assert got[0].expires_at_utc is None

    asyncio.run(go())
