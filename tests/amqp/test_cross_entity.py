"""Cross-entity transactions as the Java SDK's ``enableCrossEntityTransactions`` and the .NET SDK's
``EnableCrossEntityTransactions`` do them: every link on one AMQP session whose first link is a coordinator, and
no ``com.microsoft:transfer-destination-address``. Service Bus infers the send-via entity: the first entity a link
is attached to on that session (a subscription's topic); sends to other entities on the session go through it, and
a receiver on another top-level entity is refused (amqp:not-allowed). python-qpid-proton's client puts every link
on one session, so it lays the links out as the Java SDK does (tests/java runs the SDK itself)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import proton
import pytest
from azure.servicebus._pyamqp.performatives import BeginFrame

from oncebus.amqp.connection import AmqpConnection
from oncebus.amqp.encoding import NULL, encode_described, encode_list, encode_string, encode_uint
from oncebus.amqp.endpoints import FALSE
from oncebus.amqp.limits import AmqpLimits
from oncebus.amqp.performatives import ATTACH, BEGIN, END, amqp_frame
from tests.amqp.inprocess import InProcessServer
from tests.amqp.raw import RawClient, attach_frame, frame
from tests.amqp.test_transactions import bodies, count, msg, ns, queue
from tests.amqp.txn_client import TRANSACTIONAL_STATE, TxnClient

REJECTED_STATE = proton.Delivery.REJECTED
_names = itertools.count()


@pytest.fixture(scope="module")
def server() -> Iterator[InProcessServer]:
    srv = InProcessServer(AmqpLimits(), []).start()
    yield srv
    srv.stop()


@pytest.fixture
def client(server: InProcessServer) -> Iterator[TxnClient]:
    c = TxnClient(server.port, cross_entity=True)
    yield c
    c.close()


def topic_with_subscription(server: InProcessServer) -> tuple[str, str]:
    name = f"t{next(_names)}"

    async def create() -> None:
        await ns(server).create_topic(name)
        await ns(server).create_subscription(name, "s")

    server.run(create)
    return name, f"{name}/Subscriptions/s"


def test_the_first_entity_is_the_send_via_entity_and_a_commit_delivers(
    server: InProcessServer, client: TxnClient
) -> None:
    source, destination = queue(server), queue(server)
    client.send(source, msg("order"))  # the session's first entity: the send-via entity
    _, delivery = client.receive(source)
    txn = client.declare()
    assert client.settle(delivery, txn).state == TRANSACTIONAL_STATE
    sent = client.send(destination, msg("shipped"), txn)  # no transfer-destination-address: through the source
    assert sent.state == TRANSACTIONAL_STATE, sent
    assert (count(server, source), count(server, destination)) == (1, 0)  # nothing before the commit
    assert client.discharge(txn).state == proton.Delivery.ACCEPTED
    assert bodies(server, source) == [] and bodies(server, destination) == ["shipped"]
    plain = client.send(destination, msg("plain"))  # outside a transaction: stored at once
    assert plain.state == proton.Delivery.ACCEPTED
    assert bodies(server, destination) == ["shipped", "plain"]


def test_a_rollback_discards_the_sends_to_other_entities(server: InProcessServer, client: TxnClient) -> None:
    source, destination = queue(server), queue(server)
    client.send(source, msg("order"))
    _, delivery = client.receive(source)
    txn = client.declare()
    client.settle(delivery, txn)
    assert client.send(destination, msg("never"), txn).state == TRANSACTIONAL_STATE
    assert client.discharge(txn, fail=True).state == proton.Delivery.ACCEPTED
    assert bodies(server, destination) == [] and bodies(server, source) == ["order"]  # still locked
    again = client.send(destination, msg("never", "never"))  # the rollback kept no dedup key
    assert again.state == proton.Delivery.ACCEPTED and bodies(server, destination) == ["never"]


def test_a_receiver_on_another_top_level_entity_is_refused(server: InProcessServer, client: TxnClient) -> None:
    source, destination = queue(server), queue(server)
    client.send(source, msg("order"))
    client.send(destination, msg("elsewhere"))
    with pytest.raises(Exception, match="not-allowed") as refused:
        client.receive(destination, timeout=2)
    assert "cannot span multiple top-level entities" in str(refused.value)
    message, _ = client.receive(source)  # the send-via entity itself: allowed
    assert message.body == "order"


def test_a_subscription_makes_its_topic_the_send_via_entity(server: InProcessServer, client: TxnClient) -> None:
    topic, subscription = topic_with_subscription(server)
    destination = queue(server)
    client.send(topic, msg("event"))  # the topic: the send-via entity
    _, delivery = client.receive(subscription)  # a subscription of that topic: the same top-level entity
    txn = client.declare()
    client.settle(delivery, txn)
    assert client.send(destination, msg("handled"), txn).state == TRANSACTIONAL_STATE
    assert client.discharge(txn).state == proton.Delivery.ACCEPTED
    assert bodies(server, destination) == ["handled"]


def test_without_a_coordinator_first_a_transaction_stays_on_one_entity(server: InProcessServer) -> None:
    """The same links on a session whose first link is not a coordinator: no send-via is inferred (as
    test_transactions.py's test_a_transaction_is_on_one_entity)."""
    plain = TxnClient(server.port)  # $cbs first, then the coordinator
    try:
        first, second = queue(server), queue(server)
        txn = plain.declare()
        plain.send(first, msg("here"), txn)
        other = plain.send(second, msg("there"), txn)
        assert other.state == REJECTED_STATE and other.condition == "amqp:not-allowed", other
        assert plain.discharge(txn).state == proton.Delivery.ACCEPTED
        assert (count(server, first), count(server, second)) == (1, 0)
    finally:
        plain.close()


def test_the_token_must_cover_the_destination_as_for_send_via(server: InProcessServer) -> None:
    source, destination = queue(server), queue(server)
    scoped = TxnClient(server.port, scope=source, cross_entity=True)  # a token for the send-via entity only
    try:
        assert scoped.send(source, msg("mine")).state == proton.Delivery.ACCEPTED
        with pytest.raises(Exception, match="unauthorized"):
            scoped.send(destination, msg("theirs"))
    finally:
        scoped.close()
    assert (count(server, source), count(server, destination)) == (1, 0)


def test_a_refused_first_link_sets_no_send_via_entity(server: InProcessServer, client: TxnClient) -> None:
    source = queue(server)
    with pytest.raises(Exception, match="not-found"):
        client.receive("no-such-queue", timeout=2)
    assert client.send(source, msg("first")).state == proton.Delivery.ACCEPTED  # the send-via entity now
    message, _ = client.receive(source)
    assert message.body == "first"


def _connection(server: InProcessServer) -> AmqpConnection:
    async def only() -> AmqpConnection:
        assert server.server is not None
        (conn,) = server.server.connections
        return conn

    result: AmqpConnection = server.run(only)
    return result


def _scopes(server: InProcessServer, conn: AmqpConnection) -> dict[int, object]:
    async def read() -> dict[int, object]:
        return dict(conn.scopes)

    result: dict[int, object] = server.run(read)
    return result


def _reply_keys(server: InProcessServer, conn: AmqpConnection) -> list[tuple[int, str]]:
    async def read() -> list[tuple[int, str]]:
        return list(conn.response_links)

    result: list[tuple[int, str]] = server.run(read)
    return result


def test_a_session_scope_does_not_outlive_its_session(server: InProcessServer) -> None:
    """Each session's cross-entity scope (set by its first link: a coordinator or an entity link) is kept under
    the session's key while the session lasts: a client that opens and ends many sessions on one connection
    leaves only its open sessions' scopes, and none once its connection is gone (nor the entries that find a
    session's reply links)."""
    name = queue(server)
    coordinator = encode_described(0x30, encode_list([]))  # amqp:coordinator:list
    source = encode_described(0x28, encode_list([]))  # amqp:source:list
    with RawClient(server.port) as raw:
        raw.handshake()
        assert raw.put_token(name) == 202  # channel 0's session: its $cbs links set its scope
        conn = _connection(server)
        first = list(_scopes(server, conn))
        assert len(first) == 1
        replies = _reply_keys(server, conn)  # channel 0's $cbs receiver
        for round_ in range(40):
            raw.send(frame(BeginFrame(None, 0, 65536, 65536, 1023, None, None, None), channel=1))
            raw.expect(BEGIN)
            if round_ % 2:  # a cross-entity session: the coordinator first, then a sender through it
                fields = [encode_string(f"coordinator-{round_}"), encode_uint(0), FALSE, NULL, NULL, source]
                raw.send(amqp_frame(ATTACH, [*fields, coordinator, NULL, NULL, encode_uint(0)], channel=1))
                raw.expect(ATTACH)
            raw.send(attach_frame(f"sender-{round_}", 1, name, sender=True, channel=1))
            raw.expect(ATTACH)
            raw.send(attach_frame(f"replies-{round_}", 2, "$cbs", sender=False, channel=1))  # a reply link
            raw.expect(ATTACH)
            assert len(_scopes(server, conn)) == 2, round_
            assert len(_reply_keys(server, conn)) == len(replies) + 1, round_
            raw.send(amqp_frame(END, [], channel=1))
            raw.expect(END)
        assert list(_scopes(server, conn)) == first  # channel 0's session is still open
        assert _reply_keys(server, conn) == replies
    # the client drops the connection (no end, no close): the scopes go with it
    deadline = time.monotonic() + 10
    while not server.run(_closed(conn)) and time.monotonic() < deadline:  # (the server reads the end of stream)
        time.sleep(0.01)
    assert _scopes(server, conn) == {}


def _closed(conn: AmqpConnection) -> Callable[[], Coroutine[Any, Any, bool]]:
    async def closed() -> bool:
        return conn.closed

    return closed
