"""The namespace's tier (Standard or Premium) and the quotas Azure Service Bus enforces on it.

Figures from Azure's "Service Bus quotas" page (its tier-limits and common-limits tables):

================================================  ==================  =====================================
quota                                             Standard            Premium
================================================  ==================  =====================================
message size                                      256 KB              the entity's max_message_size_in_kilobytes
                                                                      (default 1,024; at most 102,400)
batch size (one send of several messages)         256 KB              1 MB
message header (system and user properties)       64 KB               64 KB
one application property                          32 KB               32 KB
queue or topic size (max_size_in_megabytes)       5,120 (80 GB if     81,920
                                                  partitioned)
queues and topics per namespace                   10,000              1,000 per messaging unit
partitioned queues and topics per namespace       100                 (namespace-level partitioning)
subscriptions per topic                           2,000               2,000
SQL filters per topic                             2,000               2,000
correlation filters per topic                     100,000             100,000
AMQP connections per namespace                    5,000               5,000
concurrent receive requests per entity            5,000               5,000
message id, session id, partition key             128 UTF-16 units    (``oncebus.core.keys``)
================================================  ==================  =====================================

The counts are fields of :class:`TierQuotas` (the namespace holds one), so a test can prove a count's
mechanism with a small figure while ``TierQuotas.of(tier)`` carries Azure's.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from oncebus.core.errors import (
    ArgumentOutOfRangeError,
    InvalidArgumentError,
    MessageSizeExceededError,
    QuotaExceededError,
)

MESSAGING_UNITS = (1, 2, 4, 8, 16)

STANDARD_MESSAGE_KB = 256
PREMIUM_DEFAULT_MESSAGE_KB = 1024
PREMIUM_MAX_MESSAGE_KB = 102_400
PREMIUM_BATCH_BYTES = 1024 * 1024
MAX_HEADER_BYTES = 64 * 1024
MAX_PROPERTY_BYTES = 32 * 1024
STANDARD_MAX_SIZE_MB = 5 * 1024
PARTITIONED_OR_PREMIUM_MAX_SIZE_MB = 80 * 1024
STANDARD_MAX_ENTITIES = 10_000
PREMIUM_ENTITIES_PER_UNIT = 1_000
STANDARD_MAX_PARTITIONED = 100
MAX_SUBSCRIPTIONS_PER_TOPIC = 2_000
MAX_SQL_FILTERS_PER_TOPIC = 2_000
MAX_CORRELATION_FILTERS_PER_TOPIC = 100_000
MAX_AMQP_CONNECTIONS = 5_000
MAX_CONCURRENT_RECEIVES = 5_000


class Tier(enum.Enum):
    STANDARD = "Standard"
    PREMIUM = "Premium"

    @classmethod
    def parse(cls, text: str) -> Tier:
        for tier in cls:
            if text.strip().lower() == tier.value.lower():
                return tier
        raise InvalidArgumentError(f"tier {text!r} is not a Service Bus tier: use standard or premium")


@dataclass(frozen=True)
class TierQuotas:
    """What Azure allows a namespace of ``tier``; build with :meth:`of` (Azure's figures)."""

    tier: Tier = Tier.STANDARD
    messaging_units: int = 1
    max_entities: int = STANDARD_MAX_ENTITIES
    max_partitioned_entities: int | None = STANDARD_MAX_PARTITIONED  # None: no separate count (Premium)
    max_subscriptions_per_topic: int = MAX_SUBSCRIPTIONS_PER_TOPIC
    max_sql_filters_per_topic: int = MAX_SQL_FILTERS_PER_TOPIC
    max_correlation_filters_per_topic: int = MAX_CORRELATION_FILTERS_PER_TOPIC
    max_concurrent_receives: int = MAX_CONCURRENT_RECEIVES
    max_header_bytes: int = MAX_HEADER_BYTES
    max_property_bytes: int = MAX_PROPERTY_BYTES

    @classmethod
    def of(cls, tier: Tier = Tier.STANDARD, messaging_units: int = 1, **changes: Any) -> TierQuotas:
        """Azure's quotas for ``tier`` (``messaging_units`` only counts on Premium); ``changes`` override fields."""
        if messaging_units not in MESSAGING_UNITS:
            raise InvalidArgumentError(
                f"messaging units {messaging_units!r}: a Premium namespace has 1, 2, 4, 8 or 16 messaging units"
            )
        if tier is Tier.PREMIUM:
            base = cls(tier, messaging_units, PREMIUM_ENTITIES_PER_UNIT * messaging_units, None)
        else:
            base = cls(tier, 1)
        return dataclasses.replace(base, **changes)

    @property
    def premium(self) -> bool:
        return self.tier is Tier.PREMIUM

    # ------------------------------------------------------------------------------ entities
    def defaults(self, kind: str, given: Mapping[str, Any]) -> dict[str, Any]:
        """``given`` with the tier's defaults added (Premium: 1,024 KB messages, as Azure reports)."""
        values = dict(given)
        if self.premium and kind in ("queue", "topic") and values.get("max_message_size_in_kilobytes") is None:
            values["max_message_size_in_kilobytes"] = PREMIUM_DEFAULT_MESSAGE_KB
        return values

    def check_entity(self, props: Any) -> None:
        """Refuse a queue's or topic's properties the tier does not allow, as Azure does (400, SubCode=40000)."""
        kb = props.max_message_size_in_kilobytes
        if not self.premium and kb > STANDARD_MESSAGE_KB:
            raise ArgumentOutOfRangeError(
                f"SubCode=40000. The property 'MaxMessageSizeInKilobytes' ({kb}) can be raised above "
                f"{STANDARD_MESSAGE_KB} only when the namespace is using 'Premium' tier; this namespace is using "
                f"'Standard' tier, where messages are at most {STANDARD_MESSAGE_KB} KB. "
                "Parameter name: MaxMessageSizeInKilobytes"
            )
        if self.premium and kb > PREMIUM_MAX_MESSAGE_KB:
            raise ArgumentOutOfRangeError(
                f"SubCode=40000. The property value for 'MaxMessageSizeInKilobytes' ({kb}) must be between "
                f"{PREMIUM_DEFAULT_MESSAGE_KB} and {PREMIUM_MAX_MESSAGE_KB} when the namespace is using "
                "'Premium' tier. Parameter name: MaxMessageSizeInKilobytes"
            )
        size = props.max_size_in_megabytes
        limit = self.max_size_mb(props.enable_partitioning)
        if size > limit:
            where = (
                "'Premium' tier"
                if self.premium
                else ("a partitioned entity" if props.enable_partitioning else "'Standard' tier without partitioning")
            )
            raise ArgumentOutOfRangeError(
                f"SubCode=40000. The property 'MaxSizeInMegabytes' ({size}) is out of range: on {where} a queue "
                f"or topic holds at most {limit} MB ({limit // 1024} GB)"
                + ("; enable partitioning for up to 80 GB" if limit == STANDARD_MAX_SIZE_MB else "")
                + ". Parameter name: MaxSizeInMegabytes"
            )

    def max_size_mb(self, partitioned: bool) -> int:
        return PARTITIONED_OR_PREMIUM_MAX_SIZE_MB if self.premium or partitioned else STANDARD_MAX_SIZE_MB

    def check_entity_count(self, existing: int, partitioned_existing: int, partitioned: bool) -> None:
        """Before a queue or topic is created: the namespace's count of them, and of partitioned ones."""
        if existing >= self.max_entities:
            per = f" ({PREMIUM_ENTITIES_PER_UNIT} per messaging unit)" if self.premium else ""
            raise QuotaExceededError(
                f"The maximum number of queues and topics in a '{self.tier.value}' tier namespace "
                f"({self.max_entities}{per}) has been reached. QuotaType: EntityCount. "
                "Delete a queue or topic, or use another namespace."
            )
        limit = self.max_partitioned_entities
        if partitioned and limit is not None and partitioned_existing >= limit:
            raise QuotaExceededError(
                f"The maximum number of partitioned queues and topics in a "
                f"'{self.tier.value}' tier namespace ({limit}) has been reached. QuotaType: PartitionedEntityCount. "
                "Create the entity without partitioning, or in another namespace."
            )

    def check_subscription_count(self, topic: str, existing: int) -> None:
        if existing >= self.max_subscriptions_per_topic:
            raise QuotaExceededError(
                f"The maximum number of subscriptions of topic '{topic}' "
                f"({self.max_subscriptions_per_topic}) has been reached. QuotaType: SubscriptionCount."
            )

    def check_filter_counts(
        self, topic: str, sql: int, correlation: int, *, sql_before: int = 0, correlation_before: int = 0
    ) -> None:
        """The topic's filters after a change: SQL (and true/false) filters, and correlation filters, in all.
        Only a change that adds filters is refused (one that removes some, past a lowered count, is not)."""
        if sql > self.max_sql_filters_per_topic and sql > sql_before:
            raise QuotaExceededError(
                f"Topic '{topic}' would have {sql} SQL filters in its subscriptions' rules; "
                f"at most {self.max_sql_filters_per_topic} are allowed per topic. QuotaType: SqlFilterCount."
            )
        if correlation > self.max_correlation_filters_per_topic and correlation > correlation_before:
            raise QuotaExceededError(
                f"Topic '{topic}' would have {correlation} correlation filters in its subscriptions' "
                f"rules; at most {self.max_correlation_filters_per_topic} are allowed per topic. "
                "QuotaType: CorrelationFilterCount."
            )

    # ------------------------------------------------------------------------------ messages
    def message_limit_kb(self, props: Any) -> int:
        """The largest message the entity takes, in KB: its setting, and never above 256 KB on Standard."""
        kb = int(props.max_message_size_in_kilobytes)
        return kb if self.premium else min(kb, STANDARD_MESSAGE_KB)

    def batch_limit_bytes(self, props: Any) -> int:
        """One send of several messages: 256 KB on Standard (the message limit), 1 MB on Premium."""
        if self.premium:
            return PREMIUM_BATCH_BYTES
        return self.message_limit_kb(props) * 1024

    def check_header(self, where: str, header_bytes: int, properties: Mapping[str, Any]) -> None:
        """A message's properties (system and user): each at most 32 KB, all together at most 64 KB."""
        for key, value in properties.items():
            size = _value_bytes(key) + _value_bytes(value)
            if size > self.max_property_bytes:
                raise MessageSizeExceededError(
                    f"{where}: application property {key!r} is {size} bytes; a property may be at most "
                    f"{self.max_property_bytes} bytes (32 KB) and all properties together {self.max_header_bytes} "
                    "bytes (64 KB), as Service Bus allows"
                )
        if header_bytes > self.max_header_bytes:
            raise MessageSizeExceededError(
                f"{where}: its properties (system and application) are {header_bytes} bytes, over the limit of "
                f"{self.max_header_bytes} bytes (64 KB) for a message's header, as Service Bus allows"
            )


def _value_bytes(value: Any) -> int:
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, bytes | bytearray | memoryview):
        return len(value)
    return 8


STANDARD = TierQuotas.of(Tier.STANDARD)
