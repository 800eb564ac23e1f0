"""Entities from a topology file in the official Service Bus emulator's ``config.json`` format.

``UserConfig.Namespaces[].Queues|Topics[].Properties`` (and
``Topics[].Subscriptions[]``) with PascalCase Service Bus property names,
e.g. ``RequiresDuplicateDetection`` and ``DuplicateDetectionHistoryTimeWindow``.
Differences from the emulator: properties it lacks (``EnablePartitioning``,
``MaxSizeInMegabytes``, ``MaxMessageSizeInKilobytes`` …) are accepted; the
history window may be anything Service Bus allows (20 s to 7 days); all
namespaces of the file are merged into oncebus's one namespace; subscription
``Rules`` are not evaluated yet (every subscription receives every message,
and a warning says so); ``ForwardTo`` must be empty.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oncebus.broker.namespace import Namespace
from oncebus.core.errors import EntityNotFoundError, InvalidArgumentError

_IGNORED = {"forward_to", "forward_dead_lettered_messages_to", "status", "auto_delete_on_idle"}


@dataclass
class Topology:
    queues: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    topics: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    subscriptions: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _properties(where: str, raw: Any, warnings: list[str]) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InvalidArgumentError(f"{where}: Properties must be an object")
    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = _snake(key)
        if name in _IGNORED:
            if value not in (None, "", "Active", "P10675199DT2H48M5.4775807S"):
                raise InvalidArgumentError(f"{where}: {key} = {value!r} is not supported by oncebus; leave it empty")
            continue
        out[name] = value
    return out


def parse_topology(data: dict[str, Any]) -> Topology:
    topology = Topology()
    user = data.get("UserConfig")
    if not isinstance(user, dict) or not isinstance(user.get("Namespaces"), list):
        raise InvalidArgumentError("topology file: expected {'UserConfig': {'Namespaces': [...]}} (emulator format)")
    for namespace in user["Namespaces"]:
        for queue in namespace.get("Queues") or []:
            name = queue.get("Name")
            props = _properties(f"queue {name!r}", queue.get("Properties"), topology.warnings)
            topology.queues.append((name, props))
        for topic in namespace.get("Topics") or []:
            name = topic.get("Name")
            props = _properties(f"topic {name!r}", topic.get("Properties"), topology.warnings)
            topology.topics.append((name, props))
            for sub in topic.get("Subscriptions") or []:
                sub_name = sub.get("Name")
                where = f"subscription {name!r}/{sub_name!r}"
                sub_props = _properties(where, sub.get("Properties"), topology.warnings)
                if sub.get("Rules"):
                    topology.warnings.append(
                        f"{where}: Rules are not evaluated by oncebus yet; it receives every message of the topic"
                    )
                topology.subscriptions.append((name, sub_name, sub_props))
    return topology


def load_topology(path: str | Path) -> Topology:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise InvalidArgumentError(f"topology file {path}: {exc.strerror}") from exc
    except ValueError as exc:
        raise InvalidArgumentError(f"topology file {path} is not valid JSON: {exc}") from exc
    return parse_topology(data)


async def apply_topology(namespace: Namespace, topology: Topology) -> None:
    """Create what is missing; update what exists (properties fixed at creation must match)."""
    for warning in topology.warnings:
        print(f"oncebus: warning: {warning}", file=sys.stderr)
    for name, props in topology.queues:
        try:
            namespace.get_queue(name)
        except EntityNotFoundError:
            await namespace.create_queue(name, **props)
        else:
            await namespace.update_queue(name, **props)
    for name, props in topology.topics:
        try:
            namespace.get_topic(name)
        except EntityNotFoundError:
            await namespace.create_topic(name, **props)
        else:
            await namespace.update_topic(name, **props)
    for topic, name, props in topology.subscriptions:
        try:
            namespace.get_subscription(topic, name)
        except EntityNotFoundError:
            await namespace.create_subscription(topic, name, **props)
        else:
            await namespace.update_subscription(topic, name, **props)
