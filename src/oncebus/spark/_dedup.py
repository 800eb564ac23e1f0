"""``deduplicate``: the exact duplicate-detection rule on a DataFrame."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any, Literal

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from oncebus.core.entities import DEFAULT_DUPLICATE_WINDOW
from oncebus.core.errors import InvalidArgumentError
from oncebus.spark import _plan
from oncebus.spark._settings import resolve_settings


def deduplicate(
    df: DataFrame,
    window: timedelta | str = DEFAULT_DUPLICATE_WINDOW,
    partitioned: bool = False,
    *,
    message_id_col: str = "message_id",
    partition_key_col: str | None = "partition_key",
    session_id_col: str | None = "session_id",
    time_col: str = "enqueued_time",
    entity_col: str | None = None,
    entity_settings: Mapping[str, Any] | None = None,
    order_col: str | Sequence[str] | None = None,
    on_invalid: _plan.OnInvalid = "drop",
    mode: Literal["exact", "approximate"] = "exact",
) -> DataFrame:
    """Drop the rows Azure Service Bus duplicate detection would drop; keep the input's columns.

    The rule (``docs/semantics.md``; the tests hold the survivors equal
    to ``oncebus.core.DuplicateDetector``'s on the shared scenarios and on
    generated million-row traces): a row at time ``t`` whose key was first
    accepted at ``t0`` is a duplicate when ``t < t0 + window``; duplicates never
    refresh ``t0`` (a fixed window, not a sliding one). Rows are judged per key
    in time order, whatever their order in ``df``.

    Keys: ``message_id``; when the entity is partitioned, (effective partition
    key, ``message_id``) with the effective partition key being
    ``partition_key``, else ``session_id``, else ``message_id``. Each entity
    (``entity_col``) has its own keys, window and partitioning, taken from
    ``entity_settings`` (entity name -> ``EntitySettings``, core
    ``QueueProperties``/``TopicProperties``, or a mapping of Service Bus property
    names); ``window`` and ``partitioned`` apply to entities not listed and when
    there is no entity column. ``window`` is a ``timedelta`` or ISO-8601
    (``PT10M``) from 20 seconds to 7 days.

    Rows whose send would fail are invalid: ``partition_key`` differing from
    ``session_id`` (both set), an id over 128 characters, an empty message_id,
    no id at all on a partitioned entity, or a null time. As in the broker,
    where such a send fails and stores nothing, they are dropped and record no
    key (``on_invalid="drop"``), or the query fails naming the row
    (``on_invalid="raise"``). A row with a null message_id is kept and records
    nothing (the broker would give it a fresh id); so is every row of an entity
    whose ``requires_duplicate_detection`` is false.

    ``partition_key_col`` and ``session_id_col`` left at their default names
    may be missing from ``df`` (then treated as null); pass ``None`` to ignore
    such a column. Keys are compared by a 128-bit digest of (entity, key text),
    as the core's index does.

    Equal times of one key are ordered by ``order_col`` (ascending; e.g. an
    offset or sequence number), else by the row's orderable columns in schema
    order; the result is what the core returns when fed the rows sorted by
    (time, that order). ``time_col`` is a timestamp or integer microseconds
    since the epoch.

    Batch DataFrames only for ``mode="exact"``: for a streaming DataFrame use
    :func:`oncebus.spark.deduplicate_stream` (exact, keeps its state in a
    user-given path), or ``mode="approximate"``, which is Spark's
    ``dropDuplicatesWithinWatermark`` with the window as watermark delay. That
    mode is NOT the rule: it drops repeats for between ``window`` and about
    twice the window after the first copy, drops first copies that arrive
    later than the watermark, keeps whichever copy arrives first rather than
    the earliest, and uses one window for every entity.
    """
    default, per_entity = resolve_settings(window, partitioned, entity_settings)
    columns = _plan.resolve_columns(
        df,
        message_id_col=message_id_col,
        partition_key_col=partition_key_col,
        session_id_col=session_id_col,
        time_col=time_col,
        entity_col=entity_col,
        order_col=order_col,
        entity_settings_given=bool(entity_settings),
    )
    if mode == "approximate":
        return _approximate(df, columns, default, per_entity, on_invalid)
    if mode != "exact":
        raise InvalidArgumentError(f"mode must be 'exact' or 'approximate', not {mode!r}")
    if df.isStreaming:
        raise InvalidArgumentError(
            "deduplicate(mode='exact') needs a batch DataFrame: for a streaming DataFrame use "
            "oncebus.spark.deduplicate_stream (exact, state in a path you give) or mode='approximate'"
        )
    prepared = _plan.prepare(df, columns, default, per_entity, on_invalid)
    return _plan.apply_rule(prepared, columns).select(*columns.user)


def _approximate(
    df: DataFrame, columns: _plan.Columns, default: Any, per_entity: Mapping[str, Any], on_invalid: _plan.OnInvalid
) -> DataFrame:
    if not df.isStreaming:
        raise InvalidArgumentError("mode='approximate' is for streaming DataFrames; batch dedup is exact and cheap")
    windows = {s.window for s in per_entity.values()} | {default.window}
    if len(windows) > 1 or any(s.partitioned != default.partitioned for s in per_entity.values()):
        raise InvalidArgumentError(
            "mode='approximate' uses one window and one partitioning for every entity; use deduplicate_stream"
        )
    if not isinstance(df.schema[columns.time].dataType, T.TimestampType):
        raise InvalidArgumentError("mode='approximate' needs time_col to be a timestamp (Spark watermarks need one)")
    prepared = _plan.prepare(df, columns, default, per_entity, on_invalid)
    delay = f"{int(default.window.total_seconds() * 1_000_000)} microseconds"
    bypass = F.col(_plan.W_US) < 0
    judged = prepared.where(~bypass).withWatermark(columns.time, delay)
    deduped = judged.dropDuplicatesWithinWatermark([_plan.H1, _plan.H2]).select(*columns.user)
    return deduped.unionByName(prepared.where(bypass).select(*columns.user))
