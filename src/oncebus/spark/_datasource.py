"""The ``oncebus`` Spark data source: stream from a queue or subscription, write to a queue or topic.

Both sides talk to the broker only through the azure-servicebus SDK, so the
same options work against oncebus and against Azure Service Bus::

    register(spark)  # once per session
    df = (spark.readStream.format("oncebus")
          .option("connectionString", conn).option("queue", "orders").load())
    (df.writeStream.format("oncebus").option("connectionString", conn)
       .option("topic", "events").option("checkpointLocation", ckpt).start())

Guarantees
- Sink: every message gets a deterministic ``message_id`` (the column named by
  ``messageIdColumn``, default ``message_id`` when present; otherwise a digest
  of the query id, the micro-batch id, the partition, the row's content and its
  occurrence among identical rows of that partition). A micro-batch that Spark
  replays after a failure produces the same ids, and the entity's duplicate
  detection drops them: exactly-once into the broker, provided the entity has
  duplicate detection with a window longer than the time to recover, and the
  plan feeding the sink puts the same rows in the same partitions on replay
  (true for deterministic plans; name an id column to be independent of it).
- Source: messages are received in PEEK_LOCK by the driver-side reader, kept
  locked (their locks renewed) while Spark processes the micro-batch, and
  completed only in ``commit``, which Spark calls once the batch is durably
  committed (when it constructs the next batch; on a quiet queue the reader
  asks for one empty batch so that this happens at the next trigger). If the
  query dies, the locks lapse and the broker redelivers: nothing is lost
  (at-least-once; exactly-once when followed by ``oncebus.spark.deduplicate``).
  The messages of a batch still running (or not yet committed) when the query
  stops are delivered again to the next run.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from oncebus.spark._options import OncebusOptionError, _Options

ORDERED_BY = "oncebus.orderedBy"  # also read by deduplicate_stream

SOURCE_SCHEMA = StructType(
    [
        StructField("message_id", StringType()),
        StructField("body", BinaryType()),
        StructField("partition_key", StringType()),
        StructField("session_id", StringType()),
        # the broker assigns enqueued times in sequence order per entity, and the reader receives in that
        # order: deduplicate_stream needs to hold nothing back (see ORDERED_BY)
        StructField("enqueued_time", TimestampType(), metadata={ORDERED_BY: "sequence_number"}),
        StructField("sequence_number", LongType()),
        StructField("delivery_count", IntegerType()),
        StructField("subject", StringType()),
        StructField("content_type", StringType()),
        StructField("correlation_id", StringType()),
        StructField("application_properties", MapType(StringType(), StringType())),
    ]
)


SESSION_SOURCE_SCHEMA = StructType(
    [StructField(f.name, f.dataType, f.nullable) if f.metadata else f for f in SOURCE_SCHEMA.fields]
)

_MESSAGE_COLUMNS = ("message_id", "partition_key", "session_id", "subject", "content_type", "correlation_id")


# ---------------------------------------------------------------------------------- writing
@dataclass
class _SentCount(WriterCommitMessage):
    messages: int


def _message_id(prefix: str, batch: str, partition: int, content: str, occurrence: int) -> str:
    digest = hashlib.sha256(f"{prefix}\x1f{batch}\x1f{partition}\x1f{content}\x1f{occurrence}".encode())
    return digest.hexdigest()[:40]


def _row_content(row: Any) -> str:
    return json.dumps(row.asDict(recursive=True), sort_keys=True, default=_json_default, separators=(",", ":"))


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return value.hex()
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    return str(value)


class _Sender:
    """Sends one partition's rows with deterministic message ids."""

    def __init__(self, options: _Options, schema: StructType) -> None:
        self.options = options
        self.fields = schema.fieldNames()

    def send(self, rows: Iterator[Any], batch: str) -> int:
        from azure.servicebus import ServiceBusClient, ServiceBusMessage
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        prefix = self.options.message_id_prefix
        if prefix is None:
            query = context.getLocalProperty("sql.streaming.queryId") if context is not None else None
            prefix = query or self.options.entity
        id_column = self.options.message_id_column or ("message_id" if "message_id" in self.fields else None)
        if id_column is not None and id_column not in self.fields:
            raise OncebusOptionError(f"messageIdColumn {id_column!r} is not a column; columns: {self.fields}")
        seen: dict[str, int] = {}
        sent = 0
        with ServiceBusClient.from_connection_string(self.options.connection_string) as client:
            if self.options.kind == "queue":
                sender_context = client.get_queue_sender(self.options.entity)
            else:
                sender_context = client.get_topic_sender(self.options.entity)
            with sender_context as sender:
                pending: list[Any] = []
                for row in rows:
                    values = row.asDict(recursive=True)
                    content = _row_content(row)
                    if id_column is not None and values.get(id_column) is not None:
                        message_id = str(values[id_column])
                    else:
                        occurrence = seen.get(content, 0)
                        seen[content] = occurrence + 1
                        message_id = _message_id(prefix, batch, partition, content, occurrence)
                    body = values.get("body")
                    if body is None and "body" not in self.fields:
                        body = content
                    kwargs = {name: values.get(name) for name in _MESSAGE_COLUMNS[1:] if values.get(name) is not None}
                    properties = values.get("application_properties")
                    pending.append(
                        ServiceBusMessage(
                            bytes(body) if isinstance(body, bytes | bytearray) else str(body or ""),
                            message_id=message_id,
                            application_properties=dict(properties) if properties else None,
                            **kwargs,
                        )
                    )
                    if len(pending) >= self.options.send_batch_size:
                        sent += _flush(sender, pending)
                sent += _flush(sender, pending)
        return sent


def _flush(sender: Any, pending: list[Any]) -> int:
    """Send in as few batch transfers as fit; each message keeps its id."""
    count = 0
    while pending:
        batch = sender.create_message_batch()
        taken = 0
        for message in pending:
            try:
                batch.add_message(message)
            except ValueError:
                break
            taken += 1
        if taken == 0:  # one message alone over the batch limit: send it on its own to get the broker's error
            sender.send_messages(pending[0])
            taken = 1
        else:
            sender.send_messages(batch)
        count += taken
        del pending[:taken]
    return count


class OncebusWriter(DataSourceWriter):
    def __init__(self, options: _Options, schema: StructType) -> None:
        self.sender = _Sender(options, schema)

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return _SentCount(self.sender.send(iterator, "batch"))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        pass  # every send was acknowledged by the broker before write() returned

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        pass  # a retry sends the same ids again; the broker drops what it already has


class OncebusStreamWriter(DataSourceStreamWriter):
    def __init__(self, options: _Options, schema: StructType) -> None:
        self.sender = _Sender(options, schema)

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        batch = context.getLocalProperty("streaming.sql.batchId") if context is not None else None
        return _SentCount(self.sender.send(iterator, f"b{batch}"))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass


class OncebusDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "oncebus"

    def schema(self) -> StructType:
        if any(k.lower() == "sessions" for k in self.options):
            return SESSION_SOURCE_SCHEMA  # sessions are read side by side: no order across them
        return SOURCE_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from oncebus.spark._source import OncebusStreamReader

        return OncebusStreamReader(_Options.parse(dict(self.options), reading=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return OncebusWriter(_Options.parse(dict(self.options), reading=False), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return OncebusStreamWriter(_Options.parse(dict(self.options), reading=False), schema)


def register(spark: Any) -> None:
    """Register the ``oncebus`` format with a SparkSession."""
    spark.dataSource.register(OncebusDataSource)
