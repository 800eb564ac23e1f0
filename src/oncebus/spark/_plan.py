"""Building blocks shared by batch and streaming dedup: derived columns and the rule's plan."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from oncebus.core.errors import InvalidArgumentError
from oncebus.spark import _chain
from oncebus.spark._keys import digest_columns, invalid_column, invalid_reason_column, key_text_column
from oncebus.spark._settings import EntitySettings

PREFIX = "__oncebus_"
H1, H2, T_US, W_US, KIND, ROLE = _chain.H1, _chain.H2, _chain.T, _chain.W, _chain.KIND, _chain.ROLE
PARTITIONED = PREFIX + "partitioned"
ENABLED = PREFIX + "enabled"
INVALID = PREFIX + "invalid"
DERIVED = (H1, H2, T_US, W_US)

OnInvalid = Literal["drop", "raise"]
_DEFAULT_NAMES = {"partition_key": "partition_key_col", "session_id": "session_id_col"}


@dataclass(frozen=True)
class Columns:
    """Which input columns hold what; ``None`` means the rows have no such column."""

    message_id: str
    partition_key: str | None
    session_id: str | None
    time: str
    entity: str | None
    order: tuple[str, ...]
    user: tuple[str, ...]


def resolve_columns(
    df: DataFrame,
    *,
    message_id_col: str,
    partition_key_col: str | None,
    session_id_col: str | None,
    time_col: str,
    entity_col: str | None,
    order_col: str | Sequence[str] | None,
    entity_settings_given: bool = False,
) -> Columns:
    if entity_settings_given and entity_col is None:
        raise InvalidArgumentError("entity_settings needs entity_col: the column naming each row's entity")
    schema = {f.name: f.dataType for f in df.schema.fields}
    user = tuple(schema)
    if any(name.startswith(PREFIX) for name in user):
        raise InvalidArgumentError(f"input columns may not start with {PREFIX!r} (reserved by oncebus.spark)")

    def need(name: str | None, what: str, types: tuple[type[T.DataType], ...]) -> str | None:
        if name is None:
            return None
        if name not in schema:
            if name in _DEFAULT_NAMES:  # the default name is optional; a name given explicitly is not
                return None
            raise InvalidArgumentError(f"{what} {name!r} is not a column of the DataFrame; columns: {', '.join(user)}")
        if not isinstance(schema[name], types):
            allowed = " or ".join(t.__name__ for t in types)
            raise InvalidArgumentError(f"{what} {name!r} is {schema[name].simpleString()}; it must be {allowed}")
        return name

    text = (T.StringType,)
    message_id = need(message_id_col, "message_id_col", text)
    time = need(time_col, "time_col", (T.TimestampType, T.LongType))
    assert message_id is not None and time is not None
    order: tuple[str, ...]
    if isinstance(order_col, str):
        order = (order_col,)
    elif order_col is not None:
        order = tuple(order_col)
    else:
        order = tuple(name for name in user if _orderable(schema[name]))
    for name in order:
        if name not in schema:
            raise InvalidArgumentError(f"order_col {name!r} is not a column of the DataFrame")
        if not _orderable(schema[name]):
            raise InvalidArgumentError(f"order_col {name!r} is {schema[name].simpleString()}, which cannot be sorted")
    return Columns(
        message_id=message_id,
        partition_key=need(partition_key_col, "partition_key_col", text),
        session_id=need(session_id_col, "session_id_col", text),
        time=time,
        entity=need(entity_col, "entity_col", text),
        order=order,
        user=user,
    )


def _orderable(dtype: T.DataType) -> bool:
    if isinstance(dtype, T.MapType | T.VariantType):
        return False
    if isinstance(dtype, T.ArrayType):
        return _orderable(dtype.elementType)
    if isinstance(dtype, T.StructType):
        return all(_orderable(f.dataType) for f in dtype.fields)
    return True


def _col(name: str | None, dtype: str = "string") -> Column:
    return F.col(name) if name is not None else F.lit(None).cast(dtype)


def _settings_columns(
    columns: Columns, default: EntitySettings, per_entity: Mapping[str, EntitySettings]
) -> tuple[Column, Column, Column]:
    """(window us, partitioned, enabled) of each row's entity."""

    def triple(s: EntitySettings) -> Column:
        return F.struct(
            F.lit(s.window_us).cast("long").alias("w"),
            F.lit(s.partitioned).alias("p"),
            F.lit(s.requires_duplicate_detection).alias("e"),
        )

    chosen = triple(default)
    if columns.entity is not None and per_entity:
        mapping = F.create_map(*[part for name, s in per_entity.items() for part in (F.lit(name), triple(s))])
        chosen = F.coalesce(F.try_element_at(mapping, F.col(columns.entity)), chosen)
    return chosen["w"], chosen["p"], chosen["e"]


def prepare(
    df: DataFrame,
    columns: Columns,
    default: EntitySettings,
    per_entity: Mapping[str, EntitySettings],
    on_invalid: OnInvalid,
) -> DataFrame:
    """The input's columns plus H1, H2, T_US, W_US; invalid rows dropped (or an error raised).

    W_US is the entity's window in microseconds, or -1 for a row that bypasses the rule (kept, recorded
    nowhere): no message_id (the broker would give it a fresh one) or duplicate detection disabled.
    """
    timestamp = isinstance(df.schema[columns.time].dataType, T.TimestampType)
    return prepare_plan(columns, default, per_entity, on_invalid, timestamp).apply(df)


@dataclass(frozen=True)
class PreparePlan:
    """The expressions of ``prepare``, built once (each costs a call into the JVM in a classic session)
    and applied to every micro-batch."""

    first: tuple[Column, ...]
    valid: Column
    second: tuple[Column, ...]

    def apply(self, df: DataFrame) -> DataFrame:
        return df.select(*self.first).where(self.valid).select(*self.second)


def prepare_plan(
    columns: Columns,
    default: EntitySettings,
    per_entity: Mapping[str, EntitySettings],
    on_invalid: OnInvalid,
    timestamp: bool,
) -> PreparePlan:
    """``prepare``'s expressions for input whose time column is a timestamp (else long microseconds)."""
    if on_invalid not in ("drop", "raise"):
        raise InvalidArgumentError(f"on_invalid must be 'drop' or 'raise', not {on_invalid!r}")
    message_id = F.col(columns.message_id)
    partition_key = _col(columns.partition_key)
    session_id = _col(columns.session_id)
    window, partitioned, enabled = _settings_columns(columns, default, per_entity)
    time = F.col(columns.time)
    t_us = F.unix_micros(time) if timestamp else time
    first = (
        *[F.col(name) for name in columns.user],
        window.alias(W_US),
        partitioned.alias(PARTITIONED),
        enabled.alias(ENABLED),
        t_us.cast("long").alias(T_US),
    )
    invalid = (
        invalid_column(message_id, partition_key, session_id, F.col(PARTITIONED), F.col(ENABLED)) | F.col(T_US).isNull()
    )
    if on_invalid == "raise":
        reason = F.when(F.col(T_US).isNull(), F.lit(f"oncebus.spark: invalid row: {columns.time} is null")).otherwise(
            invalid_reason_column(message_id, partition_key, session_id)
        )
        valid = F.when(invalid, F.raise_error(reason)).otherwise(F.lit(True))
    else:
        valid = ~invalid
    key_text = key_text_column(message_id, partition_key, session_id, F.col(PARTITIONED))
    h1, h2 = digest_columns(_col(columns.entity), key_text)
    second = (
        *[F.col(name) for name in columns.user],
        h1.alias(H1),
        h2.alias(H2),
        F.col(T_US),
        F.when(message_id.isNull() | ~F.col(ENABLED), F.lit(-1).cast("long")).otherwise(F.col(W_US)).alias(W_US),
    )
    return PreparePlan(first, valid, second)


def _ordered_sends(prepared: DataFrame, columns: Columns, seeds: DataFrame | None, partitions: int | None) -> DataFrame:
    """The sends (and seed rows carrying prior t0s), spread by key digest and sorted for the chain walk."""
    sends = prepared.select(
        *[F.col(name) for name in columns.user], F.col(H1), F.col(H2), F.col(T_US), F.col(W_US), F.lit(1).alias(KIND)
    )
    if seeds is not None:
        user_types = {f.name: f.dataType for f in prepared.schema.fields}
        sends = sends.unionByName(
            seeds.select(
                *[F.lit(None).cast(user_types[name]).alias(name) for name in columns.user],
                F.col(H1),
                F.col(H2),
                F.col(T_US),
                F.lit(0).cast("long").alias(W_US),
                F.lit(0).alias(KIND),
            )
        )
    if partitions == 1:  # a small pool: one task, no shuffle
        spread = sends.coalesce(1)
    else:
        spread = sends.repartition(partitions, H1) if partitions else sends.repartition(H1)
    return spread.sortWithinPartitions(H1, H2, KIND, T_US, *columns.order)


def apply_rule(
    prepared: DataFrame, columns: Columns, seeds: DataFrame | None = None, partitions: int | None = None
) -> DataFrame:
    """Rows of ``prepared`` the rule keeps, with H1, H2, T_US, W_US (-1: bypassed, records no key);
    ``seeds`` (H1, H2, T_US) gives prior first-accepted times."""
    ordered = _ordered_sends(prepared, columns, seeds, partitions)
    kept = ordered.mapInArrow(_chain.apply_rule, ordered.schema)
    return kept.select(*[F.col(name) for name in columns.user], F.col(H1), F.col(H2), F.col(T_US), F.col(W_US))


def decide(
    pool: DataFrame, columns: Columns, seeds: DataFrame | None, watermark: int, partitions: int | None = None
) -> DataFrame:
    """One streaming micro-batch in one pass: ``pool``'s rows below ``watermark`` judged (seeded by
    ``seeds``), the rest passed through. Columns: the user's, H1, H2, T_US, W_US and ROLE
    (``_chain.ROLE_KEY`` kept and recorded, ``ROLE_BYPASS`` kept, ``ROLE_HELD`` not decided yet)."""
    ordered = _ordered_sends(pool, columns, seeds, partitions)
    schema = T.StructType(
        [f for f in ordered.schema.fields if f.name != KIND] + [T.StructField(ROLE, T.ByteType(), False)]
    )
    return ordered.mapInArrow(_chain.decider(watermark), schema)
