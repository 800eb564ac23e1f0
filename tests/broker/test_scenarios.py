"""The shared scenarios against the broker engine, on the in-memory store and on SQLite, via a queue and a topic."""

from __future__ import annotations

from typing import Any

import pytest

from oncebus.broker import ManualClock, Message, Namespace
from oncebus.core.errors import InvalidArgumentError
from oncebus.core.timeutil import us_to_datetime
from tests.broker.conftest import StoreFactory, run
from tests.scenarios import expected_delivered, load_scenarios, scenario_ids

START = 1_800_000_000_000_000


def _message(spec: dict[str, Any]) -> Message:
    return Message(
        body=b"x",
        message_id=spec.get("message_id"),
        partition_key=spec.get("partition_key"),
        session_id=spec.get("session_id"),
    )


async def run_on_broker(scenario: dict[str, Any], stores: StoreFactory, kind: str) -> dict[str, list[Any]]:
    clock = ManualClock(START)
    ns = await Namespace.open(stores.open(), clock)
    entity = scenario["entity"]
    if kind == "queue":
        await ns.create_queue("q", **entity)
        paths = ["q"]
    else:
        await ns.create_topic("q", **entity)
        await ns.create_subscription("q", "one")
        await ns.create_subscription("q", "two")
        paths = ["q/Subscriptions/one", "q/Subscriptions/two"]
    delivered: dict[str, list[Any]] = {p: [] for p in paths}

    async def drain() -> None:
        for path in paths:
            while got := await ns.receive(path, 100):
                for m in got:
                    delivered[path].append((m.message_id, m.partition_key or m.session_id))
                    await ns.complete(path, m.lock_token)  # type: ignore[arg-type]

    for step in scenario["steps"]:
        clock.set(START + round(step["at"] * 1_000_000))
        ns.tick()
        if "set_window" in step:
            update = ns.update_queue if kind == "queue" else ns.update_topic
            await update("q", duplicate_detection_history_time_window=step["set_window"])
        if "restart" in step:
            await ns.close()
            ns = await Namespace.open(stores.open(), clock)
        if "receive_complete" in step:
            await drain()
        try:
            if "send" in step:
                await ns.send("q", _message(step["send"]))
            elif "batch" in step:
                await ns.send("q", [_message(m) for m in step["batch"]])
            elif "schedule" in step:
                when = us_to_datetime(clock.now_us() + round(step["enqueue_after"] * 1_000_000))
                await ns.schedule_messages("q", _message(step["schedule"]), when)
            else:
                continue
        except InvalidArgumentError:
            assert step.get("error"), f"step {step} failed unexpectedly"
            continue
        assert not step.get("error"), f"step {step} should have failed"
    ns.tick()
    await drain()
    return delivered


@pytest.mark.parametrize("kind", ["queue", "topic"])
@pytest.mark.parametrize("scenario", load_scenarios(), ids=scenario_ids())
def test_scenario_on_broker(scenario: dict[str, Any], stores: StoreFactory, kind: str) -> None:
    delivered = run(run_on_broker(scenario, stores, kind))
    for path, got in delivered.items():
        assert got == expected_delivered(scenario), path
