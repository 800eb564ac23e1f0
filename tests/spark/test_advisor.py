"""The window advisor on a send log written the way the broker writes it."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from oncebus.core import DuplicateDetector
from oncebus.core.durations import parse_duration
from oncebus.core.errors import ArgumentOutOfRangeError
from oncebus.spark import advise, write_advice
from oncebus.spark._advisor import main

S = 1_000_000
T0 = 1_795_000_000 * S


def _send_log(entity: str, window_s: int, seed: int) -> list[dict[str, Any]]:
    """Sends judged by the core, logged with their outcome, as the broker logs them."""
    rng = random.Random(seed)
    sends: list[tuple[int, str]] = []
    for i in range(600):
        t = T0 + i * 500_000
        sends.append((t, f"m{i}"))
        for _ in range(rng.choice([0, 0, 1, 2])):
            delay = rng.choice([rng.randrange(0, 5 * S), rng.randrange(10 * S, 90 * S), window_s * S])
            sends.append((t + delay, f"m{i}"))
    sends.sort()
    detector = DuplicateDetector(
        requires_duplicate_detection=True, window=timedelta(seconds=window_s), partitioned=False
    )
    records = []
    for t, key in sends:
        verdict = detector.judge(key, t)
        outcome = "duplicate" if verdict.duplicate else ("late" if verdict.late_resend_delay_us else "new")
        when = datetime.fromtimestamp(t / S, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        records.append(
            {
                "entity": entity,
                "key": key,
                "message_id": key,
                "time": when,
                "time_us": t,
                "outcome": outcome,
                "window_us": window_s * S,
            }
        )
    return records


def _missed(records: list[dict[str, Any]], window_us: int) -> int:
    times: dict[str, list[int]] = defaultdict(list)
    for r in records:
        times[r["key"]].append(r["time_us"])
    missed = 0
    for ts in times.values():
        t0 = None
        for t in sorted(ts):
            if t0 is None or t >= t0 + window_us:
                missed += t0 is not None
                t0 = t
    return missed


@pytest.fixture(scope="module")
def send_log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[dict[str, Any]]]]:
    folder = tmp_path_factory.mktemp("sendlog")
    orders = _send_log("orders", 20, seed=1)
    topic = _send_log("mytopic", 60, seed=2)
    half = len(orders) // 2
    for name, part in (("a.jsonl", orders[:half]), ("b.json", orders[half:])):
        (folder / name).write_text("".join(json.dumps(r) + "\n" for r in part))
    (folder / "nested").mkdir()
    pq.write_table(pa.Table.from_pylist(topic), folder / "nested" / "topic.parquet")
    return folder, {"orders": orders, "mytopic": topic}


def test_advice_matches_the_log(spark: SparkSession, send_log: tuple[Path, dict[str, list[dict[str, Any]]]]) -> None:
    folder, logs = send_log
    advice = advise(spark, str(folder), share=0.99, candidates=["PT20S", "PT1M", "PT2M"])
    assert set(advice["entities"]) == {"orders", "mytopic"}
    for entity, records in logs.items():
        got = advice["entities"][entity]
        first: dict[str, int] = {}
        delays = []
        for r in sorted(records, key=lambda r: r["time_us"]):
            if r["key"] in first:
                delays.append(r["time_us"] - first[r["key"]])
            else:
                first[r["key"]] = r["time_us"]
        assert got["sends"] == len(records)
        assert got["resends"] == len(delays)
        assert got["duplicates"] == sum(r["outcome"] == "duplicate" for r in records)
        assert got["late"] == sum(r["outcome"] == "late" for r in records)
        assert got["duplicate_rate"] == pytest.approx(got["duplicates"] / len(records))
        assert got["resend_delay_s"]["max"] == max(delays) / S
        window = parse_duration(got["recommended_window"])
        caught = sum(d < window.total_seconds() * S for d in delays) / len(delays)
        assert caught >= 0.99
        if not got["recommended_clamped"] and window > timedelta(seconds=20):
            smaller = window.total_seconds() - 1
            assert sum(d < smaller * S for d in delays) / len(delays) < 0.99
        for row in got["what_if"]:
            assert row["resends_missed"] == _missed(records, int(row["window_s"] * S)), (entity, row["window"])
            assert row["index_bytes"] == row["keys_held"] * 40


def test_write_advice_and_main(
    spark: SparkSession,
    send_log: tuple[Path, dict[str, list[dict[str, Any]]]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder, _ = send_log
    advice = advise(spark, str(folder))
    table = write_advice(advice, tmp_path / "advice")
    assert "orders" in table and "recommended" in table
    assert json.loads((tmp_path / "advice" / "advice.json").read_text())["share"] == 0.999
    assert (tmp_path / "advice" / "advice.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main([str(folder), "--out", str(tmp_path / "cli"), "--candidates", "PT30S,PT5M"]) == 0
    assert "what if, mytopic" in capsys.readouterr().out
    assert (tmp_path / "cli" / "advice.png").exists()


def test_candidates_are_validated(spark: SparkSession, send_log: tuple[Path, Any]) -> None:
    with pytest.raises(ArgumentOutOfRangeError, match=r"between 00:00:20 and 7\.00:00:00"):
        advise(spark, str(send_log[0]), candidates=["PT10S"])
