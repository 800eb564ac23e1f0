"""The file clock ``oncebus.testing`` drives: ``+N`` (the system time N µs ahead) next to the absolute form."""

from __future__ import annotations

import os
import time
from pathlib import Path

from oncebus.broker.clock import FileClock

HOUR_US = 3_600_000_000


def write(path: Path, text: str, stamp_ns: int) -> None:
    """As the testing API writes it: a new file, with an mtime of its own."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.utime(temporary, ns=(stamp_ns, stamp_ns))
    os.replace(temporary, path)


def system_us() -> int:
    return time.time_ns() // 1000


def test_without_the_file_the_clock_is_the_system_time(tmp_path: Path) -> None:
    clock = FileClock(tmp_path / "clock")
    before = system_us()
    assert before <= clock.now_us() <= system_us()


def test_an_offset_runs_ahead_of_the_system_time_and_keeps_running(tmp_path: Path) -> None:
    path = tmp_path / "clock"
    write(path, f"+{HOUR_US}\n", 1)
    clock = FileClock(path)
    before = system_us()
    first = clock.now_us()
    assert before + HOUR_US <= first <= system_us() + HOUR_US
    time.sleep(0.002)
    assert clock.now_us() > first  # it runs, unlike the absolute form


def test_an_absolute_time_stands_still(tmp_path: Path) -> None:
    path = tmp_path / "clock"
    write(path, "1700000000000000", 1)
    clock = FileClock(path)
    assert clock.now_us() == clock.now_us() == 1_700_000_000_000_000


def test_every_replacement_is_seen_even_with_the_same_mtime(tmp_path: Path) -> None:
    """Writes within one timestamp tick: a replaced file is a new inode, and that is enough to re-read it."""
    path = tmp_path / "clock"
    clock = FileClock(path)
    for step in range(1, 6):
        write(path, f"+{step * HOUR_US}", 1_000_000_000)
        assert clock.now_us() >= system_us() + step * HOUR_US - 1_000_000


def test_a_lower_offset_rewinds_and_a_time_in_the_past_does_not(tmp_path: Path) -> None:
    path = tmp_path / "clock"
    write(path, f"+{24 * HOUR_US}", 1)
    clock = FileClock(path)
    ahead = clock.now_us()
    write(path, "+0", 2)  # the testing API's reset: back to the real time on purpose
    back = clock.now_us()
    assert back < ahead - 23 * HOUR_US
    write(path, str(back - HOUR_US), 3)  # an absolute time behind: held, never backwards
    assert clock.now_us() >= back


def test_a_bad_offset_keeps_the_last_good_one(tmp_path: Path) -> None:
    path = tmp_path / "clock"
    write(path, f"+{HOUR_US}", 1)
    clock = FileClock(path)
    assert clock.now_us() >= system_us() + HOUR_US - 1_000_000
    for stamp, bad in enumerate(["+soon", "+-5", "+"], start=2):
        write(path, bad, stamp)
        assert clock.now_us() >= system_us() + HOUR_US - 1_000_000
