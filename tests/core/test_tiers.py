"""The tier's quotas (``oncebus.core.tiers``) at their edges: at the limit accepted, one over refused."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from oncebus.amqp.limits import AmqpLimits
from oncebus.core.dedup import DuplicateDetector
from oncebus.core.entities import QueueProperties, TopicProperties
from oncebus.core.errors import (
    ArgumentOutOfRangeError,
    InvalidArgumentError,
    MessageSizeExceededError,
    QuotaExceededError,
)
from oncebus.core.keys import validate_ids
from oncebus.core.messages import Message
from oncebus.core.sending import validate_send
from oncebus.core.tiers import STANDARD, Tier, TierQuotas

PREMIUM = TierQuotas.of(Tier.PREMIUM)
KB = 1024
MB = 1024 * 1024


def _send(quotas: TierQuotas, props: QueueProperties, *messages: Message) -> int:
    detector = DuplicateDetector(requires_duplicate_detection=False, window=timedelta(minutes=1), partitioned=False)
    return validate_send(props, detector, list(messages), scheduled=False, quotas=quotas).total_bytes


def _queue(quotas: TierQuotas, **values: object) -> QueueProperties:
    props = QueueProperties.create("q", **quotas.defaults("queue", values))
    quotas.check_entity(props)
    return props


def test_the_defaults_are_azures_figures() -> None:
    assert TierQuotas.of() == STANDARD == TierQuotas()
    assert STANDARD.tier is Tier.STANDARD
    assert (STANDARD.max_entities, STANDARD.max_partitioned_entities) == (10_000, 100)
    for quotas in (STANDARD, PREMIUM):
        assert quotas.max_subscriptions_per_topic == 2_000
        assert quotas.max_sql_filters_per_topic == 2_000
        assert quotas.max_correlation_filters_per_topic == 100_000
        assert quotas.max_concurrent_receives == 5_000
        assert (quotas.max_header_bytes, quotas.max_property_bytes) == (64 * KB, 32 * KB)
    assert (PREMIUM.max_entities, PREMIUM.max_partitioned_entities, PREMIUM.messaging_units) == (1_000, None, 1)
    assert TierQuotas.of(Tier.PREMIUM, 4).max_entities == 4_000  # 1,000 per messaging unit
    assert AmqpLimits().max_connections == 5_000  # AMQP connections per namespace, every tier


# ---------------------------------------------------------------------------------- message and batch size
def test_standard_messages_are_256_kb_at_most() -> None:
    props = _queue(STANDARD)
    assert props.max_message_size_in_kilobytes == 256
    assert _send(STANDARD, props, Message(b"x" * 256 * KB)) == 256 * KB
    with pytest.raises(MessageSizeExceededError, match="262145 bytes, over the limit of 262144 bytes"):
        _send(STANDARD, props, Message(b"x" * (256 * KB + 1)))
    # an entity stored with a larger setting (a Premium namespace's, or an older release's) still gets 256 KB
    larger = QueueProperties.create("q", max_message_size_in_kilobytes=1024)
    with pytest.raises(MessageSizeExceededError, match=r"262144 bytes \(256 KB on a namespace of the Standard tier"):
        _send(STANDARD, larger, Message(b"x" * (256 * KB + 1)))


def test_premium_messages_follow_the_entity_1_mb_by_default_100_mb_at_most() -> None:
    props = _queue(PREMIUM)
    assert props.max_message_size_in_kilobytes == 1024
    assert _send(PREMIUM, props, Message(b"x" * MB)) == MB
    with pytest.raises(MessageSizeExceededError, match="1048577 bytes, over the limit of 1048576 bytes"):
        _send(PREMIUM, props, Message(b"x" * (MB + 1)))
    largest = _queue(PREMIUM, max_message_size_in_kilobytes=102_400)
    assert _send(PREMIUM, largest, Message(b"x" * 100 * MB)) == 100 * MB
    with pytest.raises(MessageSizeExceededError, match="over the limit of 104857600 bytes"):
        _send(PREMIUM, largest, Message(b"x" * (100 * MB + 1)))


def test_a_batch_is_256_kb_on_standard_and_1_mb_on_premium() -> None:
    props = _queue(STANDARD)
    half = 128 * KB
    assert _send(STANDARD, props, Message(b"a" * half), Message(b"b" * half)) == 256 * KB
    with pytest.raises(MessageSizeExceededError, match="the batch is 262145 bytes, over the limit of 262144 bytes"):
        _send(STANDARD, props, Message(b"a" * half), Message(b"b" * (half + 1)))
    big = _queue(PREMIUM, max_message_size_in_kilobytes=4096)
    assert _send(PREMIUM, big, Message(b"a" * (MB // 2)), Message(b"b" * (MB // 2))) == MB
    with pytest.raises(MessageSizeExceededError, match="the batch is 1048577 bytes, over the limit of 1048576 bytes"):
        _send(PREMIUM, big, Message(b"a" * (MB // 2)), Message(b"b" * (MB // 2 + 1)))
    assert _send(PREMIUM, big, Message(b"a" * 3 * MB)) == 3 * MB  # one message alone: the entity's limit


def _properties(total: int) -> dict[str, str]:
    """Application properties whose encoding (as counted without a wire form: JSON) is ``total`` bytes."""
    empty = len(json.dumps({"a": "", "b": "", "c": ""}))
    rest = total - empty
    return {"a": "x" * (rest // 3), "b": "y" * (rest // 3), "c": "z" * (rest - 2 * (rest // 3))}


@pytest.mark.parametrize("quotas", [STANDARD, PREMIUM], ids=["standard", "premium"])
def test_the_header_is_64_kb_at_most_and_a_property_32_kb(quotas: TierQuotas) -> None:
    props = _queue(quotas)
    at = Message(b"body", application_properties=_properties(64 * KB))
    assert at.size - len(at.body) == 64 * KB
    _send(quotas, props, at)
    with pytest.raises(MessageSizeExceededError, match=r"properties \(system and application\) are 65537 bytes"):
        _send(quotas, props, Message(b"body", application_properties=_properties(64 * KB + 1)))
    _send(quotas, props, Message(b"", application_properties={"k": "v" * (32 * KB - 1)}))  # key and value: 32 KB
    with pytest.raises(MessageSizeExceededError, match="property 'k' is 32769 bytes"):
        _send(quotas, props, Message(b"", application_properties={"k": "v" * (32 * KB)}))


# ---------------------------------------------------------------------------------- entity properties
def test_max_message_size_setting_is_capped_by_the_tier() -> None:
    assert _queue(STANDARD, max_message_size_in_kilobytes=256).max_message_size_in_kilobytes == 256
    with pytest.raises(ArgumentOutOfRangeError, match=r"'MaxMessageSizeInKilobytes' \(257\).*'Premium' tier"):
        _queue(STANDARD, max_message_size_in_kilobytes=257)
    assert _queue(PREMIUM, max_message_size_in_kilobytes=102_400).max_message_size_in_kilobytes == 102_400
    with pytest.raises(ArgumentOutOfRangeError, match="from 1 to 102400"):
        _queue(PREMIUM, max_message_size_in_kilobytes=102_401)
    with pytest.raises(ArgumentOutOfRangeError, match="must be between 1024 and 102400 when the namespace is using"):
        PREMIUM.check_entity(QueueProperties("q", max_message_size_in_kilobytes=102_401))


def test_entity_size_is_5_gb_on_standard_80_gb_partitioned_or_premium() -> None:
    assert _queue(STANDARD, max_size_in_megabytes=5120).max_size_in_megabytes == 5120
    with pytest.raises(ArgumentOutOfRangeError, match=r"'MaxSizeInMegabytes' \(5121\).*at most 5120 MB"):
        _queue(STANDARD, max_size_in_megabytes=5121)
    with pytest.raises(ArgumentOutOfRangeError, match="at most 5120 MB"):
        STANDARD.check_entity(TopicProperties("t", max_size_in_megabytes=5121))
    assert _queue(STANDARD, max_size_in_megabytes=81_920, enable_partitioning=True).max_size_in_megabytes == 81_920
    assert _queue(PREMIUM, max_size_in_megabytes=81_920).max_size_in_megabytes == 81_920
    for quotas, partitioned in ((STANDARD, True), (PREMIUM, False)):
        with pytest.raises(ArgumentOutOfRangeError, match="at most 81920 MB"):
            quotas.check_entity(QueueProperties("q", max_size_in_megabytes=81_921, enable_partitioning=partitioned))
        with pytest.raises(ArgumentOutOfRangeError, match="from 1 to 81920"):
            _queue(quotas, max_size_in_megabytes=81_921, enable_partitioning=partitioned)


# ---------------------------------------------------------------------------------- counts
def test_entity_counts() -> None:
    STANDARD.check_entity_count(9_999, 0, False)
    with pytest.raises(QuotaExceededError, match=r"queues and topics in a 'Standard' tier namespace \(10000\)"):
        STANDARD.check_entity_count(10_000, 0, False)
    STANDARD.check_entity_count(500, 99, True)
    with pytest.raises(QuotaExceededError, match=r"partitioned queues and topics .* \(100\)"):
        STANDARD.check_entity_count(500, 100, True)
    STANDARD.check_entity_count(500, 100, False)  # the partitioned count bounds partitioned entities only
    PREMIUM.check_entity_count(999, 999, True)
    with pytest.raises(QuotaExceededError, match=r"'Premium' tier namespace \(1000 \(1000 per messaging unit\)\)"):
        PREMIUM.check_entity_count(1_000, 0, False)


def test_subscription_and_filter_counts() -> None:
    STANDARD.check_subscription_count("t", 1_999)
    with pytest.raises(QuotaExceededError, match=r"subscriptions of topic 't' \(2000\)"):
        STANDARD.check_subscription_count("t", 2_000)
    STANDARD.check_filter_counts("t", 2_000, 100_000)
    with pytest.raises(QuotaExceededError, match=r"2001 SQL filters.*at most 2000"):
        STANDARD.check_filter_counts("t", 2_001, 0)
    with pytest.raises(QuotaExceededError, match=r"100001 correlation filters.*at most 100000"):
        STANDARD.check_filter_counts("t", 0, 100_001)
    STANDARD.check_filter_counts("t", 2_001, 0, sql_before=2_002)  # fewer than before: allowed past the count
    with pytest.raises(QuotaExceededError, match="2003 SQL filters"):
        STANDARD.check_filter_counts("t", 2_003, 0, sql_before=2_002)


# ---------------------------------------------------------------------------------- ids
@pytest.mark.parametrize("name", ["message_id", "partition_key", "session_id"])
def test_ids_are_128_utf16_code_units(name: str) -> None:
    def ids(value: str) -> tuple[object, object, object]:
        return (
            value if name == "message_id" else "m",
            value if name == "partition_key" else None,
            value if name == "session_id" else None,
        )

    validate_ids(*ids("\U0001f600" * 64))  # 64 emoji: 128 code units
    validate_ids(*ids("a" * 128))
    with pytest.raises(InvalidArgumentError, match=f"{name} is 130 UTF-16 code units long; at most 128"):
        validate_ids(*ids("\U0001f600" * 65))  # 65 characters, 130 code units
    with pytest.raises(InvalidArgumentError, match=f"{name} is 129 UTF-16 code units long"):
        validate_ids(*ids("a" + "\U0001f600" * 64))
