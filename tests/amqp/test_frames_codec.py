"""The frame scanner (message format read from transfer frames) and the message codec, on bytes the SDK encodes."""

from __future__ import annotations

import random
import struct
import uuid
from datetime import UTC, datetime

import pytest
from azure.servicebus._pyamqp._decode import decode_payload
from azure.servicebus._pyamqp._encode import encode_frame, encode_payload
from azure.servicebus._pyamqp.message import Header, Message, Properties
from azure.servicebus._pyamqp.performatives import AttachFrame, TransferFrame
from azure.servicebus._pyamqp.utils import amqp_timestamp_value

from oncebus.amqp import codec
from oncebus.amqp.frames import BATCH_MESSAGE_FORMAT, FrameError, FrameScanner
from oncebus.core.messages import MessageState, ReceivedMessage


def frame(channel: int, performative: object) -> bytes:
    header, body = encode_frame(performative)  # type: ignore[arg-type]
    assert body is not None
    return header + struct.pack(">H", channel) + bytes(body)


def attach(name: str, handle: int, *, sender: bool = True) -> AttachFrame:
    return AttachFrame(name, handle, not sender, 0, 0, None, None, None, None, None, None, None, None, None)


def transfer(handle: int, payload: bytes, **fields: object) -> TransferFrame:
    values = {
        "handle": handle,
        "delivery_id": None,
        "delivery_tag": None,
        "message_format": None,
        "settled": None,
        "more": False,
        "rcv_settle_mode": None,
        "state": None,
        "resume": None,
        "aborted": None,
        "batchable": None,
        "payload": payload,
    }
    values.update(fields)
    return TransferFrame(**values)


def encoded(message_id: str, body: bytes = b"payload") -> bytes:
    out = bytearray()
    encode_payload(out, Message(data=[body], properties=Properties(message_id=message_id)))
    return bytes(out)


def test_scanner_reads_formats_and_tags_across_multi_frame_transfers_and_any_split() -> None:
    stream = b"AMQP\x03\x01\x00\x00" + b"AMQP\x00\x01\x00\x00"
    stream += frame(1, attach("to-queue", 3))
    stream += frame(1, attach("from-queue", 4, sender=False))
    stream += frame(
        1, transfer(3, b"first half", delivery_id=0, delivery_tag=b"t1", message_format=BATCH_MESSAGE_FORMAT, more=True)
    )
    stream += frame(1, transfer(3, b"second half", more=False))
    stream += frame(1, transfer(3, b"plain", delivery_id=1, delivery_tag=b"\x00\xff", message_format=0))
    stream += frame(1, transfer(3, b"no format", delivery_id=2, delivery_tag=b"t3"))
    rng = random.Random(7)
    for _ in range(20):
        scanner = FrameScanner()
        position = 0
        while position < len(stream):
            step = rng.randint(1, 40)
            scanner.feed(stream[position : position + step])
            position += step
        got = [scanner.pop("to-queue") for _ in range(3)]
        assert [(d.tag, d.message_format) for d in got] == [
            (b"t1", BATCH_MESSAGE_FORMAT),
            (b"\x00\xff", 0),
            (b"t3", 0),
        ]
        with pytest.raises(FrameError):
            scanner.pop("to-queue")


def test_scanner_refuses_a_transfer_on_an_unknown_handle() -> None:
    scanner = FrameScanner()
    with pytest.raises(FrameError):
        scanner.feed(frame(0, transfer(9, b"x", delivery_id=0, delivery_tag=b"t", message_format=0)))


def test_only_the_batch_format_unpacks_data_sections() -> None:
    inner = [encoded("a"), encoded("b")]
    envelope = bytearray()
    encode_payload(envelope, Message(data=inner, properties=Properties(message_id="outer")))
    plain = codec.decode_transfer(bytes(envelope), 0)
    assert [m.message_id for m in plain] == ["outer"]
    assert plain[0].body == b"".join(inner)
    batch = codec.decode_transfer(bytes(envelope), BATCH_MESSAGE_FORMAT)
    assert [(m.message_id, m.body) for m in batch] == [("a", b"payload"), ("b", b"payload")]
    assert batch[0].wire == inner[0]
    with pytest.raises(ValueError, match="message format"):
        codec.decode_transfer(bytes(envelope), 0x1234)


def test_decode_reads_the_service_bus_fields() -> None:
    out = bytearray()
    scheduled = 1_800_000_000_000
    encode_payload(
        out,
        Message(
            header=Header(ttl=30_000),
            message_annotations={
                b"x-opt-partition-key": "pk",
                b"x-opt-scheduled-enqueue-time": amqp_timestamp_value(scheduled),
            },
            properties=Properties(message_id="m", group_id="s", correlation_id="c", subject="sub"),
            application_properties={"k": 1, "b": b"\x01"},
            data=[b"body"],
        ),
    )
    message = codec.decode_message(bytes(out))
    assert (message.message_id, message.session_id, message.partition_key) == ("m", "s", "pk")
    assert (message.correlation_id, message.subject, message.body) == ("c", "sub", b"body")
    assert message.time_to_live is not None and message.time_to_live.total_seconds() == 30
    assert message.application_properties == {"k": 1, "b": "01"}
    assert message.scheduled_enqueue_time_utc == datetime(2027, 1, 15, 8, 0, tzinfo=UTC)


def test_encode_received_adds_broker_annotations_and_keeps_the_message() -> None:
    wire = encoded("m", b"hello")
    token = uuid.uuid4()
    received = ReceivedMessage(
        body=b"hello",
        message_id="m",
        sequence_number=42,
        enqueued_time_utc=datetime(2030, 1, 1, tzinfo=UTC),
        delivery_count=3,
        state=MessageState.DEAD_LETTERED,
        lock_token=token,
        locked_until_utc=datetime(2030, 1, 1, 0, 1, tzinfo=UTC),
        expires_at_utc=None,
        session_id=None,
        partition_key="pk",
        correlation_id=None,
        subject=None,
        content_type=None,
        reply_to=None,
        reply_to_session_id=None,
        to=None,
        application_properties={},
        time_to_live=None,
        scheduled_enqueue_time_utc=None,
        dead_letter_reason="poison",
        dead_letter_error_description="bad",
        dead_letter_source=None,
        wire=wire,
    )
    decoded = decode_payload(memoryview(codec.encode_received(received, lock_annotations=True)))
    annotations = decoded.message_annotations
    assert annotations[b"x-opt-sequence-number"] == 42
    assert annotations[b"x-opt-enqueued-time"] == 1_893_456_000_000
    assert annotations[b"x-opt-locked-until"] == 1_893_456_060_000
    assert annotations[b"x-opt-partition-key"] == b"pk"
    assert decoded.header.delivery_count == 2
    assert decoded.properties.message_id == b"m"
    assert decoded.application_properties[b"DeadLetterReason"] == b"poison"
    assert decoded.data == [b"hello"]
