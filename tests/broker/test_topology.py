from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from oncebus.broker import ManualClock, Namespace
from oncebus.broker.topology import apply_topology, load_topology
from oncebus.core.errors import ImmutablePropertyError, InvalidArgumentError
from oncebus.store.memory import MemoryStore
from tests.broker.conftest import run

EMULATOR_CONFIG = {
    "UserConfig": {
        "Namespaces": [
            {
                "Name": "sbemulatorns",
                "Queues": [
                    {
                        "Name": "queue.1",
                        "Properties": {
                            "DeadLetteringOnMessageExpiration": False,
                            "DefaultMessageTimeToLive": "PT1H",
                            "DuplicateDetectionHistoryTimeWindow": "P7D",
                            "ForwardDeadLetteredMessagesTo": "",
                            "ForwardTo": "",
                            "LockDuration": "PT1M",
                            "MaxDeliveryCount": 3,
                            "RequiresDuplicateDetection": True,
                            "RequiresSession": False,
                            "EnablePartitioning": True,
                        },
                    }
                ],
                "Topics": [
                    {
                        "Name": "topic.1",
                        "Properties": {
                            "DefaultMessageTimeToLive": "PT1H",
                            "DuplicateDetectionHistoryTimeWindow": "PT20S",
                            "RequiresDuplicateDetection": True,
                        },
                        "Subscriptions": [
                            {
                                "Name": "subscription.1",
                                "Properties": {"MaxDeliveryCount": 5, "LockDuration": "PT30S"},
                                "Rules": [{"Name": "app", "Properties": {"FilterType": "Correlation"}}],
                            }
                        ],
                    }
                ],
            }
        ],
        "Logging": {"Type": "File"},
    }
}


def test_emulator_config_creates_entities_and_reapplies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(EMULATOR_CONFIG))

    async def go() -> None:
        ns = await Namespace.open(MemoryStore(), ManualClock())
        await apply_topology(ns, load_topology(path))
        queue = ns.get_queue("queue.1")
        assert queue.requires_duplicate_detection and queue.enable_partitioning
        assert queue.duplicate_detection_history_time_window == timedelta(days=7)
        assert queue.max_delivery_count == 3
        assert ns.get_topic("topic.1").duplicate_detection_history_time_window == timedelta(seconds=20)
        assert ns.get_subscription("topic.1", "subscription.1").lock_duration == timedelta(seconds=30)
        await apply_topology(ns, load_topology(path))  # idempotent at every start
        changed = json.loads(json.dumps(EMULATOR_CONFIG))
        changed["UserConfig"]["Namespaces"][0]["Queues"][0]["Properties"]["RequiresDuplicateDetection"] = False
        path.write_text(json.dumps(changed))
        with pytest.raises(ImmutablePropertyError):
            await apply_topology(ns, load_topology(path))

    run(go())
    assert "Rules are not evaluated" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "not valid JSON"),
        ('{"Namespaces": []}', "UserConfig"),
        (
            '{"UserConfig": {"Namespaces": [{"Queues": [{"Name": "q", "Properties": {"ForwardTo": "other"}}]}]}}',
            "ForwardTo",
        ),
    ],
)
def test_bad_topology_files(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(InvalidArgumentError, match=message):
        load_topology(path)
