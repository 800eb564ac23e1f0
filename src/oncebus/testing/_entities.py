"""Entity declarations for the testing API: an emulator-format config, or ``queues=`` / ``topics=`` shorthands.

Both end up as one :class:`oncebus.broker.topology.Topology` (the parser ``oncebus serve
--config`` uses), so property names may be PascalCase (as in the emulator's config.json)
or snake_case (as in the SDK's administration client), and durations ISO-8601 text,
seconds or ``timedelta``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from oncebus.broker.topology import EntitySpec, Topology, load_topology, parse_topology
from oncebus.core.durations import format_duration
from oncebus.core.errors import InvalidArgumentError

Config = Mapping[str, Any] | str | os.PathLike[str]
Declared = Iterable[str] | Mapping[str, Mapping[str, Any] | None] | None


def _named(what: str, declared: Declared) -> list[tuple[str, dict[str, Any]]]:
    if declared is None:
        return []
    if isinstance(declared, str):
        raise InvalidArgumentError(f"{what}: give a list of names or a {{name: properties}} dict, not a string")
    if isinstance(declared, Mapping):
        out = []
        for name, props in declared.items():
            if props is not None and not isinstance(props, Mapping):
                raise InvalidArgumentError(f"{what} {name!r}: properties must be a dict, not {props!r}")
            out.append((str(name), dict(props or {})))
        return out
    return [(str(name), {}) for name in declared]


def declared_topology(queues: Declared = None, topics: Declared = None) -> Topology:
    """``queues={"orders": {"requires_duplicate_detection": True}}``, ``topics={"events": {"subscriptions":
    ["audit"]}}`` (names alone are fine: ``queues=["orders"]``)."""
    emulator_topics = []
    for name, props in _named("topics", topics):
        subs = _named(f"topic {name!r} subscriptions", props.pop("subscriptions", None))
        emulator_topics.append(
            {
                "Name": name,
                "Properties": props,
                "Subscriptions": [{"Name": sub, "Properties": sub_props} for sub, sub_props in subs],
            }
        )
    emulator_queues = [{"Name": name, "Properties": props} for name, props in _named("queues", queues)]
    config = {"UserConfig": {"Namespaces": [{"Queues": emulator_queues, "Topics": emulator_topics}]}}
    try:
        return parse_topology(config, source="declared entities")
    except InvalidArgumentError as exc:  # the place in the emulator format built here would only confuse
        raise InvalidArgumentError(re.sub(r" \(UserConfig\.[^)]*\)", "", str(exc))) from None


def config_topology(config: Config) -> Topology:
    """An emulator-format config.json: a dict, or the path of the file."""
    if isinstance(config, Mapping):
        return parse_topology(dict(config), source="config")
    return load_topology(Path(config))


def merged(*topologies: Topology) -> Topology:
    """One topology; an entity declared again (names are case-insensitive) takes the later properties."""
    specs: dict[tuple[str, str | None, str], EntitySpec] = {}
    out = Topology(source=" + ".join(t.source for t in topologies) or "declared entities")
    for topology in topologies:
        for spec in [*topology.queues, *topology.topics, *topology.subscriptions]:
            key = (spec.kind, None if spec.topic is None else spec.topic.lower(), spec.name.lower())
            earlier = specs.get(key)
            if earlier is not None:
                spec = dataclasses.replace(
                    spec,
                    properties={**earlier.properties, **spec.properties},
                    fields={**earlier.fields, **spec.fields},
                )
            specs[key] = spec
        out.warnings += topology.warnings
    for spec in specs.values():
        {"queue": out.queues, "topic": out.topics, "subscription": out.subscriptions}[spec.kind].append(spec)
    return out


def normalized_properties(kind: str, props: Mapping[str, Any]) -> dict[str, Any]:
    """A queue's, topic's or subscription's properties, PascalCase or snake_case, as the broker takes them."""
    if kind == "subscription":
        return declared_topology(topics={"topic": {"subscriptions": {"entity": props}}}).subscriptions[0].properties
    if kind == "topic":
        return declared_topology(topics={"entity": props}).topics[0].properties
    return declared_topology(queues={"entity": props}).queues[0].properties


def json_properties(props: Mapping[str, Any]) -> dict[str, Any]:
    """Properties as the control protocol carries them (durations as ISO-8601 text)."""
    return {key: format_duration(value) if isinstance(value, timedelta) else value for key, value in props.items()}


def config_file_text(config: Mapping[str, Any]) -> str:
    return json.dumps(config, default=lambda v: format_duration(v) if isinstance(v, timedelta) else str(v))
