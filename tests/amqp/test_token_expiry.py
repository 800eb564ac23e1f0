"""A CBS token that lapses while its links are open: they are detached, as Service Bus does, unless renewed.

The listener runs in this process with a wall clock the test moves (no waiting for a token to expire);
it checks tokens every 0.3 s.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from azure.servicebus._pyamqp.message import Message, Properties

from oncebus.amqp.limits import AmqpLimits
from tests.amqp.inprocess import InProcessServer
from tests.amqp.raw import ATTACH, DETACH, RawClient, attach_frame, encoded, error_of, flow_frame, outcome_of


@pytest.fixture
def listener() -> Iterator[InProcessServer]:
    server = InProcessServer(AmqpLimits(token_check_interval=0.3), ["orders", "audit"]).start()
    yield server
    server.stop()


def attach_receiver(client: RawClient, entity: str, handle: int) -> None:
    client.send(attach_frame(f"receiver-{handle}", handle, entity, sender=False))
    client.send(flow_frame(handle, 10))
    client.expect(ATTACH)


def detached(client: RawClient, timeout: float) -> list[tuple[int, str, str]]:
    """(server handle, condition, description) of every detach within ``timeout``."""
    out = []
    while (got := client.read_frame(timeout)) is not None:
        if got.code == DETACH:
            out.append((got.fields[0], *error_of(got)))
    return out


def test_links_are_detached_when_their_token_lapses_unrenewed(listener: InProcessServer) -> None:
    now = int(listener.wall)
    with RawClient(listener.port) as client:
        client.handshake()
        assert client.put_token("orders", expiry=now + 60) == 202
        assert client.put_token("audit", expiry=now + 600, handles=(102, 103)) == 202
        attach_receiver(client, "orders", 1)
        client.attach_sender("orders", handle=2)
        attach_receiver(client, "audit", 3)
        assert detached(client, 0.5) == []  # all valid
        listener.wall = now + 61  # the token for orders lapses; the one for audit does not
        # a send right away is refused (no valid token), and the links still go at the next check
        sent = client.transfer(2, encoded(Message(data=[b"late"], properties=Properties(message_id="late"))))
        assert outcome_of(client.disposition(sent))[1] == "amqp:unauthorized-access"
        gone = detached(client, 1.5)
        assert len(gone) == 2  # the receiver and the sender on orders, not the receiver on audit
        for _, condition, description in gone:
            assert condition == "amqp:link:detach-forced"
            assert "RenewToken" in description and "'orders'" in description
        # the client can come back with a fresh token
        assert client.put_token("orders", expiry=now + 3600, handles=(104, 105)) == 202
        attach_receiver(client, "orders", 6)
        assert detached(client, 0.5) == []


def test_a_token_renewed_in_time_keeps_the_links(listener: InProcessServer) -> None:
    now = int(listener.wall)
    with RawClient(listener.port) as client:
        client.handshake()
        assert client.put_token("orders", expiry=now + 60) == 202
        attach_receiver(client, "orders", 1)
        # renewed before it lapses (the SDK does this on its own)
        assert client.put_token("orders", expiry=now + 120, handles=(102, 103)) == 202
        listener.wall = now + 61
        assert detached(client, 0.5) == []
        listener.wall = now + 121
        assert [condition for _, condition, _ in detached(client, 1.5)] == ["amqp:link:detach-forced"]
