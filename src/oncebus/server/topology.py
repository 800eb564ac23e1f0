"""Entities from a topology file in the official Service Bus emulator's ``config.json`` format.

``UserConfig.Namespaces[].Queues|Topics[].Properties`` (and
``Topics[].Subscriptions[]``) with PascalCase Service Bus property names,
e.g. ``RequiresDuplicateDetection`` and ``DuplicateDetectionHistoryTimeWindow``.
The file may carry ``//`` and ``/* */`` comments, as the emulator's own example
does (it is read as JSON5, a superset of JSON).

Loading is all-or-nothing: the whole file is checked first (its shape, every
name, every property through the same validation as every other way in, and
what already exists in the data directory), and nothing is created unless all
of it is valid; if applying still fails midway, what was already applied is
undone. Every error is one line naming the entity, where it is in the file, and
the field.

A subscription's ``Rules`` (``SqlFilter``, ``CorrelationFilter``, ``Action``)
are checked as the administration API checks them (an invalid SQL text names
the rule and its line and column) and become exactly the subscription's rules;
a subscription without ``Rules`` gets ``$Default`` when it is created, and an
existing one keeps the rules it has. ``ForwardTo`` and
``ForwardDeadLetteredMessagesTo`` must name a queue or topic of the file or
of the data directory; they are set once every entity exists, so the order of
the file does not matter.

Differences from the emulator: properties it lacks (``EnablePartitioning``,
``MaxSizeInMegabytes``, ``MaxMessageSizeInKilobytes``, ``AutoDeleteOnIdle`` …)
are accepted; the history window may be anything Service Bus allows (20 s to 7
days); all namespaces of the file are merged into oncebus's one namespace.
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import json5

from oncebus.broker import Namespace
from oncebus.core.durations import TIMESPAN_MAX_TEXT
from oncebus.core.entities import (
    ENTITY_CLASSES,
    field_name,
    forward_target,
    service_bus_name,
    validate_entity_name,
    validate_subscription_name,
)
from oncebus.core.errors import InvalidArgumentError, OncebusError
from oncebus.core.rules import RuleProperties, rules_from_emulator_config

_IGNORED = {"status"}
_IGNORED_VALUES = (None, "", "Active", TIMESPAN_MAX_TEXT)
_FORWARDING = ("forward_to", "forward_dead_lettered_messages_to")
_CLASSES: dict[str, Any] = dict(ENTITY_CLASSES)
_KEYS = {
    "top": {"UserConfig", "$schema"},
    "UserConfig": {"Namespaces", "Logging"},
    "namespace": {"Name", "Queues", "Topics"},
    "queue": {"Name", "Properties"},
    "topic": {"Name", "Properties", "Subscriptions"},
    "subscription": {"Name", "Properties", "Rules"},
}


@dataclass(frozen=True)
class EntitySpec:
    """One queue, topic or subscription of the file: its Service Bus properties and where it was written."""

    kind: str
    name: str
    properties: dict[str, Any]
    where: str  # e.g. "queue 'orders' (UserConfig.Namespaces[0].Queues[2])"
    topic: str | None = None
    fields: dict[str, str] = field(default_factory=dict)  # property -> its key in the file, for messages
    rules: list[RuleProperties] | None = None  # a subscription's Rules; None: the file gives none

    @property
    def forwarding(self) -> dict[str, Any]:
        return {key: self.properties[key] for key in _FORWARDING if key in self.properties}

    @property
    def without_forwarding(self) -> dict[str, Any]:
        return {key: value for key, value in self.properties.items() if key not in _FORWARDING}


@dataclass
class Topology:
    queues: list[EntitySpec] = field(default_factory=list)
    topics: list[EntitySpec] = field(default_factory=list)
    subscriptions: list[EntitySpec] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    source: str = "topology file"


_snake = field_name  # the schema's names (core.entities)
_pascal = service_bus_name


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"a string {shown!r}"
    if isinstance(value, int | float):
        return f"a number {value!r}"
    if isinstance(value, list):
        return "a list"
    return "an object"


class _Reader:
    """Walks the parsed file, checking its shape; every error names the path in the file."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str | None, message: str) -> InvalidArgumentError:
        return InvalidArgumentError(f"{self.source}: {where}: {message}" if where else f"{self.source}: {message}")

    def obj(self, value: Any, where: str, what: str, keys: set[str] | None) -> dict[str, Any]:
        """``value`` must be an object; with ``keys``, only those keys are allowed in it."""
        if not isinstance(value, dict):
            message = f"{what} must be an object {{...}}, not {_describe(value)}"
            raise self.fail(None if where == what else where, message)
        unknown = sorted(set(value) - keys) if keys is not None else []
        if unknown:
            raise self.fail(where, f"unknown key {unknown[0]!r}; allowed here: {', '.join(sorted(keys or ()))}")
        return value

    def array(self, value: Any, where: str, what: str) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail(where, f"{what} must be a list [...], not {_describe(value)}")
        return value

    def name(self, item: dict[str, Any], where: str, kind: str) -> str:
        if "Name" not in item:
            raise self.fail(where, f'Name is missing: every {kind} needs a "Name"')
        name = item["Name"]
        if not isinstance(name, str):
            raise self.fail(where, f"Name must be a string, not {_describe(name)}")
        return name

    def entity(self, kind: str, item: Any, path: str, topic: str | None = None) -> tuple[EntitySpec, dict[str, Any]]:
        item = self.obj(item, path, f"each {kind}", _KEYS[kind])
        name = self.name(item, path, kind)
        shown = f"{topic}/{name}" if topic is not None else name
        where = f"{kind} {shown!r} ({path})"
        try:
            if kind == "subscription":
                validate_subscription_name(name)
            else:
                validate_entity_name(name, kind=kind)
        except InvalidArgumentError as exc:
            raise self.fail(where, f"Name: {exc}") from None
        raw = item.get("Properties")
        props: dict[str, Any] = {}
        fields: dict[str, str] = {}
        if raw is not None:
            raw = self.obj(raw, where, "Properties", None)
        settable = _CLASSES[kind].settable()
        for key, value in (raw or {}).items():
            label = f"Properties.{key}"
            if isinstance(value, float) and not math.isfinite(value):
                shown = "NaN" if math.isnan(value) else "Infinity"
                raise self.fail(where, f"{label}: {shown} is not allowed here (numbers must be finite)")
            snake = _snake(key)
            if snake in _IGNORED:
                if value not in _IGNORED_VALUES:
                    raise self.fail(where, f"{label} = {value!r} is not supported by oncebus; leave it empty")
                continue
            if snake not in settable:
                allowed = sorted(_pascal(p) for p in settable) + sorted(_pascal(p) for p in _IGNORED)
                raise self.fail(where, f"{label}: unknown {kind} property; allowed: {', '.join(allowed)}")
            if snake in props:
                raise self.fail(where, f"{label}: given twice (also as Properties.{fields[snake]})")
            props[snake] = value
            fields[snake] = key
        return EntitySpec(kind, name, props, where, topic, fields), item


def parse_topology(data: Any, source: str = "topology file") -> Topology:
    """Check the shape of a parsed file and collect its entities (nothing is validated against a namespace yet)."""
    reader = _Reader(source)
    topology = Topology(source=source)
    shape = '{"UserConfig": {"Namespaces": [...]}} (the emulator\'s format)'
    if not isinstance(data, dict):
        raise reader.fail(None, f"the top level must be an object {shape}, not {_describe(data)}")
    top = reader.obj(data, "the top level", "the top level", _KEYS["top"])
    if "UserConfig" not in top:
        raise reader.fail(None, f"UserConfig is missing: expected {shape}")
    user = reader.obj(top["UserConfig"], "UserConfig", "UserConfig", _KEYS["UserConfig"])
    if "Namespaces" not in user:
        raise reader.fail("UserConfig", 'Namespaces is missing: expected {"UserConfig": {"Namespaces": [...]}}')
    for n, namespace in enumerate(reader.array(user["Namespaces"], "UserConfig", "Namespaces")):
        base = f"UserConfig.Namespaces[{n}]"
        namespace = reader.obj(namespace, base, "each namespace", _KEYS["namespace"])
        if "Name" in namespace:
            reader.name(namespace, base, "namespace")
        for i, queue in enumerate(reader.array(namespace.get("Queues"), base, "Queues")):
            topology.queues.append(reader.entity("queue", queue, f"{base}.Queues[{i}]")[0])
        for i, raw_topic in enumerate(reader.array(namespace.get("Topics"), base, "Topics")):
            path = f"{base}.Topics[{i}]"
            topic, item = reader.entity("topic", raw_topic, path)
            topology.topics.append(topic)
            for j, raw_sub in enumerate(reader.array(item.get("Subscriptions"), topic.where, "Subscriptions")):
                sub, sub_item = reader.entity("subscription", raw_sub, f"{path}.Subscriptions[{j}]", topic.name)
                rules = reader.array(sub_item.get("Rules"), sub.where, "Rules")
                if rules:
                    try:
                        parsed = rules_from_emulator_config(rules, where="Rules")
                    except InvalidArgumentError as exc:
                        raise type(exc)(f"{source}: {sub.where}: {exc}") from None
                    sub = EntitySpec(sub.kind, sub.name, sub.properties, sub.where, sub.topic, sub.fields, parsed)
                topology.subscriptions.append(sub)
    return topology


def load_topology(path: str | Path) -> Topology:
    """Read and shape-check a topology file (JSON with comments, as the emulator reads it)."""
    source = f"topology file {path}"
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise InvalidArgumentError(f"{source}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InvalidArgumentError(f"{source} is not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    try:
        data = json5.loads(text, allow_duplicate_keys=False)
    except RecursionError:
        raise InvalidArgumentError(f"{source} is nested too deeply to be a topology file") from None
    except ValueError as exc:
        detail = re.sub(r"^<string>:(\d+)", r"line \1:", str(exc).splitlines()[0] if str(exc) else "")
        raise InvalidArgumentError(f"{source} is not valid JSON (comments are allowed): {detail}") from None
    return parse_topology(data, source)


# ---------------------------------------------------------------------------------- checking and applying
def _check_properties(spec: EntitySpec, existing: Any, source: str) -> None:
    """Each property through the core validation on its own (to name the field), then all of them together."""
    cls = _CLASSES[spec.kind]

    def check(values: dict[str, Any]) -> None:
        if existing is not None:
            existing.updated(**values)
        else:
            cls.create(spec.name, **values)

    for key, value in spec.properties.items():
        try:
            check({key: value})
        except InvalidArgumentError as exc:  # the same kind of error (e.g. ImmutablePropertyError), placed in the file
            raise type(exc)(f"{source}: {spec.where}: Properties.{spec.fields[key]}: {exc}") from None
    try:
        check(spec.properties)
    except InvalidArgumentError as exc:
        raise type(exc)(f"{source}: {spec.where}: {exc}") from None


def _check_forwarding(namespace: Namespace, topology: Topology) -> None:
    """Every forwarding destination is a queue or topic of the file or of the data directory (not itself)."""
    known = {e.name.lower() for e in [*topology.queues, *topology.topics]}
    known |= {q.name.lower() for q in namespace.list_queues()} | {t.name.lower() for t in namespace.list_topics()}
    for spec in [*topology.queues, *topology.subscriptions]:
        for key, target in spec.forwarding.items():
            if not target:
                continue
            name = str(target).rsplit("/", 1)[-1] if "://" in str(target) else str(target).strip("/")
            label = f"Properties.{spec.fields[key]}"
            if name.lower() not in known:
                raise InvalidArgumentError(
                    f"{topology.source}: {spec.where}: {label}: no queue or topic named {name!r} is in the file or "
                    "the data directory; the destination of forwarding must exist"
                )
            if spec.kind == "queue" and name.lower() == spec.name.lower():
                raise InvalidArgumentError(
                    f"{topology.source}: {spec.where}: {label}: a queue cannot forward to itself"
                )


def check_topology(namespace: Namespace, topology: Topology) -> None:
    """Refuse the file unless every entity in it can be created or updated as written; changes nothing."""
    source = topology.source
    _check_forwarding(namespace, topology)
    existing: dict[str, dict[str, Any]] = {
        "queue": {q.name.lower(): q for q in namespace.list_queues()},
        "topic": {t.name.lower(): t for t in namespace.list_topics()},
    }
    seen: dict[str, EntitySpec] = {}
    for spec in [*topology.queues, *topology.topics]:
        key = spec.name.lower()
        if key in seen:
            raise InvalidArgumentError(f"{source}: {spec.where}: the name is already used by {seen[key].where}")
        seen[key] = spec
        other = "topic" if spec.kind == "queue" else "queue"
        if key in existing[other]:
            raise InvalidArgumentError(
                f"{source}: {spec.where}: a {other} named {existing[other][key].name!r} already exists in the "
                f"data directory; a {spec.kind} cannot have the same name"
            )
        _check_properties(spec, existing[spec.kind].get(key), source)
    subscriptions: dict[tuple[str, str], EntitySpec] = {}
    for spec in topology.subscriptions:
        assert spec.topic is not None
        key2 = (spec.topic.lower(), spec.name.lower())
        if key2 in subscriptions:
            other_sub = subscriptions[key2].where
            raise InvalidArgumentError(f"{source}: {spec.where}: the name is already used by {other_sub}")
        subscriptions[key2] = spec
        current = None
        if spec.topic.lower() in existing["topic"]:
            current = next(
                (s for s in namespace.list_subscriptions(spec.topic) if s.name.lower() == spec.name.lower()), None
            )
        _check_properties(spec, current, source)


async def apply_topology(namespace: Namespace, topology: Topology) -> None:
    """Create what is missing and update what exists, all or nothing (properties fixed at creation must match),
    in one store transaction: a crash during the apply leaves the old topology or the whole new one."""
    check_topology(namespace, topology)
    for warning in topology.warnings:
        print(f"oncebus: warning: {warning}", file=sys.stderr)
    async with namespace.one_unit():  # a failure below undoes in memory, and the unit stores the net: nothing
        await _apply_all(namespace, topology)


async def _apply_all(namespace: Namespace, topology: Topology) -> None:
    undo: list[Callable[[], Awaitable[Any]]] = []
    spec: EntitySpec | None = None
    try:
        for spec in topology.queues:
            undo.append(await _apply(namespace, spec))
        for spec in topology.topics:
            undo.append(await _apply(namespace, spec))
        for spec in topology.subscriptions:
            undo.append(await _apply(namespace, spec))
        for spec in [*topology.queues, *topology.subscriptions]:  # every destination exists now
            if (step := await _apply_forwarding(namespace, spec)) is not None:
                undo.append(step)
    except (OncebusError, OSError) as exc:
        failed = []
        for step in reversed(undo):
            try:
                await step()
            except (OncebusError, OSError) as undo_exc:
                failed.append(str(undo_exc))
        where = spec.where if spec is not None else "the file"
        kept = "nothing of the file was kept" if not failed else f"undoing the rest also failed: {failed[0]}"
        raise type(exc)(f"{topology.source}: applying {where} failed: {exc}; {kept}") from exc


async def _apply_forwarding(namespace: Namespace, spec: EntitySpec) -> Callable[[], Awaitable[Any]] | None:
    """Set what the entity forwards to (None when that is already so); returns how to undo it."""
    if spec.kind == "subscription":
        assert spec.topic is not None
        topic = spec.topic
        current: Any = namespace.get_subscription(topic, spec.name)
    else:
        current = namespace.get_queue(spec.name)
    old = {key: getattr(current, key) for key in spec.forwarding}
    if old == {key: forward_target(value, key) for key, value in spec.forwarding.items()}:
        return None
    if spec.kind == "subscription":
        await namespace.update_subscription(topic, spec.name, **spec.forwarding)
        return lambda: namespace.update_subscription(topic, spec.name, **old)
    await namespace.update_queue(spec.name, **spec.forwarding)
    return lambda: namespace.update_queue(spec.name, **old)


async def _apply(namespace: Namespace, spec: EntitySpec) -> Callable[[], Awaitable[Any]]:
    """Create or update one entity (its forwarding comes later); returns how to undo it."""
    props = spec.without_forwarding
    if spec.kind == "subscription":
        assert spec.topic is not None
        topic = spec.topic
        current = {s.name.lower(): s for s in namespace.list_subscriptions(topic)}.get(spec.name.lower())
        if current is None:
            await namespace.create_subscription(topic, spec.name, rules=spec.rules, **props)
            return lambda: namespace.delete_subscription(topic, spec.name)
        old_rules = namespace.list_rules(topic, spec.name)
        await namespace.update_subscription(topic, spec.name, **props)
        if spec.rules is not None and _unstamped(spec.rules) != _unstamped(old_rules):
            await namespace.set_rules(topic, spec.name, spec.rules)
        old = {k: v for k, v in _settable(current).items() if k not in _FORWARDING}

        async def undo() -> None:
            await namespace.update_subscription(topic, spec.name, **old)
            await namespace.set_rules(topic, spec.name, old_rules)

        return undo
    listed = namespace.list_queues() if spec.kind == "queue" else namespace.list_topics()
    current_entity = {e.name.lower(): e for e in listed}.get(spec.name.lower())
    create, update, delete = (getattr(namespace, f"{verb}_{spec.kind}") for verb in ("create", "update", "delete"))
    if current_entity is None:
        await create(spec.name, **props)
        return lambda: delete(spec.name)
    await update(spec.name, **props)
    old_props = {k: v for k, v in _settable(current_entity).items() if k not in _FORWARDING}
    return lambda: update(spec.name, **old_props)


def _unstamped(rules: list[RuleProperties]) -> list[RuleProperties]:
    return [dataclasses.replace(r, created_at_utc=None) for r in rules]


def _settable(props: Any) -> dict[str, Any]:
    return {key: value for key, value in props.to_dict().items() if key in props.settable()}
