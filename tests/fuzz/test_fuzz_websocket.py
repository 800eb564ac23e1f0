"""Generated and mutated WebSocket frame sequences thrown at ``oncebus serve``'s AMQP over WebSockets door.

Each example upgrades a fresh connection on ``/$servicebus/websocket`` and sends a
sequence of WebSocket events built by wsproto's own client side: binary messages
carrying pieces of a real AMQP client's stream (SASL, open, begin, attaches to
``$cbs``) or random bytes, whole or fragmented; text messages; pings, pongs and
Close frames with any code. hypothesis then mutates the bytes (flipped, cut,
inserted, dropped and repeated bytes; a cleared mask bit; a length field made
huge) and cuts them into writes of its choosing. The client may answer the
server's Close or never do.

After every example: the server ended the connection within its timeouts, and what
it sent parses as WebSocket frames ending in one Close frame whose code is one the
protocol gives for what was sent (never 1011, an internal error); the server is
alive and logged no traceback. Every few examples and at the end, another client
(the SDK over TCP: an acknowledged send and a round trip) still works, and memory
stays bounded; at the end every acknowledged send is there.

``ONCEBUS_FUZZ_EXAMPLES`` sets the number of examples (default sized for CI); ``ONCEBUS_FUZZ_RANDOM=1``
explores new examples instead of the fixed (derandomized) CI set.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import pytest
from azure.servicebus._pyamqp.performatives import BeginFrame, SASLInit
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from wsproto import frame_protocol
from wsproto.connection import Connection, ConnectionState, ConnectionType
from wsproto.events import BytesMessage, CloseConnection, Event, Ping, Pong, TextMessage

from tests.amqp.conftest import ServerProcess, topology
from tests.amqp.raw import AMQP_HEADER, SASL_HEADER, attach_frame, flow_frame, frame, open_frame, vmrss_kib
from tests.amqp.wsraw import read_response, upgrade_request
from tests.fuzz.sessions import Checker, drain_ids

EXAMPLES = int(os.environ.get("ONCEBUS_FUZZ_EXAMPLES", "150"))
MEMORY_HEADROOM_KIB = 96 * 1024
CHECK_EVERY = 25
MESSAGE_LIMIT = 64 * 1024
TIMEOUT = 0.5  # the server's handshake, authentication and close-flush timeouts
CLOSE_DEADLINE = 10.0  # seconds an example may take to be closed by the server, timeouts included
# the codes the server may close with for what a client sends (beside echoing the client's own Close):
# normal (AMQP closed, or a timeout), protocol error, text, invalid UTF-8 in a text message, a message too big
SERVER_CODES = {1000, 1002, 1003, 1007, 1009}

AMQP_PIECES = [
    SASL_HEADER,
    frame(SASLInit(b"ANONYMOUS", None, None), frame_type=b"\x01"),
    AMQP_HEADER,
    open_frame(),
    frame(BeginFrame(None, 0, 65536, 65536, 1023, None, None, None)),
    attach_frame("cbs-sender", 0, "$cbs", sender=True),
    attach_frame("cbs-receiver", 1, "$cbs", sender=False),
    flow_frame(1, 10),
]
HANDSHAKE = b"".join(AMQP_PIECES[:4])


@pytest.fixture(scope="module")
def ws_fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("fuzz-ws")
    env = {
        "ONCEBUS_AMQP_HANDSHAKE_TIMEOUT": str(TIMEOUT),
        "ONCEBUS_AMQP_AUTH_TIMEOUT": str(TIMEOUT),
        "ONCEBUS_AMQP_TOKEN_CHECK_INTERVAL": "0.2",
        "ONCEBUS_AMQP_CLOSE_FLUSH_TIMEOUT": str(TIMEOUT),
        "ONCEBUS_AMQP_WEBSOCKET_MESSAGE_SIZE": str(MESSAGE_LIMIT),
    }
    process = ServerProcess(
        base / "data", topology({"ledger": {"RequiresDuplicateDetection": True}, "probe": {}}, {}), env=env
    )
    process.start()
    yield process
    process.stop()


# --- what a client sends -----------------------------------------------------------------------------
_payload = st.one_of(
    st.sampled_from(AMQP_PIECES),
    st.just(HANDSHAKE),
    st.binary(max_size=64),
    st.integers(1, 3).map(lambda k: HANDSHAKE + b"\x00\x00\x00\x08\x02\x00\x00\x00" * (k * MESSAGE_LIMIT // 16)),
)
_close_codes = st.one_of(
    st.sampled_from([1000, 1001, 1002, 1003, 1007, 1008, 1009, 1011, 3000, 4999]),
    st.integers(0, 6000),  # reserved and out-of-range codes too (wsproto refuses to *send* some: skipped)
)
events = st.one_of(
    st.builds(lambda data, fin: BytesMessage(data=data, message_finished=fin), _payload, st.booleans()),
    st.builds(TextMessage, st.text(max_size=32)),
    st.builds(Ping, st.binary(max_size=125)),
    st.builds(Pong, st.binary(max_size=125)),
    st.builds(CloseConnection, _close_codes, st.one_of(st.none(), st.text(max_size=20))),
)
mutations = st.lists(
    st.one_of(
        st.tuples(st.just("flip"), st.floats(0, 1), st.integers(1, 255)),
        st.tuples(st.just("cut"), st.floats(0, 1)),
        st.tuples(st.just("insert"), st.floats(0, 1), st.binary(min_size=1, max_size=16)),
        st.tuples(st.just("drop"), st.floats(0, 1), st.integers(1, 16)),
        st.tuples(st.just("repeat"), st.floats(0, 1), st.integers(1, 64)),
        st.tuples(st.just("unmask"), st.just(0.0)),
        st.tuples(st.just("huge-length"), st.just(0.0)),
    ),
    max_size=3,
)


@dataclass
class Built:
    data: bytes
    close_codes: set[int] = field(default_factory=set)  # the Close codes the client's frames carry


def build(sequence: list[Event], mask: bytes = b"\x00\x00\x00\x00") -> Built:
    """The frames of ``sequence`` as wsproto's client writes them (events it refuses to send are skipped).

    Every frame is masked with ``mask`` (wsproto draws a random key per frame), so an example replays the
    same bytes: a mutation that makes a new frame out of masked bytes reads the same code each time."""
    client = Connection(ConnectionType.CLIENT)
    built = Built(b"")
    out = bytearray()
    for event in sequence:
        try:
            with mock.patch.object(frame_protocol.os, "urandom", lambda n: mask[:n]):
                out += client.send(event)
        except Exception:  # e.g. a text frame inside a binary message, anything after our Close, code 1005
            continue
        if isinstance(event, CloseConnection):
            built.close_codes.add(event.code)
    built.data = bytes(out)
    return built


def mutate(data: bytes, ops: list[tuple[Any, ...]]) -> bytes:
    out = bytearray(data)
    for op in ops:
        at = int(op[1] * max(len(out) - 1, 0))
        kind = op[0]
        if kind == "flip" and out:
            out[at] ^= op[2]
        elif kind == "cut":
            del out[at:]
        elif kind == "insert":
            out[at:at] = op[2]
        elif kind == "drop":
            del out[at : at + op[2]]
        elif kind == "repeat":
            out[at:at] = out[at : at + op[2]]
        elif kind == "unmask" and len(out) > 1:
            out[1] &= 0x7F  # the first frame arrives unmasked, as a server's would
        elif kind == "huge-length" and len(out) > 1:
            out[1] = (out[1] & 0x80) | 127  # a 64-bit length follows: what the next 8 bytes say
    return bytes(out)


def close_codes_in(data: bytes) -> set[int]:
    """The Close codes the (mutated) bytes carry, read as the server's wsproto reads them.

    A mutation can make a new Close frame (a repeated or flipped header) carrying any code, which the server
    then rightly echoes; the codes of the frames as built are not enough.
    """
    reader = Connection(ConnectionType.SERVER)
    codes: set[int] = set()
    with contextlib.suppress(Exception):
        reader.receive_data(data)
        for event in reader.events():
            if isinstance(event, CloseConnection):
                codes.add(event.code)
    return codes


def writes(data: bytes, sizes: list[int]) -> list[bytes]:
    chunks, at = [], 0
    for size in sizes:
        if at >= len(data):
            break
        chunks.append(data[at : at + size])
        at += size
    if at < len(data):
        chunks.append(data[at:])
    return chunks


# --- what the server answers -------------------------------------------------------------------------
@dataclass
class Answer:
    events: list[Event]
    close: CloseConnection | None
    after_close: list[Event]
    ended: bool  # the server ended the TCP connection (FIN or reset) within the deadline
    seconds: float


def exchange(port: int, chunks: list[bytes], answer_close: bool) -> Answer:
    """Upgrade, send ``chunks``, read (and parse) what the server sends until it ends the connection."""
    reader = Connection(ConnectionType.CLIENT)  # parses the server's frames (unmasked, as a server's must be)
    started = time.monotonic()
    seen: list[Event] = []
    close: CloseConnection | None = None
    after: list[Event] = []
    ended = False
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(upgrade_request(port))
        response, rest = read_response(sock)
        assert response.status_code == 101, response
        with contextlib.suppress(OSError):
            for chunk in chunks:
                sock.sendall(chunk)
        pending = rest
        while True:
            if pending:
                reader.receive_data(pending)
                for event in reader.events():
                    if close is not None:
                        after.append(event)
                        continue
                    if isinstance(event, CloseConnection):
                        close = event
                        assert reader.state is ConnectionState.REMOTE_CLOSING, f"a frame that does not parse: {event}"
                        if answer_close:
                            with contextlib.suppress(OSError):
                                sock.sendall(Connection(ConnectionType.CLIENT).send(event.response()))
                    else:
                        seen.append(event)
            remaining = started + CLOSE_DEADLINE - time.monotonic()
            if remaining <= 0:
                break
            sock.settimeout(remaining)
            try:
                pending = sock.recv(65536)
            except TimeoutError:
                break
            except ConnectionResetError:
                ended = True
                break
            if not pending:
                ended = True
                break
    return Answer(seen, close, after, ended, time.monotonic() - started)


def _settings() -> Any:
    return settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=os.environ.get("ONCEBUS_FUZZ_RANDOM") != "1",
        database=None,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )


def test_generated_websocket_frames_always_end_in_a_clean_close(ws_fuzz_server: ServerProcess) -> None:
    server = ws_fuzz_server
    checker = Checker(server.connection_string)
    checker.check()
    baseline = vmrss_kib(server.pid)
    seen_output = len(server.output)
    stats: dict[str, Any] = {"examples": 0, "codes": {}}

    @_settings()
    # CI found this one: a repeated header makes a new Close frame out of masked bytes, its code (3584) a valid one
    # the server rightly echoes; the oracle read only the codes of the frames as built (and the mask was random)
    @example(
        sequence=[
            CloseConnection(code=26, reason="9\x14"),
            CloseConnection(code=1000, reason="\x8d\xd7"),
            CloseConnection(code=3710, reason="\x8d\xd7"),
            TextMessage(data="\x11\xc2\xd6\x9d"),
        ],
        ops=[("repeat", 1.192092896e-07, 1), ("repeat", 1.192092896e-07, 26)],
        sizes=[],
        answer_close=True,
        mask=b"\xa1A8\x8a",
    )
    @given(
        sequence=st.lists(events, min_size=1, max_size=8),
        ops=mutations,
        sizes=st.lists(st.integers(1, 4096), max_size=6),
        answer_close=st.booleans(),
        mask=st.binary(min_size=4, max_size=4),
    )
    def one_example(
        sequence: list[Event], ops: list[tuple[Any, ...]], sizes: list[int], answer_close: bool, mask: bytes
    ) -> None:
        nonlocal seen_output
        built = build(sequence, mask)
        sent = mutate(built.data, ops)
        answer = exchange(server.port, writes(sent, sizes), answer_close)
        stats["examples"] += 1
        assert answer.ended, f"the server did not end the connection within {CLOSE_DEADLINE} s ({answer})"
        assert answer.close is not None, f"the server ended the connection without a Close frame ({answer})"
        assert answer.after_close == [], f"frames after the server's Close: {answer.after_close}"
        code = answer.close.code
        stats["codes"][code] = stats["codes"].get(code, 0) + 1
        clients = built.close_codes | close_codes_in(sent)
        assert code in SERVER_CODES | clients, f"close code {code} for {sequence} mutated by {ops}"
        assert code != 1011 or 1011 in clients, "the server closed with an internal error"
        assert server.alive(), "the server died:\n" + "\n".join(server.output[-40:])
        new_output = server.output[seen_output:]
        seen_output = len(server.output)
        assert not [line for line in new_output if "Traceback" in line], "\n".join(new_output[-60:])
        if stats["examples"] % CHECK_EVERY == 0:
            checker.check()
            grown = vmrss_kib(server.pid) - baseline
            assert grown < MEMORY_HEADROOM_KIB, f"server memory grew by {grown // 1024} MiB"

    try:
        one_example()
        checker.check()
    finally:
        checker.close()
    print(f"websocket fuzz: {stats}")
    assert stats["examples"] >= min(EXAMPLES, 50)
    assert len(stats["codes"]) >= 3  # the examples reached several ways of closing
    assert sorted(drain_ids(server.connection_string, "ledger")) == sorted(checker.acknowledged)
