"""The system properties are declared once (oncebus.core.properties); every model and door agrees with it."""

from __future__ import annotations

import dataclasses

from oncebus.core.messages import Message, ReceivedMessage, StoredMessage
from oncebus.core.properties import (
    BROKER_PROPERTIES,
    CORRELATION_FIELDS,
    SENDER_PROPERTIES,
    WIRE_PROPERTY_FIELDS,
    correlation_field,
)
from oncebus.core.rules import CorrelationRuleFilter
from oncebus.core.rules._view import SYSTEM_PROPERTIES


def _fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_every_sender_property_is_a_field_of_the_sent_and_received_message() -> None:
    sent, received = _fields(Message), _fields(ReceivedMessage)
    for prop in SENDER_PROPERTIES:
        assert prop.field in sent, prop
        assert prop.field in received, prop


def test_the_stored_message_keeps_every_sender_property() -> None:
    stored = _fields(StoredMessage)
    for prop in SENDER_PROPERTIES:
        field = prop.field or ""
        assert field in stored or field.replace("_utc", "") + "_us" in stored or field + "_us" in stored, prop


def test_every_broker_property_a_receiver_reads_is_a_received_field() -> None:
    received = _fields(ReceivedMessage)
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
