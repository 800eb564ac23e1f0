"""Per-entity duplicate-detection settings for the Spark pipeline.

An entity's settings are the three properties of ``semantics.md`` that decide
a verdict: ``requires_duplicate_detection``, the history window and
``enable_partitioning``. They may be given as :class:`EntitySettings`, as the
core's ``QueueProperties`` / ``TopicProperties``, or as a mapping with the
Service Bus property names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from oncebus.core.durations import to_micros
from oncebus.core.entities import DEFAULT_DUPLICATE_WINDOW, QueueProperties, TopicProperties, validate_duplicate_window
from oncebus.core.errors import InvalidArgumentError

_SHORT_NAMES = {
    "window": "duplicate_detection_history_time_window",
    "partitioned": "enable_partitioning",
    "enabled": "requires_duplicate_detection",
}
_NAMES = ("requires_duplicate_detection", "duplicate_detection_history_time_window", "enable_partitioning")


@dataclass(frozen=True)
class EntitySettings:
    """What decides a verdict for one entity (validated like the core's entity properties)."""

    window: timedelta = DEFAULT_DUPLICATE_WINDOW
    partitioned: bool = False
    requires_duplicate_detection: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "window", validate_duplicate_window(self.window))
        for name in ("partitioned", "requires_duplicate_detection"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidArgumentError(f"{name} must be true or false, not {getattr(self, name)!r}")

    @property
    def window_us(self) -> int:
        return to_micros(self.window)


def entity_settings_of(value: Any, *, name: str = "entity") -> EntitySettings:
    """Settings from EntitySettings, Queue/TopicProperties, a mapping of property names, or a window alone."""
    if isinstance(value, EntitySettings):
        return value
    if isinstance(value, QueueProperties | TopicProperties):
        return EntitySettings(
            window=value.duplicate_detection_history_time_window,
            partitioned=value.enable_partitioning,
            requires_duplicate_detection=value.requires_duplicate_detection,
        )
    if isinstance(value, Mapping):
        values: dict[str, Any] = {str(_SHORT_NAMES.get(k, k)): v for k, v in value.items()}
        unknown = sorted(set(values) - set(_NAMES))
        if unknown:
            raise InvalidArgumentError(
                f"settings of {name}: unknown propert{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; "
                f"allowed: {', '.join(_NAMES)} (or window, partitioned, enabled)"
            )
        return EntitySettings(
            window=values.get("duplicate_detection_history_time_window", DEFAULT_DUPLICATE_WINDOW),
            partitioned=values.get("enable_partitioning", False),
            requires_duplicate_detection=values.get("requires_duplicate_detection", True),
        )
    if isinstance(value, timedelta | str):
        return EntitySettings(window=validate_duplicate_window(value))
    raise InvalidArgumentError(
        f"settings of {name}: {value!r} is not EntitySettings, QueueProperties, TopicProperties, "
        "a mapping of property names or a window"
    )


def resolve_settings(
    window: Any,
    partitioned: bool,
    entity_settings: Mapping[str, Any] | None,
    *,
    requires_duplicate_detection: bool = True,
) -> tuple[EntitySettings, dict[str, EntitySettings]]:
    """(default settings, per-entity settings); the default applies to entities not in the mapping."""
    default = EntitySettings(
        window=window, partitioned=partitioned, requires_duplicate_detection=requires_duplicate_detection
    )
    per_entity: dict[str, EntitySettings] = {}
    for entity, value in (entity_settings or {}).items():
        if not isinstance(entity, str):
            raise InvalidArgumentError(f"entity names in entity_settings must be text, not {entity!r}")
        per_entity[entity] = entity_settings_of(value, name=entity)
    return default, per_entity
