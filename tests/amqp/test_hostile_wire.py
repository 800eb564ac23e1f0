"""Hostile clients on a raw socket against ``oncebus serve``: bounded work before authentication, clean closes.

Each test is what a client that does not follow the protocol (or follows it
to hurt) can send; after each, the server is alive and an SDK client works.
The server runs with a 1 s handshake timeout (``ONCEBUS_AMQP_HANDSHAKE_TIMEOUT``).
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode
from azure.servicebus._pyamqp.message import Header, Message, Properties
from azure.servicebus._pyamqp.performatives import SASLInit

from oncebus.amqp.encoding import encode_symbol
from oncebus.amqp.frames import Frame, FrameScanner, Performative, ProtocolHeader
from oncebus.amqp.limits import AmqpLimits
from tests.amqp.conftest import ServerProcess, topology
from tests.amqp.raw import (
    AMQP_HEADER,
    ATTACH,
    CLOSE,
    DETACH,
    OPEN,
    SASL_HEADER,
    SASL_MECHANISMS,
    RawClient,
    attach_frame,
    encoded,
    error_of,
    frame,
    open_frame,
    outcome_of,
    raw_frame,
    transfer_frame,
    vmrss_kib,
)

HANDSHAKE_TIMEOUT = 1.0
QUEUES = {
    "rawq": {},
    "small": {"MaxMessageSizeInKilobytes": 64},
    "typed": {},
    "probe": {},
}


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("hostile")
    env = {"ONCEBUS_AMQP_HANDSHAKE_TIMEOUT": str(HANDSHAKE_TIMEOUT)}
    process = ServerProcess(base / "data", topology(QUEUES, {}), env=env).start()
    yield process
    process.stop()


def sdk_round_trip(server: ServerProcess, tag: str) -> None:
    """Another client's send and receive succeed."""
    assert server.alive()
    with ServiceBusClient.from_connection_string(server.connection_string) as client:
        with client.get_queue_sender("probe") as sender:
            sender.send_messages(ServiceBusMessage(tag, message_id=tag))
        with client.get_queue_receiver(
            "probe", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE, max_wait_time=5
        ) as receiver:
            assert [str(m) for m in receiver.receive_messages(max_message_count=10, max_wait_time=5)] == [tag]


def closed_with(client: RawClient, timeout: float = 5.0) -> tuple[str, str]:
    """The server sent a close with an error and closed the socket: (condition, description)."""
    frames = client.frames_until_closed(timeout)
    closes = [f for f in frames if f.code == CLOSE]
    assert closes, f"no close frame before the socket closed: {frames}"
    return error_of(closes[-1])


# ------------------------------------------------------------------------------ no AMQP header
# (the listener sends HTTP and TLS elsewhere, and closes on bytes that are none of AMQP, TLS and HTTP; what
# starts with "AMQP" comes here and must be AMQP 1.0 exactly)
@pytest.mark.parametrize(
    "first_bytes",
    [
        b"AMQP\x02\x01\x00\x00",  # AMQP over TLS's header, without TLS
        b"AMQP\x00\x00\x09\x01",  # AMQP 0-9-1
        b"AMQP\x01\x01\x00\x00",  # an unknown protocol id
        b"AMQP\x00\x01\x00\x01" + b"x" * 100,  # another revision, then bytes
    ],
    ids=["amqp-tls-header", "amqp-0-9-1", "protocol-id-1", "revision"],
)
def test_a_wrong_amqp_header_gets_our_header_and_a_closed_socket(hostile: ServerProcess, first_bytes: bytes) -> None:
    with RawClient(hostile.port) as client:
        client.send(first_bytes)
        assert client.frames_until_closed(5) == []
        assert client.headers == [AMQP_HEADER]  # AMQP 1.0, 2.2: answer with the header we speak, then close
    sdk_round_trip(hostile, "after-not-amqp")


def test_bytes_that_are_no_protocol_are_closed_at_once(hostile: ServerProcess) -> None:
    with RawClient(hostile.port) as client:
        client.send(b"\x00\x00\x00\x10\x02\x00\x00\x00garbage!")
        assert client.frames_until_closed(5) == []


def test_non_amqp_bytes_read_as_a_frame_size_are_never_buffered(hostile: ServerProcess) -> None:
    """A header announcing 2 GiB, then a stream: refused at the size, nothing buffered, memory flat."""
    before = vmrss_kib(hostile.pid)
    with RawClient(hostile.port) as client:
        client.send(AMQP_HEADER + struct.pack(">IBBH", 2**31, 2, 0, 0))
        sent = 0
        chunk = b"\xab" * 65536
        try:
            while sent < 64 * 1024 * 1024:  # the old scanner buffered (and re-joined) all of this
                client.sock.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert sent < 64 * 1024 * 1024, "the server kept reading a frame it can never accept"
        condition, description = closed_with(client)
    assert condition == "amqp:connection:framing-error"
    assert "2147483648" in description and "512" in description
    assert vmrss_kib(hostile.pid) - before < 8 * 1024
    sdk_round_trip(hostile, "after-2gib")


# ------------------------------------------------------------------------------ frame bounds
def test_a_frame_over_512_bytes_before_the_open_exchange_is_refused(hostile: ServerProcess) -> None:
    with RawClient(hostile.port) as client:
        client.send(AMQP_HEADER + open_frame(container="x" * 600))
        condition, description = closed_with(client)
    assert condition == "amqp:connection:framing-error"
    assert "512 until the open exchange" in description


def test_a_sasl_frame_over_512_bytes_is_refused_and_the_socket_closed(hostile: ServerProcess) -> None:
    with RawClient(hostile.port) as client:
        client.send(SASL_HEADER)
        client.expect(SASL_MECHANISMS)
        client.send(frame(SASLInit(b"ANONYMOUS", b"x" * 600, None), frame_type=b"\x01"))
        assert [f.code for f in client.frames_until_closed(5)] == []  # SASL has no error frame


def test_a_frame_over_the_max_frame_size_after_the_open_is_refused(hostile: ServerProcess) -> None:
    with RawClient(hostile.port) as client:
        client.handshake()
        client.send(raw_frame(b"\x00\x53\x13\x45" + b"\x00" * 70_000))
        condition, description = closed_with(client)
    assert condition == "amqp:connection:framing-error"
    assert "70012 bytes" in description and "65536" in description


def test_a_transfer_over_the_entity_size_is_refused_as_soon_as_it_passes(hostile: ServerProcess) -> None:
    """A multi-frame delivery to a 64 KiB queue: rejected once 64 KiB pass, the rest of it costs nothing."""
    with RawClient(hostile.port) as client:
        client.handshake()
        assert client.put_token("small") == 202
        client.attach_sender("small", handle=1)
        piece = b"\x00\x53\x75\xb0" + struct.pack(">I", 600_000) + b"p" * 50_000  # a data section that never ends
        big = client.transfer(1, piece, tag=b"big", more=True)
        client.send(transfer_frame(1, b"p" * 50_000, delivery_id=big, more=True))  # 100 KB: over 64 KiB
        outcome = client.disposition(big, timeout=5)  # before the delivery is complete
        assert outcome.fields[3] is True  # settled
        name, condition, description = outcome_of(outcome)
        assert (name, condition) == ("rejected", "amqp:link:message-size-exceeded")
        assert description is not None and "65536 bytes" in description
        before = vmrss_kib(hostile.pid)
        for _ in range(200):  # 10 MB more of the same delivery: dropped as it arrives
            client.send(transfer_frame(1, b"p" * 50_000, delivery_id=big, more=True))
        client.send(transfer_frame(1, b"end", delivery_id=big, more=False))
        after = client.transfer(1, encoded(Message(data=[b"fits"], properties=Properties(message_id="fits"))))
        assert outcome_of(client.disposition(after))[0] == "accepted"  # the same link takes the next message
        assert vmrss_kib(hostile.pid) - before < 8 * 1024
    with ServiceBusClient.from_connection_string(hostile.connection_string) as sdk:
        with sdk.get_queue_receiver("small", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as receiver:
            assert [m.message_id for m in receiver.receive_messages(max_message_count=10, max_wait_time=3)] == ["fits"]
    sdk_round_trip(hostile, "after-oversized")


def test_a_transfer_on_a_link_the_server_refused_is_dropped(hostile: ServerProcess) -> None:
    """No token: the attach is refused; transfers on it anyway are not buffered, and the connection lives."""
    with RawClient(hostile.port) as client:
        client.handshake()
        client.send(attach_frame("no-token", 1, "rawq", sender=True))
        client.expect(ATTACH)
        condition, _ = error_of(client.expect(DETACH))
        assert condition == "amqp:unauthorized-access"
        for i in range(50):
            client.send(transfer_frame(1, b"x" * 60_000, delivery_id=i, delivery_tag=b"t%d" % i))
        assert client.put_token("rawq") == 202  # the connection still answers
    sdk_round_trip(hostile, "after-refused-link")


def test_a_frame_trickled_byte_by_byte_is_scanned_once() -> None:
    """No quadratic re-joining: a partial frame only grows a buffer until it holds the bytes the scanner said it
    needs (its ``_need``: a compiled scanner's methods cannot be wrapped, so the scans are counted from it)."""
    scanner = FrameScanner(AmqpLimits())
    scans = 0
    stream = AMQP_HEADER + open_frame() + raw_frame(b"\x00\x53\x13\x45" + b"\x00" * 60_000)
    out: list[Frame] = []
    for i in range(len(stream)):
        if scanner.buffered == 0 or scanner.buffered + 1 >= scanner._need:  # what feed scans again
            scans += 1
        try:
            out += scanner.feed(stream[i : i + 1])
        except Exception as exc:  # the flow frame has trailing bytes: refused, once it is whole
            assert "bytes follow the flow performative" in str(exc)
            break
    else:
        raise AssertionError("the malformed flow frame was not refused")
    assert [type(f) for f in out] == [ProtocolHeader, Performative]  # the header and the open, nothing more
    assert i == len(stream) - 1  # refused at its last byte: the partial frame was kept until it was whole
    assert scans < 100, f"the scanner re-scanned the partial frame {scans} times"


# ------------------------------------------------------------------------------ protocol errors
@pytest.mark.parametrize(
    ("frame_bytes", "condition", "words"),
    [
        (struct.pack(">IBBH", 4, 2, 0, 0), "amqp:connection:framing-error", "size 4"),
        (struct.pack(">IBBH", 8, 1, 0, 0), "amqp:connection:framing-error", "data offset 1"),
        (raw_frame(b"\x00\x53\x30\x45"), "amqp:decode-error", "descriptor 0x30"),
        (raw_frame(b"\x00\x53\x10\xc0\x03\x01\xff\x00"), "amqp:decode-error", "constructor 0xff"),
        (raw_frame(b"\x00\x53\x10\xc0\x10\x05\xa1\x01x"), "amqp:decode-error", "cannot be decoded"),
        (raw_frame(b"\x00\x53\x10\xa1\x01x"), "amqp:decode-error", "not a list"),
        (raw_frame(b"\x00\x53\x40\x45", frame_type=1), "amqp:connection:framing-error", "frame type 1"),
    ],
    ids=["size-4", "doff-1", "unknown-performative", "unknown-constructor", "truncated", "not-a-list", "sasl-type"],
)
def test_every_protocol_error_ends_with_a_close_and_a_closed_socket(
    hostile: ServerProcess, frame_bytes: bytes, condition: str, words: str
) -> None:
    with RawClient(hostile.port) as client:
        client.send(AMQP_HEADER + frame_bytes)
        got_condition, description = closed_with(client)
        assert client.headers == [AMQP_HEADER]
    assert got_condition == condition
    assert words in description


def test_a_protocol_error_after_the_open_exchange_closes_cleanly(hostile: ServerProcess) -> None:
    with RawClient(hostile.port) as client:
        client.handshake()
        client.send(raw_frame(b"\x00\x53\x99\x45"))
        condition, _ = closed_with(client)
    assert condition == "amqp:decode-error"
    sdk_round_trip(hostile, "after-protocol-error")


def nested_list(depth: int) -> bytes:
    value = b"\x45"
    for _ in range(depth):
        value = b"\xd0" + struct.pack(">II", len(value) + 4, 1) + value
    return value


def test_deeply_nested_values_in_a_performative_are_a_decode_error(hostile: ServerProcess) -> None:
    with RawClient(hostile.port) as client:
        client.handshake()
        properties = b"\xd1" + struct.pack(">II", 0, 2)  # a map {"p": <nested>} as attach properties
        inner = b"\xa1\x01p" + nested_list(5000)
        properties = b"\xd1" + struct.pack(">II", len(inner) + 4, 2) + inner
        fields = [b"\xa1\x01n", b"\x43", b"\x42", b"\x40", b"\x40", b"\x40", b"\x40"] + [b"\x40"] * 6 + [properties]
        body = b"".join(fields)
        attach = b"\x00\x53\x12\xd0" + struct.pack(">II", len(body) + 4, len(fields)) + body
        client.send(raw_frame(attach))
        condition, description = closed_with(client)
    assert condition == "amqp:decode-error"
    assert "nested too deeply" in description
    sdk_round_trip(hostile, "after-nesting")


def test_a_deeply_nested_message_body_refuses_that_message_only(hostile: ServerProcess) -> None:
    with RawClient(hostile.port) as client:
        client.handshake()
        assert client.put_token("rawq") == 202
        client.attach_sender("rawq", handle=1)
        body = b"\x00\x53\x77" + nested_list(3000)  # an amqp-value section nested 3000 deep
        first = client.transfer(1, encoded(Message(properties=Properties(message_id="deep"))) + body)
        name, condition, description = outcome_of(client.disposition(first))
        assert (name, condition) == ("rejected", "com.microsoft:argument-error")
        assert description is not None and "nested too deeply" in description
        second = client.transfer(1, encoded(Message(data=[b"fine"], properties=Properties(message_id="fine"))))
        assert outcome_of(client.disposition(second))[0] == "accepted"  # the connection lives on


# ------------------------------------------------------------------------------ handshake timeout
# (a connection that sends nothing at all is the listener's: it closes those after its sniff timeout)
@pytest.mark.parametrize("sent", [AMQP_HEADER, SASL_HEADER, b"AMQP\x03"], ids=["header", "sasl", "half"])
def test_a_handshake_that_never_finishes_is_closed_after_the_timeout(hostile: ServerProcess, sent: bytes) -> None:
    with RawClient(hostile.port) as client:
        started = time.monotonic()
        client.send(sent)
        frames = client.frames_until_closed(HANDSHAKE_TIMEOUT + 5)
        assert time.monotonic() - started >= HANDSHAKE_TIMEOUT * 0.9
    if sent == AMQP_HEADER:  # within AMQP the client hears why: open, then close with the reason
        assert [f.code for f in frames] == [OPEN, CLOSE]
        condition, description = error_of(frames[-1])
        assert condition == "amqp:connection:forced"
        assert "did not finish within 1 s" in description


def test_an_open_connection_is_not_timed_out(hostile: ServerProcess) -> None:
    with RawClient(hostile.port) as client:
        client.handshake()
        time.sleep(HANDSHAKE_TIMEOUT * 1.5)  # the handshake timeout must not fire after the open
        assert client.put_token("rawq") == 202


def test_many_slow_handshakes_do_not_stall_other_clients(hostile: ServerProcess) -> None:
    """Slowloris: 200 connections that send a byte now and then; the SDK is served meanwhile; all are closed."""
    sockets = [socket.create_connection(("127.0.0.1", hostile.port)) for _ in range(200)]
    stop = threading.Event()

    def dribble() -> None:
        for position in range(4):
            if stop.wait(0.2):
                return
            for sock in sockets:
                try:
                    sock.send(b"AMQP"[position : position + 1])
                except OSError:
                    pass

    thread = threading.Thread(target=dribble)
    thread.start()
    try:
        sdk_round_trip(hostile, "during-slowloris")
    finally:
        stop.set()
        thread.join()
    deadline = time.monotonic() + HANDSHAKE_TIMEOUT + 10
    for sock in sockets:
        sock.settimeout(max(deadline - time.monotonic(), 0.1))
        try:
            while sock.recv(4096):
                pass
        except (TimeoutError, ConnectionResetError):
            pass
        finally:
            sock.close()
    assert time.monotonic() < deadline, "half-open handshakes were left open"


# ------------------------------------------------------------------------------ one message refused
def raw_message(header_fields: list[bytes] | None = None, annotations: bytes | None = None) -> bytes:
    out = b""
    if header_fields is not None:
        body = b"".join(header_fields)
        out += b"\x00\x53\x70\xc0" + bytes((len(body) + 1, len(header_fields))) + body
    if annotations is not None:
        out += b"\x00\x53\x72" + annotations
    return out + encoded(Message(data=[b"x"], properties=Properties(message_id="m")))


def annotations(**pairs: bytes) -> bytes:
    """A message-annotations map8 of symbol keys (``_`` in a name stands for ``-``) to encoded values."""
    body = b"".join(encode_symbol(name.replace("_", "-")) + value for name, value in pairs.items())
    return bytes((0xC1, len(body) + 1, 2 * len(pairs))) + body


YEAR_10000_MS = 253_402_300_800_000


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        (raw_message([b"\x40", b"\x40", b"\xa1\x03ttl"]), "ttl must be a uint"),
        (raw_message([b"\x40", b"\x40", b"\x81" + struct.pack(">q", -5)]), "ttl must be a uint"),
        (
            raw_message(
                annotations=annotations(x_opt_scheduled_enqueue_time=b"\x83" + struct.pack(">q", YEAR_10000_MS))
            ),
            "outside the years 1 to 9999",
        ),
        (raw_message(annotations=annotations(x_opt_scheduled_enqueue_time=b"\xa1\x03now")), "must be a timestamp"),
        (raw_message(annotations=annotations(x_opt_partition_key=b"\x54\x05")), "partition key"),
        (raw_message(annotations=annotations(x_opt_partition_key=b"\xa0\x02\xff\xfe")), "not UTF-8"),
    ],
    ids=[
        "ttl-string",
        "ttl-long",
        "scheduled-past-9999",
        "scheduled-string",
        "partition-key-int",
        "partition-key-bin-not-utf8",
    ],
)
def test_a_message_with_a_bad_field_is_refused_alone(hostile: ServerProcess, payload: bytes, words: str) -> None:
    """Wrong-typed header ttl, scheduled time past 9999, a partition key neither a string nor UTF-8 binary: a
    rejected outcome, no close."""
    with RawClient(hostile.port) as client:
        client.handshake()
        assert client.put_token("typed") == 202
        client.attach_sender("typed", handle=1)
        name, condition, description = outcome_of(client.disposition(client.transfer(1, payload)))
        assert (name, condition) == ("rejected", "com.microsoft:argument-error")
        assert description is not None and words in description
        good = encoded(Message(data=[b"y"], header=Header(durable=True), properties=Properties(message_id="after")))
        assert outcome_of(client.disposition(client.transfer(1, good)))[0] == "accepted"  # link and connection live
