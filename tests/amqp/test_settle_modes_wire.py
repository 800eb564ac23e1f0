"""What a client asks for at attach is what the server's attach answers with: settle modes and the session filter.

go-amqp (the Go SDK's AMQP stack) fails a link whose answer differs from what it asked: the Go SDK's $cbs
and $management reply links ask snd-settle-mode settled, its peek-lock receivers rcv-settle-mode second,
and before this the server answered mixed and first, so no Go client got past its first token. Its session
filter is a described value (as the AMQP filter-set wants; the Python and JavaScript SDKs send a bare string),
which the server took whole as the session id and echoed bare, which go-amqp cannot decode.
tests/go/test_go_sdk.py meets both through the SDK.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import proton
import pytest

from tests.amqp.conftest import ServerProcess, topology
from tests.amqp.raw import ATTACH, DETACH, Frame, RawClient, attach_frame, error_of, flow_frame, raw_frame

SND_UNSETTLED, SND_SETTLED, SND_MIXED = 0, 1, 2
RCV_FIRST, RCV_SECOND = 0, 1
SESSION_FILTER = proton.symbol("com.microsoft:session-filter")
SESSION_FILTER_CODE = proton.ulong(0x137000000C)  # the descriptor go-amqp sends (Service Bus's session filter)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    queues: dict[str, dict[str, Any]] = {"plain": {}, "sessions": {"RequiresSession": True}}
    process = ServerProcess(tmp_path_factory.mktemp("attach") / "data", topology(queues, {})).start()
    yield process
    process.stop()


def _answer(client: RawClient, handle: int, address: str, snd: int, rcv: int) -> tuple[int, int]:
    """Attach a receiver of ``address`` asking (snd, rcv); the server's attach answers (snd, rcv)."""
    client.send(
        attach_frame(f"receiver-{handle}", handle, address, sender=False, send_settle_mode=snd, rcv_settle_mode=rcv)
    )
    client.send(flow_frame(handle, 1))
    got = client.expect(ATTACH)
    return got.fields[3], got.fields[4]


def test_a_reply_link_asking_for_settled_sends_is_answered_settled(server: ServerProcess) -> None:
    with RawClient(server.port) as client:
        client.handshake()
        assert _answer(client, 1, "$cbs", SND_SETTLED, RCV_FIRST) == (SND_SETTLED, RCV_FIRST)
        assert _answer(client, 2, "plain/$management", SND_SETTLED, RCV_FIRST) == (SND_SETTLED, RCV_FIRST)
        assert _answer(client, 3, "$cbs", SND_MIXED, RCV_FIRST) == (SND_MIXED, RCV_FIRST)
        # asked unsettled: still mixed, the responses sent settled (tests/amqp/test_token_scope.py)
        assert _answer(client, 4, "$cbs", SND_UNSETTLED, RCV_FIRST) == (SND_MIXED, RCV_FIRST)


def test_a_receiver_gets_the_receiver_settle_mode_it_asked_for(server: ServerProcess) -> None:
    with RawClient(server.port) as client:
        client.handshake()
        assert client.put_token("plain") == 202
        # peek-lock as go-amqp asks it (rcv second, snd left to the server), and as the Python SDK asks it
        assert _answer(client, 1, "plain", SND_MIXED, RCV_SECOND) == (SND_UNSETTLED, RCV_SECOND)
        assert _answer(client, 2, "plain", SND_UNSETTLED, RCV_SECOND) == (SND_UNSETTLED, RCV_SECOND)
        # receive-and-delete
        assert _answer(client, 3, "plain", SND_SETTLED, RCV_FIRST) == (SND_SETTLED, RCV_FIRST)


def _session_receiver(handle: int, session: Any, properties: dict[Any, Any] | None = None) -> bytes:
    """A peek-lock receiver of ``sessions`` with the session filter ``session``, encoded as go-amqp does."""
    source = proton.Described(
        proton.ulong(0x28), ["sessions", None, None, None, None, None, None, {SESSION_FILTER: session}]
    )
    target = proton.Described(proton.ulong(0x29), [None])
    attach = [
        f"session-{handle}",
        proton.uint(handle),
        True,
        proton.ubyte(SND_MIXED),
        proton.ubyte(RCV_SECOND),
        source,
        target,
        None,
        False,
        None,
        None,
        None,
        None,
        properties,
    ]
    data = proton.Data()
    data.put_object(proton.Described(proton.ulong(0x12), attach))
    return raw_frame(bytes(data.encode()))


def _source_filter(attach: Frame) -> Any:
    """The session filter of the server's attach, decoded with its descriptors (None: a null source)."""
    data = proton.Data()
    data.decode(attach.body)
    data.rewind()
    data.next()
    performative = data.get_object()
    source = performative.value[5]
    if source is None:
        return None
    return source.value[7][SESSION_FILTER]


def test_a_described_session_filter_is_read_for_its_value_and_echoed_described(server: ServerProcess) -> None:
    with RawClient(server.port) as client:
        client.handshake()
        assert client.put_token("sessions") == 202
        client.send(_session_receiver(1, proton.Described(SESSION_FILTER_CODE, "s-go")))
        echoed = _source_filter(client.expect(ATTACH))
        assert echoed == proton.Described(SESSION_FILTER_CODE, "s-go")


def test_a_described_null_session_filter_asks_for_the_next_session(server: ServerProcess) -> None:
    """Nothing in the queue: the next-available wait ends in com.microsoft:timeout (before: a session named after
    the described value was locked)."""
    with RawClient(server.port) as client:
        client.handshake()
        assert client.put_token("sessions") == 202
        timeout = {proton.symbol("com.microsoft:timeout"): proton.uint(300)}
        client.send(_session_receiver(1, proton.Described(SESSION_FILTER_CODE, None), timeout))
        assert _source_filter(client.expect(ATTACH)) is None
        assert error_of(client.expect(DETACH))[0] == "com.microsoft:timeout"
