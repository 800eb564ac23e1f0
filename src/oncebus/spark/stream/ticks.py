"""``oncebus-ticks``: a stream with no rows whose offset advances every second.

``deduplicate_stream`` unions it (with the input's columns) into its query so
micro-batches run while the input is quiet, and held rows are released in
processing time. Unlike Spark's ``rate`` source it supports
``Trigger.AvailableNow`` (a ``rate`` source would turn such a query into a
single ``Once`` batch, ignoring the input's read limits).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
from pyspark.sql.types import LongType, StructField, StructType

TICKS = "oncebus-ticks"
SCHEMA = StructType([StructField("tick", LongType())])


class _TickReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self) -> None:
        self.target: int | None = None

    def initialOffset(self) -> dict[str, Any]:
        return {"second": int(time.time())}

    def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, Any]:
        now = int(time.time())
        if self.target is not None:
            now = min(now, self.target)
        return {"second": max(now, int(start["second"]))}

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = int(time.time())

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return []

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        return iter(())

    def commit(self, end: dict[str, Any]) -> None:
        pass


class TickDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return TICKS

    def schema(self) -> StructType:
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _TickReader()
