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


# ---------------------------------------------------------------- rule scenarios (subscription rules on a topic)


def load_rule_scenarios() -> list[dict[str, Any]]:
    """The 'rule_scenarios' of the shared file: a topic, its subscriptions' rules, sends, deliveries."""
    return list(json.loads(SCENARIO_FILE.read_text()).get("rule_scenarios", []))


def rule_scenario_ids() -> list[str]:
    return [s["name"] for s in load_rule_scenarios()]


def projected_deliveries(
    got: dict[str, list[dict[str, Any]]], scenario: dict[str, Any]
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[dict[str, Any]]]]:
    """(what was received, what was expected), each message cut down to the fields its expectation lists.

    ``got`` maps a subscription name to the messages received from it, each a
    dict of field names as in the scenario (message_id, correlation_id,
    subject, to, application_properties...). Compare the two with ``==``.
    """
    expected: dict[str, list[dict[str, Any]]] = scenario["delivered"]
    out: dict[str, list[dict[str, Any]]] = {}
    for name, wanted in expected.items():
        received = got.get(name, [])
        out[name] = [
            {key: message.get(key) for key in (wanted[i] if i < len(wanted) else {"message_id": None})}
            for i, message in enumerate(received)
        ]
    return out, expected
