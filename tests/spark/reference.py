"""The core's verdicts over rows, as the reference the Spark results must equal.

Rows are fed to one ``oncebus.core.DuplicateDetector`` per entity in
(time, tie-break) order, exactly as a broker would judge them if they were sent
in that order; a row whose send would fail (``dedup_key`` or
``require_identifiable`` raises) is dropped, a row with no message_id is kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from oncebus.core import DuplicateDetector
from oncebus.core.errors import InvalidArgumentError
from oncebus.core.keys import require_identifiable, validate_ids
from oncebus.spark._settings import EntitySettings


def core_survivors(
    rows: Iterable[tuple[str | None, str | None, str | None, str | None, int, Any]],
    default: EntitySettings,
    per_entity: Mapping[str, EntitySettings],
) -> list[Any]:
    """Tags of the rows the core keeps; rows are (entity, message_id, partition_key, session_id, t_us, tag)
    already sorted by (t_us, tie-break)."""
    detectors: dict[str | None, DuplicateDetector] = {}
    kept: list[Any] = []
    for entity, message_id, partition_key, session_id, t_us, tag in rows:
        detector = detectors.get(entity)
        if detector is None:
            settings = per_entity.get(entity, default) if entity is not None else default
            detector = detectors[entity] = DuplicateDetector(
                requires_duplicate_detection=settings.requires_duplicate_detection,
                window=settings.window,
                partitioned=settings.partitioned,
                recently_expired_capacity=0,
            )
        try:
            require_identifiable(
                message_id,
                partition_key,
                session_id,
                partitioned=detector.partitioned,
                requires_duplicate_detection=detector.enabled,
            )
            if message_id is None:
                validate_ids(message_id, partition_key, session_id)
                kept.append(tag)
                continue
            key = detector.key_of(message_id, partition_key, session_id)
        except InvalidArgumentError:
            continue
        if not detector.judge(key, t_us).duplicate:
            kept.append(tag)
    return kept
