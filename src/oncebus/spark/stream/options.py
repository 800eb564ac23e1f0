"""The options of ``deduplicate_stream`` and ``flush_stream``, in one object."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pyspark.sql import DataFrame

from oncebus.core.entities import DEFAULT_DUPLICATE_WINDOW
from oncebus.spark._plan import OnInvalid

DEFAULT_MAX_OUT_OF_ORDER = timedelta(seconds=5)
ForeachBatch = Callable[[DataFrame, int], None]


@dataclass(frozen=True)
class StreamOptions:
    """What ``deduplicate_stream`` is asked to do (its keyword arguments; see its docstring)."""

    state_path: str
    window: timedelta | str = DEFAULT_DUPLICATE_WINDOW
    partitioned: bool = False
    output_path: str | None = None
    foreach_batch: ForeachBatch | None = None
    max_out_of_order: timedelta | str | None = None  # None: 5 s, or 0 when the source vouches for order
    idle_release: bool = True
    message_id_col: str = "message_id"
    partition_key_col: str | None = "partition_key"
    session_id_col: str | None = "session_id"
    time_col: str = "enqueued_time"
    entity_col: str | None = None
    entity_settings: Mapping[str, Any] | None = None
    order_col: str | Sequence[str] | None = None
    on_invalid: OnInvalid = "drop"
