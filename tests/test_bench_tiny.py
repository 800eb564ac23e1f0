"""Every script under bench/ runs, at a tiny size, so none rots unseen (issue 34: ``bench/dedup_window.py`` had
stopped running at all). The figures a tiny run prints mean nothing and are not read; only that each script
completes, prints what it measured, and leaves no process behind is held here."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY: dict[str, list[str]] = {
    "amqp_decode": ["--number", "20", "--repeat", "1"],
    "amqp_frames": ["--transfers", "200", "--repeat", "1"],
    "amqp_floor": ["--messages", "400", "--senders", "1", "--receivers", "1", "--repeat", "1"],
    "amqp_send": ["--messages", "400", "--senders", "1", "--receivers", "1", "--repeat", "1", "--idle-backlog", "100"],
    "amqp_syscalls": ["--messages", "400", "--senders", "1", "--receivers", "1"],
    "amqp_transactions": ["--rounds", "1"],
    "backlog": ["--messages", "2000", "--senders", "1", "--receive", "500", "--receivers", "1"],
    "cluster_failover": ["--messages", "500"],
    "compiled": ["--messages", "200", "--senders", "1", "--receivers", "1", "--rounds", "1", "--number", "20"],
    "dedup_window": ["--keys", "20000", "--checks", "5000", "--sends", "200", "--senders", "2", "--rounds", "1"],
    "idle_links": ["--connections", "1", "--links", "50", "--sends", "20", "--idle-seconds", "1"],
    "metrics_overhead": ["--seconds", "0.5", "--repeat", "1", "--queues", "2", "--topics", "1", "--senders", "2"],
    "namespaces": ["--quick"],
    "receive_bound": ["--round-trips", "500", "--clients", "1", "--repeat", "1"],
    "receive_calls": ["--messages", "200", "--receivers", "1", "--top", "3"],
    "rules_eval": ["--quick"],
    "send_calls": ["--messages", "200", "--senders", "1", "--top", "3"],
    "rules_fanout": ["--messages", "200", "--rounds", "1"],
    "spark_dedup": [
        "--rows",
        "20000",
        "--batch-rows-large",
        "5000",
        "--small-rows",
        "5000",
        "--batch-rows-small",
        "1000",
    ],
    "store_memory": ["--messages", "2000"],
    "store_records": ["--batches", "5", "--batch", "10"],
    "settlement_apply": ["--messages", "400", "--batch", "50", "--repeat", "1", "--shape", "realistic"],
    "settlement_record": ["--rounds", "2", "--records", "50"],
    "send_inprocess": ["--messages", "200", "--batch", "20", "--repeat", "1", "--cprofile", "--top", "3"],
    "store_segments": ["--messages", "400", "--batch", "20", "--deletes", "50", "--repeat", "1"],
    "store_send": ["--messages", "400", "--senders", "1", "--receivers", "1", "--repeat", "1", "--resends", "20"],
    "testing_startup": ["--quick"],
}


def test_every_bench_has_a_tiny_size() -> None:
    assert sorted(TINY) == sorted(p.stem for p in (ROOT / "bench").glob("*.py"))


@pytest.mark.parametrize("name", sorted(TINY))
def test_the_bench_runs_at_a_tiny_size(name: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / f"{name}.py"), *TINY[name]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"bench/{name}.py failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert done.stdout.strip(), f"bench/{name}.py printed nothing"


def test_the_store_settings_comparison_runs(tmp_path: Path) -> None:
    """``bench/send_inprocess.py``'s other mode, the store against itself with each setting (the tiny run above takes
    the default one): it sets what it says (its own check) and prints the ratios."""
    bench = [sys.executable, str(ROOT / "bench" / "send_inprocess.py"), "--messages", "100", "--batch", "20"]
    for setting in (["--secure-delete", "1,FAST"], ["--page-sizes", "4096,8192"]):
        done = subprocess.run(
            [*bench, "--repeat", "1", *setting], cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False
        )
        assert done.returncode == 0, f"{setting} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        assert "ratio " in done.stdout and "receive + complete" in done.stdout, done.stdout


def test_the_backlog_bench_times_crash_restarts(tmp_path: Path) -> None:
    """``bench/backlog.py --kill`` (a kept store, each start sent ``--after`` messages and SIGKILLed): the crash
    restarts it times hold every acknowledged send's key, so the keys held grow by ``--after`` each start."""
    bench = [sys.executable, str(ROOT / "bench" / "backlog.py"), "--workdir", str(tmp_path / "data")]
    for args in (["--messages", "300", "--senders", "1"], ["--restarts", "2", "--kill", "--after", "100"]):
        done = subprocess.run([*bench, *args], cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, f"bench/backlog.py {args} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    starts = [line for line in done.stdout.splitlines() if "keys held: ready after" in line]
    assert any("after SIGKILL" in line for line in starts), done.stdout
    held = [int(m.group(1).replace(",", "")) for line in starts if (m := re.search(r"([\d,]+) keys held", line))]
    assert len(held) == len(starts) >= 2, done.stdout
    assert [b - a for a, b in itertools.pairwise(held)] == [100] * (len(held) - 1), done.stdout
