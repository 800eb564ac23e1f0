"""Application property values at the AMQP door, with the azure-servicebus SDK against the AMQP listener in this
process (issue 33 item 2): what no other door could carry is refused, naming the property and what is allowed;
and a message the delivery encoder fails on stops nothing: its receiver gets the others, and it waits in the
dead-letter queue with why."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import proton
import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode, ServiceBusSubQueue
from azure.servicebus.exceptions import ServiceBusError
from hypothesis import given, settings
from hypothesis import strategies as st

from oncebus.amqp import outgoing
from oncebus.amqp.limits import AmqpLimits
from oncebus.amqp.sas import DEFAULT_KEY, DEFAULT_KEY_NAME
from oncebus.core.errors import InvalidArgumentError
from oncebus.core.messages import StoredMessage
from oncebus.core.properties import application_property_error, check_application_properties
from oncebus.core.received import ReceivedMessage
from oncebus.http.messages import _header_value as rest_header_value
from tests.amqp.inprocess import InProcessServer
from tests.amqp.txn_client import TxnClient


@pytest.fixture(scope="module")
def listener() -> Iterator[InProcessServer]:
    server = InProcessServer(AmqpLimits(), ["values", "encoding", "deleting", "modify"]).start()
    yield server
    server.stop()


def _client(server: InProcessServer) -> ServiceBusClient:
    return ServiceBusClient.from_connection_string(
        f"Endpoint=sb://127.0.0.1:{server.port};SharedAccessKeyName={DEFAULT_KEY_NAME};"
        f"SharedAccessKey={DEFAULT_KEY};UseDevelopmentEmulator=true"
    )


def _texts(properties: dict[Any, Any] | None) -> dict[str, Any]:
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in (properties or {}).items()}


def test_a_list_property_is_refused_naming_it(listener: InProcessServer) -> None:
    with _client(listener) as sb:
        with sb.get_queue_sender("values") as sender:
            with pytest.raises(ServiceBusError, match="'tags' is a list"):
                sender.send_messages(ServiceBusMessage(b"refused", application_properties={"tags": [1, 2]}))
            sender.send_messages(ServiceBusMessage(b"kept", application_properties={"n": 7, "s": "x"}))
        with sb.get_queue_receiver("values", max_wait_time=5) as receiver:
            (got,) = receiver.receive_messages(max_message_count=10, max_wait_time=5)
            assert b"".join(got.body) == b"kept"  # the refused one was not stored
            assert _texts(got.application_properties) == {"n": 7, "s": b"x"}
            receiver.complete_message(got)


@pytest.fixture
def failing_encoder(monkeypatch: pytest.MonkeyPatch) -> None:
    """The delivery encoder fails on the body ``cursed`` (a stand-in for any failure of ours in it), unless it is
    dead-lettered."""
    encode = outgoing.encode_received

    def encode_or_fail(message: ReceivedMessage, **kwargs: Any) -> bytes:
        if message.body == b"cursed" and message.dead_letter_reason is None:
            raise RuntimeError("the encoder failed on purpose")
        return encode(message, **kwargs)

    monkeypatch.setattr(outgoing, "encode_received", encode_or_fail)


def test_a_message_the_encoder_fails_on_does_not_stop_the_others(
    listener: InProcessServer, failing_encoder: None
) -> None:
    with _client(listener) as sb:
        with sb.get_queue_sender("encoding") as sender:
            sender.send_messages([ServiceBusMessage(body) for body in (b"one", b"cursed", b"two")])
        with sb.get_queue_receiver("encoding", max_wait_time=5) as receiver:
            got = receiver.receive_messages(max_message_count=10, max_wait_time=5)
            got += receiver.receive_messages(max_message_count=10, max_wait_time=1)
            assert [b"".join(m.body) for m in got] == [b"one", b"two"]
            for message in got:
                receiver.complete_message(message)
        with sb.get_queue_receiver("encoding", sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=5) as receiver:
            (dead,) = receiver.receive_messages(max_message_count=10, max_wait_time=5)
            assert b"".join(dead.body) == b"cursed" and dead.dead_letter_reason == "MessageEncodingFailed"
            assert "the encoder failed on purpose" in (dead.dead_letter_error_description or "")


def test_the_link_goes_on_in_receive_and_delete_mode_too(listener: InProcessServer, failing_encoder: None) -> None:
    with _client(listener) as sb:
        with sb.get_queue_sender("deleting") as sender:
            sender.send_messages([ServiceBusMessage(body) for body in (b"one", b"cursed", b"two")])
        mode = ServiceBusReceiveMode.RECEIVE_AND_DELETE
        with sb.get_queue_receiver("deleting", receive_mode=mode, max_wait_time=5) as receiver:
            got = receiver.receive_messages(max_message_count=10, max_wait_time=5)
            got += receiver.receive_messages(max_message_count=10, max_wait_time=1)
            assert [b"".join(m.body) for m in got] == [b"one", b"two"]


_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([-(2**63), -(2**63) - 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(),
    st.text(st.characters(codec=None, categories=["Cs"]), min_size=1, max_size=3),  # lone surrogates
    st.binary(max_size=20),
    st.uuids(),
    st.datetimes(min_value=datetime(1970, 1, 2), timezones=st.just(UTC)),
    st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=10_000)),
    st.decimals(allow_nan=False, places=4),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(value=_VALUES, dead_lettered=st.booleans())
def test_a_value_the_core_takes_every_door_can_hand_out(value: Any, dead_lettered: bool) -> None:
    """The core's check is the contract: what it takes, the AMQP encoder (both paths), the store's record and the
    REST door's header all carry; what it refuses, it refuses naming the property."""
    refusal = application_property_error("p", value)
    if refusal is not None:
        assert "'p'" in str(refusal)
        with pytest.raises(InvalidArgumentError, match="'p'"):
            check_application_properties({"p": value})
        return
    stored = StoredMessage("q", 1, "m", b"x", 0, None, application_properties={"p": value})
    if dead_lettered:
        stored.dead_letter_reason = "r"
    decoded = proton.Message()
    decoded.decode(outgoing.encode_received(ReceivedMessage.of(stored), lock_annotations=True))
    assert "p" in decoded.properties
    if isinstance(value, int) and not isinstance(value, bool):
        assert decoded.properties["p"] == value  # a long, or a ulong above a long's range
    kept = StoredMessage.from_row(
        path="q", sequence_number=1, state=0, delivery_count=0, enqueued_time_us=0, expires_at_us=None,
        body=b"x", wire=None, meta=stored.meta_json(),
    )  # fmt: skip
    assert "p" in kept.application_properties
    header = rest_header_value(value)
    assert header.decode("latin-1").isprintable() or header == b""


def test_properties_to_modify_are_checked_as_a_send_and_keep_their_service_bus_types(listener: InProcessServer) -> None:
    """A modified outcome's message annotations (an abandon's properties to modify, as the .NET and Go SDKs send
    them) go through the core's check: a list is refused naming it, the lock kept; a .NET TimeSpan (described
    ``com.microsoft:timespan``) and binary reach the next receiver as they were sent."""
    client = TxnClient(listener.port)
    try:
        client.send("modify", proton.Message(body=b"refused", properties={"n": 1}))
        client.send("modify", proton.Message(body=b"changed", properties={"n": 2}))
        _, delivery = client.receive("modify")
        delivery.local.annotations = {proton.symbol("tags"): [1, 2]}
        refused = client.settle(delivery, None, proton.Delivery.MODIFIED)
        assert refused.state == proton.Delivery.REJECTED and "'tags' is a list" in (refused.description or "")
        _, second = client.receive("modify")  # the first stays locked: its abandon was refused
        span = proton.Described(proton.symbol("com.microsoft:timespan"), 90 * 10_000_000)  # 90 s in ticks
        second.local.annotations = {proton.symbol("span"): span, proton.symbol("raw"): b"\x01\x02"}
        assert client.settle(second, None, proton.Delivery.MODIFIED).state == proton.Delivery.MODIFIED
        message, last = client.receive("modify")
        assert message.body == b"changed" and message.properties["n"] == 2
        assert message.properties["raw"] == b"\x01\x02" and message.properties["span"] == span
        client.settle(last, None)
    finally:
        client.close()
