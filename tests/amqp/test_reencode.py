"""A rule action's changes reach the AMQP encoding of the copy; the rest of the sender's encoding is kept."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path

import proton

from oncebus.amqp.codec import decode_message, split_sections
from oncebus.amqp.outgoing import encode_received
from oncebus.amqp.reencode import reencode
from oncebus.broker import ManualClock, Namespace
from oncebus.core.messages import StoredMessage
from oncebus.core.rules import MessageView, RuleProperties, RuleSet, SqlRuleAction, SqlRuleFilter
from oncebus.store.sqlite import SqliteStore
from tests.broker.conftest import run


def _sent() -> bytes:
    message = proton.Message(
        body={"key": [1, "two"]},  # an AMQP value body: must come back as it was
        id="m-1",
        subject="order",
        correlation_id="c",
        content_type="application/json",
        properties={
            "n": proton.int32(3),
            "keep": proton.short(7),
            "gone": "x",
            "when": proton.timestamp(1_700_000_000_000),
        },
    )
    message.ttl = 60.0
    message.annotations = {proton.symbol("x-opt-partition-key"): "pk"}
    return bytes(message.encode())


def _stored(wire: bytes) -> StoredMessage:
    decoded = decode_message(wire)
    return StoredMessage(
        path="t/subscriptions/s",
        sequence_number=1,
        message_id=decoded.message_id or "",
        body=decoded.body,
        enqueued_time_us=0,
        expires_at_us=None,
        subject=decoded.subject,
        correlation_id=decoded.correlation_id,
        content_type=decoded.content_type,
        partition_key=decoded.partition_key,
        application_properties=dict(decoded.application_properties),
        time_to_live_us=60_000_000,
        wire=wire,
    )


def _apply(stored: StoredMessage, action: str, **parameters: object) -> tuple[StoredMessage, set[str]]:
    rules = RuleSet([RuleProperties("r", SqlRuleFilter("1=1"), SqlRuleAction(action, parameters))])
    (delivery,) = rules.evaluate(MessageView.of(stored)).deliveries
    return delivery.apply_to(stored), set(delivery.system_properties)


def test_an_action_rewrites_properties_and_keeps_the_body_and_untouched_types() -> None:
    wire = _sent()
    copy, changed = _apply(
        _stored(wire), "SET n = n * 10; REMOVE gone; SET added = 'new'; SET sys.Label = 'hot'; SET sys.To = 'pager'"
    )
    assert changed == {"subject", "to"}
    out = reencode(wire, copy, changed)
    got = proton.Message()
    got.decode(out)
    assert got.body == {"key": [1, "two"]}
    assert (got.id, got.subject, got.address, got.correlation_id) == ("m-1", "hot", "pager", "c")
    assert str(got.content_type) == "application/json"
    assert got.ttl == 60.0 and got.annotations == {proton.symbol("x-opt-partition-key"): "pk"}
    properties = got.properties
    assert properties == {"n": 30, "keep": 7, "when": properties["when"], "added": "new", "RuleName": "r"}
    assert type(properties["n"]) is proton.int32  # the replaced number keeps its AMQP type
    assert type(properties["keep"]) is proton.short and type(properties["when"]) is proton.timestamp
    original = {s.code: s.raw for s in split_sections(wire)}
    rewritten = {s.code: s.raw for s in split_sections(out)}
    assert rewritten[0x77] == original[0x77]  # the body, byte for byte
    assert rewritten[0x70] == original[0x70] and rewritten[0x72] == original[0x72]  # nothing changed them


def test_an_action_keeps_string_keys_in_the_application_properties() -> None:
    """Failed before: a copy a rule action changed had its application properties re-encoded with symbol keys;
    AMQP wants strings there and the Java SDK's proton-j refuses such a message (tests/java:
    test_admin_client_topics_subscriptions_rules, the SET action's copy)."""
    copy, changed = _apply(_stored(_sent()), "SET seen = 'yes'")
    got = proton.Message()
    got.decode(reencode(_sent(), copy, changed))
    assert got.properties is not None and got.properties["seen"] == "yes"
    assert all(type(key) is str for key in got.properties)  # a proton.symbol is a str subclass


def test_time_to_live_partition_key_and_removed_system_properties() -> None:
    wire = _sent()
    stored = _stored(wire)
    copy, changed = _apply(
        stored,
        "SET sys.TimeToLive = @ttl; REMOVE sys.CorrelationId; SET sys.PartitionKey = 'p2'",
        ttl=timedelta(minutes=2),
    )
    assert changed == {"time_to_live", "correlation_id", "partition_key"}
    got = proton.Message()
    got.decode(reencode(wire, copy, changed))
    assert got.ttl == 120.0 and got.correlation_id is None and got.subject == "order"
    assert got.annotations == {proton.symbol("x-opt-partition-key"): "p2"}


def test_a_message_without_properties_sections_gets_them_before_its_body() -> None:
    bare = proton.Message(body=b"data", inferred=True)
    wire = bytes(bare.encode())
    stored = dataclasses.replace(_stored(wire), message_id="x")
    copy, changed = _apply(stored, "SET sys.To = 'x'; SET p = 1")
    out = reencode(wire, copy, changed)
    assert [s.code for s in split_sections(out)] == [0x70, 0x73, 0x74, 0x75]
    got = proton.Message()
    got.decode(out)
    assert (got.address, got.properties, got.body) == ("x", {"p": 1, "RuleName": "r"}, b"data")


def test_a_copy_an_action_changed_keeps_its_encoding_in_any_namespace(tmp_path: Path) -> None:
    """A Namespace opened without the AMQP adapter (in-process, as oncebus.testing or a script opens one)
    keeps a changed copy's encoding and what changed, across a restart; the delivery encoder rewrites it."""
    wire = _sent()

    async def scenario() -> None:
        clock = ManualClock(1_800_000_000_000_000)
        store = SqliteStore(tmp_path / "oncebus.db")
        namespace = await Namespace.open(store, clock)
        await namespace.create_topic("t")
        await namespace.create_subscription("t", "s")
        rule = RuleProperties("r", SqlRuleFilter("1=1"), SqlRuleAction("SET sys.Label = 'changed'; SET n = 4"))
        await namespace.create_rule("t", "s", rule)
        await namespace.delete_rule("t", "s", "$Default")
        await namespace.send("t", [decode_message(wire)])
        await namespace.close()
        store.close()
        store = SqliteStore(tmp_path / "oncebus.db")
        namespace = await Namespace.open(store, clock)  # restarted
        (received,) = await namespace.receive("t/subscriptions/s", max_message_count=1)
        await namespace.close()
        store.close()
        got = proton.Message()
        got.decode(encode_received(received, lock_annotations=True))
        assert got.body == {"key": [1, "two"]}  # the value body, as sent
        assert got.subject == "changed"
        assert got.properties["n"] == 4 and isinstance(got.properties["n"], proton.int32)
        assert got.properties["keep"] == 7 and isinstance(got.properties["keep"], proton.short)
        assert got.correlation_id == "c"

    run(scenario())
