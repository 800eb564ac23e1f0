"""A namespace of its own on a shared broker: :meth:`OncebusServer.create_namespace` and the plugin's
``oncebus_isolated_namespace`` fixture (``oncebus.server.namespaces`` serves them)."""

from __future__ import annotations

import warnings
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from oncebus.core.timeutil import us_to_datetime
from oncebus.testing._entities import (
    Config,
    Declared,
    config_topology,
    declared_topology,
    json_properties,
    merged,
    normalized_properties,
)

if TYPE_CHECKING:
    from oncebus.server.topology import Topology


class Broker(Protocol):
    """What a namespace needs of the broker it lives on (``OncebusServer`` is one)."""

    host: str
    port: int

    def control(self, op: str, **args: Any) -> Any: ...


class IsolatedNamespace:
    """A namespace created on a running broker: its own entities, messages, dedup history, faults and clock.

    ``connection_string`` is the broker's with ``@<name>`` appended to the key name: give it to any SDK.
    It lives in the broker's memory until :meth:`delete` (or the broker stops)."""

    def __init__(self, server: Broker, info: dict[str, Any]) -> None:
        self.server = server
        self.name: str = info["name"]
        self.connection_string: str = info["connection_string"]

    def __repr__(self) -> str:
        return f"<IsolatedNamespace {self.name!r} on {self.server.host}:{self.server.port}>"

    def control(self, op: str, **args: Any) -> Any:
        """One control operation run on this namespace (``oncebus.server.control``)."""
        return self.server.control(op, namespace=self.name, **args)

    # ------------------------------------------------------------------------------ entities
    def create_queue(self, name: str, **properties: Any) -> dict[str, Any]:
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
        parts = [config_topology(config)] if config is not None else []
        self.create_topology(merged(*parts, declared_topology(queues, topics)))

    def create_topology(self, topology: Topology) -> None:
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

    # ------------------------------------------------------------------------------ reading, faults
    def stats(self, name: str | None = None) -> Any:
        rows = self.control("stats", name=name)
        if name is not None:
            return rows[0]
        return {row["name"]: row for row in rows}

    def peek(self, path: str, max_message_count: int = 10) -> list[dict[str, Any]]:
        return list(self.control("peek", path=path, max_message_count=max_message_count))

    def arm_fault(self, kind: str, entity: str | None = None, **spec: Any) -> str:
        """As :meth:`OncebusServer.arm_fault`, on this namespace only."""
        fault: dict[str, Any] = {"kind": kind, "entity": entity}
        for key, value in spec.items():
            fault[key] = value.total_seconds() if isinstance(value, timedelta) else value
        return str(self.control("fault.arm", fault={k: v for k, v in fault.items() if v is not None})["id"])

    def clear_faults(self, fault_id: str | None = None) -> int:
        return int(self.control("fault.clear", id=fault_id)["cleared"])

    # ------------------------------------------------------------------------------ its own clock
    def now(self) -> datetime:
        """This namespace's time (UTC)."""
        return us_to_datetime(self.control("clock.tick")["now_us"])

    def advance(self, delta: timedelta | float) -> datetime:
        """Move this namespace's time forward (no other namespace's) and apply what falls due, without sleeping."""
        step = delta if isinstance(delta, timedelta) else timedelta(seconds=delta)
        if step < timedelta(0):
            raise ValueError(f"advance({delta!r}): a namespace's time only moves forward")
        us = step // timedelta(microseconds=1)
        return us_to_datetime(self.server.control("namespaces.advance", name=self.name, us=us)["now_us"])

    def delete(self) -> None:
        """Remove the namespace with everything in it (connections bound to it are closed)."""
        self.server.control("namespaces.delete", name=self.name)
