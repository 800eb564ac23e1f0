"""The dedup key and the validity of a row, as Spark column expressions.

These mirror ``oncebus.core.keys`` expression for expression (the tests check
them against ``dedup_key``, ``validate_ids`` and ``require_identifiable`` on
the same inputs):

* invalid (the send would fail, nothing is stored): ``message_id``,
  ``partition_key`` or ``session_id`` longer than 128 UTF-16 code units (as
  Service Bus counts: a character outside the Basic Multilingual Plane counts 2); an empty
  ``message_id``; ``partition_key`` and ``session_id`` both set and different;
  on a partitioned entity with duplicate detection, none of the three set;
* bypass (kept, never recorded, never a duplicate): ``message_id`` null (the
  broker would give it a fresh unique id) or duplicate detection disabled;
* key text: ``DedupKey.text``: ``message_id``, or when partitioned
  ``f"{len(pk)}:{pk}{message_id}"`` with ``pk`` = partition_key, else
  session_id, else message_id.

Keys are compared by a 128-bit digest of (entity, key text), two independent
64-bit xxHash64 values, as the core's index compares 128-bit digests.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

from oncebus.core.keys import MAX_ID_LENGTH

DIGEST_SALT = "oncebus.dedup.v1"


def _too_long(text: Column) -> Column:
    """More than ``MAX_ID_LENGTH`` UTF-16 code units (``oncebus.core.keys.utf16_length``), as Service Bus counts."""
    return F.octet_length(F.encode(text, "UTF-16LE")) > 2 * MAX_ID_LENGTH


def invalid_column(
    message_id: Column, partition_key: Column, session_id: Column, partitioned: Column, enabled: Column
) -> Column:
    too_long = _too_long(message_id) | _too_long(partition_key) | _too_long(session_id)
    differs = _differ(partition_key, session_id)
    unidentifiable = partitioned & enabled & message_id.isNull() & partition_key.isNull() & session_id.isNull()
    return F.coalesce(too_long | (message_id == "") | differs | unidentifiable, F.lit(False))


def _differ(partition_key: Column, session_id: Column) -> Column:
    """Both set and unequal. The same expression on both sides (a frame without either column gets the same null
    literal for both) never differs, and comparing it would make Spark warn of a trivially true predicate."""
    if str(partition_key) == str(session_id):
        return F.lit(False)
    return partition_key.isNotNull() & session_id.isNotNull() & (partition_key != session_id)


def invalid_reason_column(message_id: Column, partition_key: Column, session_id: Column) -> Column:
    """Why a row is invalid (for the error raised with ``on_invalid='raise'``)."""
    return F.concat_ws(
        " ",
        F.lit("oncebus.spark: invalid row (the send would fail):"),
        F.when(
            _differ(partition_key, session_id),
            F.lit("partition_key differs from session_id; when both are set they must be equal;"),
        ),
        F.when(
            F.coalesce(_too_long(message_id) | _too_long(partition_key) | _too_long(session_id), F.lit(False)),
            F.lit(f"an id is longer than {MAX_ID_LENGTH} UTF-16 code units;"),
        ),
        F.when(message_id == "", F.lit("message_id is empty;")),
        F.lit("message_id="),
        F.coalesce(message_id, F.lit("<null>")),
    )


def key_text_column(message_id: Column, partition_key: Column, session_id: Column, partitioned: Column) -> Column:
    effective = F.coalesce(partition_key, session_id, message_id)
    with_partition = F.concat(F.length(effective).cast("string"), F.lit(":"), effective, message_id)
    return F.when(partitioned, with_partition).otherwise(message_id)


def digest_columns(entity: Column, key_text: Column) -> tuple[Column, Column]:
    """Two independent 64-bit hashes of (entity, key text)."""
    entity_text = F.coalesce(entity, F.lit(""))
    material = F.concat(F.length(entity_text).cast("string"), F.lit(":"), entity_text, key_text)
    return F.xxhash64(material), F.xxhash64(F.lit(DIGEST_SALT), material)
