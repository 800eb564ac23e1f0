"""Loader of the shared scenario file (tests/data/scenarios.json), read by every layer's tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SCENARIO_FILE = Path(__file__).parent / "data" / "scenarios.json"


def load_scenarios() -> list[dict[str, Any]]:
    return list(json.loads(SCENARIO_FILE.read_text())["scenarios"])


def scenario_ids() -> list[str]:
    return [s["name"] for s in load_scenarios()]


def delivered_tuple(message: dict[str, Any]) -> tuple[str, str | None]:
    """What a delivery is compared by: (message_id, partition_key or session_id or None)."""
    return message["message_id"], message.get("partition_key") or message.get("session_id")


def expected_delivered(scenario: dict[str, Any]) -> list[tuple[str, str | None]]:
    return [delivered_tuple(m) for m in scenario["delivered"]]
