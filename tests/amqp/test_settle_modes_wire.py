"""The settle modes a client asks for at attach are the ones the server's attach answers with.

go-amqp (the Go SDK's AMQP stack) fails a link whose answer differs from what it asked: the Go SDK's $cbs
and $management reply links ask snd-settle-mode settled, its peek-lock receivers rcv-settle-mode second,
and before this the server answered mixed and first, so no Go client got past its first token
(tests/go/test_go_sdk.py meets it through the SDK).
"""

from __future__ import annotations

from tests.amqp.conftest import ServerProcess
from tests.amqp.raw import ATTACH, RawClient, attach_frame, flow_frame

SND_UNSETTLED, SND_SETTLED, SND_MIXED = 0, 1, 2
RCV_FIRST, RCV_SECOND = 0, 1


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


def test_a_receiver_gets_the_receiver_settle_mode_it_asked_for(server: ServerProcess) -> None:
    with RawClient(server.port) as client:
        client.handshake()
        assert client.put_token("plain") == 202
        # peek-lock as go-amqp asks it (rcv second, snd left to the server), and as the Python SDK asks it
        assert _answer(client, 1, "plain", SND_MIXED, RCV_SECOND) == (SND_UNSETTLED, RCV_SECOND)
        assert _answer(client, 2, "plain", SND_UNSETTLED, RCV_SECOND) == (SND_UNSETTLED, RCV_SECOND)
        # receive-and-delete
        assert _answer(client, 3, "plain", SND_SETTLED, RCV_FIRST) == (SND_SETTLED, RCV_FIRST)
