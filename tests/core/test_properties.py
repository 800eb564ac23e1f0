"""The system properties are declared once (oncebus.core.properties); every model and door agrees with it."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from oncebus.core.messages import Message, MessageState, StoredMessage
from oncebus.core.properties import (
    BROKER_PROPERTIES,
    CORRELATION_FIELDS,
    SENDER_PROPERTIES,
    WIRE_PROPERTY_FIELDS,
    correlation_field,
)
from oncebus.core.received import ReceivedMessage
from oncebus.core.rules import CorrelationRuleFilter
from oncebus.core.rules._view import SYSTEM_PROPERTIES
from tests.messages import DeliveryEnvelope


def _fields(cls: type) -> set[str]:  # a dataclass's fields
    return {f.name for f in dataclasses.fields(cls)}


def test_every_sender_property_is_a_field_of_the_sent_and_received_message() -> None:
    sent, received = _fields(Message), set(ReceivedMessage.FIELDS)
    for prop in SENDER_PROPERTIES:
        assert prop.field in sent, prop
        assert prop.field in received, prop


def test_the_stored_message_keeps_every_sender_property() -> None:
    stored = _fields(StoredMessage)
    for prop in SENDER_PROPERTIES:
        field = prop.field or ""
        assert field in stored or field.replace("_utc", "") + "_us" in stored or field + "_us" in stored, prop


def test_every_broker_property_a_receiver_reads_is_a_received_field() -> None:
    received = set(ReceivedMessage.FIELDS)
    for prop in BROKER_PROPERTIES:
        assert prop.field is None or prop.field in received, prop


def test_the_correlation_filter_has_exactly_the_declared_fields() -> None:
    filter_fields = _fields(CorrelationRuleFilter) - {"properties", "_system", "_user"}
    assert set(CORRELATION_FIELDS) == filter_fields


def test_names_a_user_may_write_for_a_correlation_field() -> None:
    assert correlation_field("ReplyToSessionId") == "reply_to_session_id"
    assert correlation_field("reply_to_session_id") == "reply_to_session_id"
    assert correlation_field("Subject") == correlation_field("Label") == "label"
    assert correlation_field("color") is None


def test_rules_know_every_declared_name_and_no_other() -> None:
    declared = {p.name.lower() for p in (*SENDER_PROPERTIES, *BROKER_PROPERTIES)} | {"label"}
    assert set(SYSTEM_PROPERTIES) == declared


def test_the_wire_positions_are_the_amqp_properties_section() -> None:
    # AMQP 1.0 3.2.4: message-id 0, user-id 1, to 2, subject 3, reply-to 4, correlation-id 5, content-type 6,
    # content-encoding 7, absolute-expiry-time 8, creation-time 9, group-id 10, group-sequence 11, reply-to-group-id 12
    assert WIRE_PROPERTY_FIELDS == {
        0: "message_id",
        2: "to",
        3: "subject",
        4: "reply_to",
        5: "correlation_id",
        6: "content_type",
        10: "session_id",
        12: "reply_to_session_id",
    }


def test_a_received_message_is_a_view_with_the_envelope_of_its_delivery() -> None:
    stored = StoredMessage("q", 7, "m", b"x", 1_000_000, None, application_properties={"k": 1})
    token = uuid.uuid4()
    envelope = DeliveryEnvelope(MessageState.ACTIVE, 3, 2_000_000, None, token, 3_000_000)
    received = ReceivedMessage.of(stored, envelope)
    assert (received.delivery_count, received.enqueued_time_us) == (3, 2_000_000)
    assert (received.lock_token, received.locked_until_us) == (token, 3_000_000)
    assert ReceivedMessage.of(stored).lock_token is None  # as stored: not locked
    assert stored.delivery_count == 0  # the stored record is not written to
    assert received.body is stored.body
    assert dict(received.application_properties) == {"k": 1}
    with pytest.raises(TypeError):
        received.application_properties["k"] = 2  # type: ignore[index]
    for name in ReceivedMessage.FIELDS:
        getattr(received, name)
    assert set(received.to_dict()) == set(ReceivedMessage.FIELDS) - {"wire"}


def test_the_record_of_a_send_holds_each_field_in_its_own_place() -> None:
    # stored_message passes the record's fields by position: each text field gets a value of its own here, so a
    # field passed in another's place shows
    from datetime import UTC, datetime, timedelta

    from oncebus.core.entities import QueueProperties
    from oncebus.core.sending import stored_message
    from oncebus.core.timeutil import datetime_to_us

    texts = ["session_id", "partition_key", "correlation_id", "subject", "content_type", "reply_to"]
    texts += ["reply_to_session_id", "to"]
    message = Message(b"body", message_id="id", application_properties={"k": 1}, time_to_live=timedelta(seconds=5))
    for name in texts:
        setattr(message, name, f"{name}-value")
    message.partition_key = message.session_id  # (the partition key of a session's message is its session id)
    now = 1_700_000_000_000_000
    record = stored_message(QueueProperties(name="Orders"), message, "id", 7, now, None)
    expected = StoredMessage(
        path="orders",
        sequence_number=7,
        message_id="id",
        body=b"body",
        enqueued_time_us=now,
        expires_at_us=now + 5_000_000,
        **{name: getattr(message, name) for name in texts},
        application_properties={"k": 1},
        time_to_live_us=5_000_000,
    )
    assert record == expected and dataclasses.asdict(record) == dataclasses.asdict(expected)
    assert record.application_properties is not message.application_properties  # the record's own copy
    later = datetime(2030, 1, 1, tzinfo=UTC)
    message.scheduled_enqueue_time_utc = later
    scheduled = stored_message(QueueProperties(name="Orders"), message, "id", 8, now, None)
    at = datetime_to_us(later)
    assert (scheduled.state, scheduled.enqueued_time_us, scheduled.scheduled_enqueue_time_us) == (
        MessageState.SCHEDULED,
        at,
        at,
    )
    assert (scheduled.expires_at_us, scheduled.delivery_count, scheduled.rewritten, scheduled.hops) == (
        at + 5_000_000,
        0,
        frozenset(),
        0,
    )
