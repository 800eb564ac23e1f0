from __future__ import annotations

from datetime import timedelta

import pytest

from oncebus.core import QueueProperties, SubscriptionProperties, TopicProperties, dedup_key, format_duration
from oncebus.core.durations import TIMESPAN_MAX, TIMESPAN_MAX_TEXT, format_timespan, parse_duration
from oncebus.core.entities import entity_of_path, validate_entity_name, validate_subscription_name
from oncebus.core.errors import ArgumentOutOfRangeError, ImmutablePropertyError, InvalidArgumentError
from oncebus.core.keys import require_identifiable


def test_queue_defaults_match_service_bus() -> None:
    q = QueueProperties.create("orders")
    assert q.requires_duplicate_detection is False
    assert q.duplicate_detection_history_time_window == timedelta(minutes=10)
    assert q.lock_duration == timedelta(minutes=1)
    assert q.max_delivery_count == 10
    assert q.default_message_time_to_live == TIMESPAN_MAX
    assert q.max_size_in_megabytes == 1024
    assert q.enable_partitioning is False and q.requires_session is False
    assert q.to_dict()["default_message_time_to_live"] == TIMESPAN_MAX_TEXT


@pytest.mark.parametrize("window", ["PT19S", "PT19.999S", "P7DT1S", "P8D", 19, timedelta(days=8)])
def test_window_out_of_range_uses_azure_text(window: object) -> None:
    with pytest.raises(ArgumentOutOfRangeError, match=r"must be between 00:00:20 and 7\.00:00:00\."):
        QueueProperties.create("q", duplicate_detection_history_time_window=window)


@pytest.mark.parametrize("window", ["PT20S", "P7D", "PT10M", "00:00:20", "7.00:00:00", 20])
def test_window_range_is_inclusive(window: object) -> None:
    TopicProperties.create("t", duplicate_detection_history_time_window=window)


@pytest.mark.parametrize("text", ["10 minutes", "P1Y", "PT", "P", "PT5X", "P1M", "", "-"])
def test_malformed_duration_is_named(text: str) -> None:
    with pytest.raises(InvalidArgumentError, match="not a valid duration"):
        QueueProperties.create("q", duplicate_detection_history_time_window=text)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("PT10M", timedelta(minutes=10)),
        ("P7D", timedelta(days=7)),
        ("PT0.5S", timedelta(seconds=0.5)),
        ("P1DT2H3M4S", timedelta(days=1, hours=2, minutes=3, seconds=4)),
        ("P2W", timedelta(days=14)),
    ],
)
def test_durations_round_trip(text: str, value: timedelta) -> None:
    assert parse_duration(text) == value
    assert parse_duration(format_duration(value)) == value


def test_format_matches_service_bus() -> None:
    assert format_duration(timedelta(minutes=10)) == "PT10M"
    assert format_duration(timedelta(days=7)) == "P7D"
    assert format_duration(timedelta(0)) == "PT0S"
    assert format_timespan(timedelta(days=7)) == "7.00:00:00"
    assert format_timespan(timedelta(seconds=20)) == "00:00:20"


@pytest.mark.parametrize("prop", ["requires_duplicate_detection", "enable_partitioning", "requires_session"])
def test_immutable_properties_cannot_change(prop: str) -> None:
    q = QueueProperties.create("q")
    with pytest.raises(ImmutablePropertyError, match=f"{prop} of queue 'q' cannot be changed"):
        q.updated(**{prop: True})
    assert q.updated(**{prop: False}) == q


def test_window_can_change() -> None:
    q = QueueProperties.create("q", requires_duplicate_detection=True)
    assert q.updated(duplicate_detection_history_time_window="PT20S").duplicate_detection_history_time_window == (
        timedelta(seconds=20)
    )


def test_unknown_property_is_named_with_allowed_list() -> None:
    with pytest.raises(InvalidArgumentError, match=r"unknown queue property colour; allowed: .*lock_duration"):
        QueueProperties.create("q", colour="red")
    with pytest.raises(InvalidArgumentError, match="unknown subscription property requires_duplicate_detection"):
        SubscriptionProperties.create("s", requires_duplicate_detection=True)


@pytest.mark.parametrize(
    ("prop", "value"),
    [
        ("lock_duration", "PT1S"),
        ("lock_duration", "PT6M"),
        ("max_delivery_count", 0),
        ("max_message_size_in_kilobytes", 102_401),
        ("default_message_time_to_live", "PT0S"),
    ],
)
def test_other_ranges(prop: str, value: object) -> None:
    with pytest.raises(ArgumentOutOfRangeError, match=prop):
        QueueProperties.create("q", **{prop: value})


@pytest.mark.parametrize("name", ["", "-a", "a-", "a b", "a//b", "x" * 261, "q/$DeadLetterQueue", "t/Subscriptions/s"])
def test_bad_entity_names(name: str) -> None:
    with pytest.raises(InvalidArgumentError):
        validate_entity_name(name)


def test_good_names() -> None:
    validate_entity_name("orders.v1/eu-west_2")
    validate_subscription_name("audit-1")
    with pytest.raises(InvalidArgumentError):
        validate_subscription_name("a/b")


@pytest.mark.parametrize(
    ("path", "entity"),
    [
        ("a", "a"),
        ("a/b", "a/b"),  # a queue or topic of its own, never a part of a
        ("a/b/c", "a/b/c"),
        ("a/$DeadLetterQueue", "a"),
        ("a/b/$management", "a/b"),
        ("t/Subscriptions/s", "t"),
        ("t/subscriptions/s/$deadletterqueue", "t"),
        ("t/Subscriptions/s/Rules/r", "t"),
        ("/orders/", "orders"),
        ("$Resources/Queues", ""),
        ("", ""),
    ],
)
def test_a_path_belongs_to_the_entity_its_name_spells(path: str, entity: str) -> None:
    assert entity_of_path(path) == entity


def test_key_rules() -> None:
    assert dedup_key("a", "1").text == dedup_key("a", "2").text
    assert dedup_key("a", "1", partitioned=True) != dedup_key("a", "2", partitioned=True)
    assert dedup_key("a", None, "s", partitioned=True) == dedup_key("a", "s", partitioned=True)
    assert dedup_key("a", partitioned=True) == dedup_key("a", "a", partitioned=True)
    # the encoding keeps (pk, id) pairs apart
    assert dedup_key("bc", "a", partitioned=True).text != dedup_key("c", "ab", partitioned=True).text


def test_message_id_over_128_characters() -> None:
    dedup_key("x" * 128)
    with pytest.raises(InvalidArgumentError, match="message_id is 129 characters long; at most 128"):
        dedup_key("x" * 129)


def test_partition_key_must_equal_session_id() -> None:
    with pytest.raises(InvalidArgumentError, match="partition_key 't' differs from session_id 's'"):
        dedup_key("a", "t", "s")


def test_partitioned_dedup_entity_needs_an_id() -> None:
    with pytest.raises(InvalidArgumentError, match="needs a message_id or a partition_key"):
        require_identifiable(None, None, None, partitioned=True, requires_duplicate_detection=True)
    require_identifiable(None, None, None, partitioned=False, requires_duplicate_detection=True)


def test_the_entity_schema_names_every_settable_property_once() -> None:
    from oncebus.core.entities import ENTITY_CLASSES, field_name, property_kinds, service_bus_name

    for kind, cls in ENTITY_CLASSES.items():
        kinds = property_kinds(kind)
        assert set(kinds) == cls.settable()
        for field in kinds:
            assert field_name(service_bus_name(field)) == field
    assert service_bus_name("forward_dead_lettered_messages_to") == "ForwardDeadLetteredMessagesTo"
    assert property_kinds("queue")["duplicate_detection_history_time_window"] == "duration"
    assert property_kinds("subscription")["status"] == "status"


def test_every_property_the_emulator_schema_names_is_in_the_entity_schema() -> None:
    import json
    from pathlib import Path

    from oncebus.core.entities import field_name, property_kinds

    schema = json.loads((Path(__file__).resolve().parents[1] / "data/emulator/Config-schema.json").read_text())
    namespace = schema["properties"]["UserConfig"]["properties"]["Namespaces"]["items"]["properties"]
    topic = namespace["Topics"]["items"]["properties"]
    for kind, spec in (
        ("queue", namespace["Queues"]["items"]["properties"]),
        ("topic", topic),
        ("subscription", topic["Subscriptions"]["items"]["properties"]),
    ):
        for name in spec["Properties"]["properties"]:
            assert field_name(name) in property_kinds(kind), (kind, name)
