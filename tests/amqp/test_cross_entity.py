"""Cross-entity transactions as the Java SDK's ``enableCrossEntityTransactions`` and the .NET SDK's
``EnableCrossEntityTransactions`` do them: every link on one AMQP session whose first link is a coordinator, and
no ``com.microsoft:transfer-destination-address``. Service Bus infers the send-via entity: the first entity a link
is attached to on that session (a subscription's topic); sends to other entities on the session go through it, and
a receiver on another top-level entity is refused (amqp:not-allowed). python-qpid-proton's client puts every link
on one session, so it lays the links out as the Java SDK does (tests/java runs the SDK itself)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import proton
import pytest

from oncebus.amqp.limits import AmqpLimits
from tests.amqp.inprocess import InProcessServer
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
