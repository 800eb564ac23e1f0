"""The shared scenarios against the rule alone (core)."""

from __future__ import annotations

from typing import Any

import pytest

from oncebus.core import DuplicateDetector, parse_duration
from oncebus.core.durations import to_micros
from oncebus.core.errors import InvalidArgumentError
from oncebus.core.keys import require_identifiable
from tests.scenarios import delivered_tuple, expected_delivered, load_scenarios, scenario_ids


def _detector(entity: dict[str, Any]) -> DuplicateDetector:
    return DuplicateDetector(
        requires_duplicate_detection=entity.get("requires_duplicate_detection", False),
        window=parse_duration(entity.get("duplicate_detection_history_time_window", "PT10M")),
        partitioned=entity.get("enable_partitioning", False),
    )


def run_on_core(scenario: dict[str, Any]) -> list[tuple[str, str | None]]:
    entity = scenario["entity"]
    detector = _detector(entity)
    history: dict[str, int] = {}
    survivors: list[dict[str, Any]] = []
    for step in scenario["steps"]:
        now = round(step["at"] * 1_000_000)
        messages = step.get("batch") or [m for m in (step.get("send"), step.get("schedule")) if m]
        if "set_window" in step:
            detector.set_window(parse_duration(step["set_window"]), now)
        if "restart" in step:
            window = detector.window
            detector = _detector(entity)
            detector.set_window(window, now)
            for key, t0 in sorted(history.items(), key=lambda kv: kv[1]):
                if t0 + to_micros(window) > now:
                    detector.index.restore(key, t0)
        if not messages:
            continue
        try:
            batch_keys = []
            for m in messages:
                require_identifiable(
                    m.get("message_id"),
                    m.get("partition_key"),
                    m.get("session_id"),
                    partitioned=detector.partitioned,
                    requires_duplicate_detection=detector.enabled,
                )
                batch_keys.append(detector.key_of(m["message_id"], m.get("partition_key"), m.get("session_id")))
        except InvalidArgumentError:
            assert step.get("error"), f"step {step} failed unexpectedly"
            continue
        assert not step.get("error"), f"step {step} should have failed"
        for m, key in zip(messages, batch_keys, strict=True):
            if not detector.judge(key, now).duplicate:
                history[key] = now
                survivors.append(m)
    return [delivered_tuple(m) for m in survivors]


@pytest.mark.parametrize("scenario", load_scenarios(), ids=scenario_ids())
def test_scenario_on_core(scenario: dict[str, Any]) -> None:
    # the core has no queue, so it compares survivors without delivery order
    assert sorted(run_on_core(scenario), key=str) == sorted(expected_delivered(scenario), key=str)
