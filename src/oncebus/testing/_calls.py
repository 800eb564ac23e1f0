"""The calls a test makes on a broker or on one of its namespaces, each one control operation
(``oncebus.server.control``): the same for ``OncebusServer`` and ``IsolatedNamespace``, which give ``control``."""

from __future__ import annotations

import warnings
from datetime import datetime
from typing import Any

from oncebus.core.timeutil import us_to_datetime
from oncebus.server.topology import Topology
from oncebus.testing._entities import (
    Config,
    Declared,
    config_topology,
    declared_topology,
    json_properties,
    merged,
    normalized_properties,
)


class ControlCalls:
    """Entities, statistics, peeks, faults and the time, through :meth:`control`."""

    def control(self, op: str, **args: Any) -> Any:
        raise NotImplementedError

    # ------------------------------------------------------------------------------ entities
    def create_queue(self, name: str, **properties: Any) -> dict[str, Any]:
        """Create a queue; properties as the SDK's administration client names them (``requires_duplicate_detection
        =True``, ``duplicate_detection_history_time_window=timedelta(minutes=10)``) or as in the emulator's config."""
        props = json_properties(normalized_properties("queue", properties))
        return dict(self.control("queue.create", name=name, properties=props))

    def create_topic(self, name: str, **properties: Any) -> dict[str, Any]:
        props = json_properties(normalized_properties("topic", properties))
        return dict(self.control("topic.create", name=name, properties=props))

    def create_subscription(self, topic: str, name: str, **properties: Any) -> dict[str, Any]:
        props = json_properties(normalized_properties("subscription", properties))
        return dict(self.control("subscription.create", topic=topic, name=name, properties=props))

    def create_entities(
        self, config: Config | None = None, *, queues: Declared = None, topics: Declared = None
    ) -> None:
        """Create what an emulator-format config (dict or path) and/or ``queues=`` / ``topics=`` declare."""
        parts = [config_topology(config)] if config is not None else []
        self.create_topology(merged(*parts, declared_topology(queues, topics)))

    def create_topology(self, topology: Topology) -> None:
        """Create the entities of a parsed topology (``oncebus.server.topology.Topology``)."""
        for warning in topology.warnings:
            warnings.warn(f"oncebus: {warning}", stacklevel=3)
        if not (topology.queues or topology.topics or topology.subscriptions):
            return
        self.control(
            "entities.create",
            queues=[[q.name, json_properties(q.properties)] for q in topology.queues],
            topics=[[t.name, json_properties(t.properties)] for t in topology.topics],
            subscriptions=[[s.topic, s.name, json_properties(s.properties)] for s in topology.subscriptions],
        )

    # ------------------------------------------------------------------------------ reading, faults, time
    def stats(self, name: str | None = None) -> Any:
        """``oncebus stats`` as data: one entity's dict (accepted, duplicates_dropped, keys_held, late_resends,
        active ...), or without a name ``{entity name: dict}`` for all."""
        rows = self.control("stats", name=name)
        if name is not None:
            return rows[0]
        return {row["name"]: row for row in rows}

    def peek(self, path: str, max_message_count: int = 10) -> list[dict[str, Any]]:
        """Messages waiting on a queue or ``topic/Subscriptions/sub`` (``…/$DeadLetterQueue`` too), left in place."""
        return list(self.control("peek", path=path, max_message_count=max_message_count))

    def clear_faults(self, fault_id: str | None = None) -> int:
        """Disarm one fault, or all of them (``reset()`` and the plugin's fresh namespace do too)."""
        return int(self.control("fault.clear", id=fault_id)["cleared"])

    def now(self) -> datetime:
        """The time here: the broker's, or a namespace's own (UTC; asking applies what is due at that time)."""
        return us_to_datetime(self.control("clock.tick")["now_us"])
