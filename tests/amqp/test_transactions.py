"""AMQP transactions and send-via, with python-qpid-proton's client (the .NET and Java SDKs' ``TransactionScope``
and ``ServiceBusTransactionContext`` do the same on the wire): declare, transactional sends and settlements,
discharge; all of a transaction or nothing of it."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Iterator
from typing import Any

import proton
import pytest
from proton.handlers import MessagingHandler, TransactionHandler
from proton.reactor import Container, Filter, LinkOption

from oncebus.amqp.limits import AmqpLimits
from oncebus.amqp.sas import DEFAULT_KEY, DEFAULT_KEY_NAME, make_token
from oncebus.broker import Namespace
from oncebus.core.messages import MessageState, ServiceBusReceiveMode
from tests.amqp.inprocess import InProcessServer
from tests.amqp.txn_client import ACCEPTED, DECLARED, RELEASED, TRANSACTIONAL_STATE, PeekLock, TxnClient, _Target

REJECTED_STATE = proton.Delivery.REJECTED
MAX_OPERATIONS = 100  # Azure Service Bus's quotas for one transaction
TIMEOUT_SECONDS = 120
_names = itertools.count()


@pytest.fixture(scope="module")
def server() -> Iterator[InProcessServer]:
    srv = InProcessServer(AmqpLimits(), []).start()
    yield srv
    srv.stop()


@pytest.fixture
def client(server: InProcessServer) -> Iterator[TxnClient]:
    c = TxnClient(server.port)
    yield c
    c.close()


def ns(server: InProcessServer) -> Namespace:
    assert server.namespace is not None
    return server.namespace


def queue(server: InProcessServer, **properties: Any) -> str:
    name = f"q{next(_names)}"

    async def create() -> None:
        await ns(server).create_queue(name, **properties)

    server.run(create)
    return name


def count(server: InProcessServer, name: str) -> int:
    async def active() -> int:
        return ns(server).stats(name).active_message_count

    return int(server.run(active))


def bodies(server: InProcessServer, name: str) -> list[Any]:
    async def peek() -> list[Any]:
        return [bytes(m.body).decode() for m in ns(server).peek_messages(name, 250)]

    return list(server.run(peek))


def msg(body: str, message_id: str | None = None) -> proton.Message:
    return proton.Message(body=body, id=message_id if message_id is not None else body)


def test_a_commit_makes_every_send_visible_at_once(server: InProcessServer, client: TxnClient) -> None:
    name = queue(server)
    txn = client.declare()
    for body in ("one", "two", "three"):
        answer = client.send(name, msg(body), txn)
        assert answer.state == TRANSACTIONAL_STATE and bytes(answer.data[0]) == txn, answer
    assert count(server, name) == 0  # held by the transaction: not stored, not receivable
    assert client.discharge(txn).state == proton.Delivery.ACCEPTED
    assert bodies(server, name) == ["one", "two", "three"]


def test_a_rollback_stores_nothing_and_keeps_no_dedup_key(server: InProcessServer, client: TxnClient) -> None:
    name = queue(server, requires_duplicate_detection=True)
    txn = client.declare()
    client.send(name, msg("first", "same-id"), txn)
    assert client.discharge(txn, fail=True).state == proton.Delivery.ACCEPTED
    assert count(server, name) == 0
    answer = client.send(name, msg("again", "same-id"))  # not a duplicate: the rolled-back send left no key
    assert answer.state == proton.Delivery.ACCEPTED
    assert bodies(server, name) == ["again"]


def test_complete_in_a_rolled_back_transaction_leaves_the_message_locked(
    server: InProcessServer, client: TxnClient
) -> None:
    name = queue(server, lock_duration="PT30S")
    client.send(name, msg("kept"))
    _, delivery = client.receive(name)
    txn = client.declare()
    answer = client.settle(delivery, txn)
    assert answer.state == TRANSACTIONAL_STATE, answer
    assert client.discharge(txn, fail=True).state == proton.Delivery.ACCEPTED
    assert count(server, name) == 1  # still there, still locked by its receiver

    other = TxnClient(server.port)
    try:
        with pytest.raises(Exception, match="timed out"):
            other.receive(name, timeout=0.5)  # locked: nothing to receive until the lock expires
        server.run(_advance(ns(server), 31))
        again, _ = other.receive(name)
        assert again.body == "kept" and again.delivery_count == 1
    finally:
        other.close()


def test_complete_in_a_committed_transaction_removes_the_message(server: InProcessServer, client: TxnClient) -> None:
    name = queue(server)
    client.send(name, msg("done"))
    client.send(name, msg("back"))
    _, first = client.receive(name)
    _, second = client.receive(name)
    txn = client.declare()
    assert client.settle(first, txn).state == TRANSACTIONAL_STATE
    assert client.settle(second, txn, RELEASED).state == TRANSACTIONAL_STATE  # abandon, in the transaction
    assert count(server, name) == 2
    assert client.discharge(txn).state == proton.Delivery.ACCEPTED
    assert bodies(server, name) == ["back"]  # completed one gone, abandoned one available again
    again, _ = client.receive(name)
    assert again.body == "back"


def test_a_duplicate_inside_a_transaction_is_judged_when_it_commits(server: InProcessServer, client: TxnClient) -> None:
    name = queue(server, requires_duplicate_detection=True)
    client.send(name, msg("stored", "old"))
    txn = client.declare()
    client.send(name, msg("first", "new"), txn)
    client.send(name, msg("second", "new"), txn)  # a duplicate of the first, in the same transaction
    client.send(name, msg("resend", "old"), txn)  # a duplicate of what is stored already
    assert client.discharge(txn).state == proton.Delivery.ACCEPTED
    assert bodies(server, name) == ["stored", "first"]


def test_a_transaction_holds_at_most_100_messages(server: InProcessServer, client: TxnClient) -> None:
    name = queue(server)
    txn = client.declare()
    for n in range(MAX_OPERATIONS):
        assert client.send(name, msg(f"m{n}"), txn).state == TRANSACTIONAL_STATE
    over = client.send(name, msg("one too many"), txn)
    assert over.state == REJECTED_STATE and over.condition == "amqp:resource-limit-exceeded", over
    assert "100 messages per transaction" in (over.description or "")
    assert client.discharge(txn).state == proton.Delivery.ACCEPTED
    assert count(server, name) == MAX_OPERATIONS


def _advance(namespace: Namespace, seconds: float) -> Any:
    async def advance() -> None:
        namespace.clock.advance(seconds)  # type: ignore[attr-defined]  # the in-process server's ManualClock

    return advance


def test_a_transaction_times_out_after_two_minutes(server: InProcessServer, client: TxnClient) -> None:
    name = queue(server)
    txn = client.declare()
    client.send(name, msg("late"), txn)
    server.run(_advance(ns(server), TIMEOUT_SECONDS + 1))
    late = client.send(name, msg("later"), txn)
    assert late.state == REJECTED_STATE and late.condition == "amqp:transaction:timeout", late
    answer = client.discharge(txn)
    assert answer.state == REJECTED_STATE and answer.condition == "amqp:transaction:timeout", answer
    assert count(server, name) == 0


def test_an_unknown_txn_id_is_refused(server: InProcessServer, client: TxnClient) -> None:
    name = queue(server)
    answer = client.discharge(b"never-declared")
    assert answer.state == REJECTED_STATE and answer.condition == "amqp:transaction:unknown-id", answer
    sent = client.send(name, msg("orphan"), b"never-declared")
    assert sent.state == REJECTED_STATE and sent.condition == "amqp:transaction:unknown-id", sent
    txn = client.declare()
    assert client.discharge(txn).state == proton.Delivery.ACCEPTED
    again = client.discharge(txn)  # discharged already
    assert again.condition == "amqp:transaction:unknown-id", again
    assert count(server, name) == 0


def test_a_transaction_is_on_one_entity(server: InProcessServer, client: TxnClient) -> None:
    first, second = queue(server), queue(server)
    txn = client.declare()
    client.send(first, msg("here"), txn)
    other = client.send(second, msg("there"), txn)
    assert other.state == REJECTED_STATE and other.condition == "amqp:not-allowed", other
    assert "send-via" in (other.description or "")
    assert client.discharge(txn).state == proton.Delivery.ACCEPTED
    assert (count(server, first), count(server, second)) == (1, 0)


def test_send_via_sends_to_the_destination_through_the_via_entity(server: InProcessServer, client: TxnClient) -> None:
    via, destination = queue(server), queue(server)
    client.send(via, msg("input"))
    _, delivery = client.receive(via)
    txn = client.declare()
    assert client.settle(delivery, txn).state == TRANSACTIONAL_STATE  # receive from via ...
    assert client.send(via, msg("output"), txn, via=destination).state == TRANSACTIONAL_STATE  # ... send on
    assert (count(server, via), count(server, destination)) == (1, 0)
    assert client.discharge(txn).state == proton.Delivery.ACCEPTED
    assert bodies(server, via) == []
    assert bodies(server, destination) == ["output"]
    plain = client.send(via, msg("not in a transaction"), via=destination)  # stored in the destination too
    assert plain.state == proton.Delivery.ACCEPTED
    assert bodies(server, via) == [] and bodies(server, destination) == ["output", "not in a transaction"]


def test_send_via_to_a_missing_destination_is_refused(server: InProcessServer, client: TxnClient) -> None:
    via = queue(server)
    with pytest.raises(Exception, match=r"not-found|no-such|does not exist|not found"):
        client.send(via, msg("lost"), via="no-such-queue")
    assert count(server, via) == 0


def test_send_via_needs_a_token_that_covers_the_destination_too(server: InProcessServer) -> None:
    via, destination = queue(server), queue(server)
    scoped = TxnClient(server.port, scope=via)  # a token for the via entity only
    try:
        assert scoped.send(via, msg("mine")).state == proton.Delivery.ACCEPTED
        with pytest.raises(Exception, match="unauthorized"):
            scoped.send(via, msg("theirs"), via=destination)
    finally:
        scoped.close()
    assert (count(server, via), count(server, destination)) == (1, 0)


def test_closing_the_connection_rolls_the_transaction_back(server: InProcessServer) -> None:
    name = queue(server)
    client = TxnClient(server.port)
    txn = client.declare()
    client.send(name, msg("gone"), txn)
    client.close()

    async def none_open() -> int:
        return len(ns(server).transactions.open)

    assert server.run(none_open) == 0
    assert count(server, name) == 0


def test_a_lock_lost_before_the_commit_rolls_it_all_back(server: InProcessServer, client: TxnClient) -> None:
    name, out = queue(server, lock_duration="PT5S"), queue(server)
    client.send(name, msg("in"))
    _, delivery = client.receive(name)
    txn = client.declare()
    client.settle(delivery, txn)
    client.send(name, msg("out"), txn, via=out)
    server.run(_advance(ns(server), 6))  # the lock expires before the discharge
    answer = client.discharge(txn)
    assert answer.state == REJECTED_STATE and answer.condition == "amqp:transaction:rollback", answer
    assert "lock" in (answer.description or "")
    assert count(server, out) == 0 and count(server, name) == 1


def test_declared_carries_a_binary_txn_id(client: TxnClient) -> None:
    txn = client.declare()
    assert isinstance(txn, bytes) and len(txn) > 0
    assert DECLARED == 0x33 and ACCEPTED == 0x24


def test_a_commit_past_the_entity_quota_stores_nothing_and_the_broker_keeps_serving(
    server: InProcessServer, client: TxnClient
) -> None:
    name = queue(server, max_size_in_megabytes=1)
    txn = client.declare()
    for n in range(5):  # 5 x 240 KB: each fits on its own, together they pass the queue's 1 MB
        assert client.send(name, proton.Message(body=b"x" * 240_000, id=f"big{n}"), txn).state == TRANSACTIONAL_STATE
    answer = client.discharge(txn)
    assert answer.state == REJECTED_STATE and answer.condition == "amqp:transaction:rollback", answer
    assert "maximum entity size" in (answer.description or "")
    assert count(server, name) == 0
    assert client.send(name, msg("after")).state == proton.Delivery.ACCEPTED  # no reload, no refusal
    assert bodies(server, name) == ["after"]


def test_dead_lettering_a_dead_letter_in_a_transaction_is_refused_when_it_arrives(
    server: InProcessServer, client: TxnClient
) -> None:
    name = queue(server)
    client.send(name, msg("poison"))
    _, delivery = client.receive(name)
    client.settle(delivery, None, REJECTED_STATE)  # dead-lettered, not in a transaction
    _, dead = client.receive(f"{name}/$deadletterqueue")
    txn = client.declare()
    answer = client.settle(dead, txn, REJECTED_STATE)
    assert answer.state == REJECTED_STATE and "dead-lettered again" in (answer.description or ""), answer
    assert client.discharge(txn).state == proton.Delivery.ACCEPTED


class _ReplyTo(LinkOption):  # type: ignore[misc]
    def __init__(self, address: str) -> None:
        self.address = address

    def apply(self, link: proton.Link) -> None:
        link.target.address = self.address


class _ProtonTransactions(MessagingHandler, TransactionHandler):  # type: ignore[misc]
    """python-qpid-proton's own transaction API (``Container.declare_transaction``): put a token on $cbs, declare,
    send three messages in the transaction, commit."""

    def __init__(self, port: int, address: str) -> None:
        super().__init__(auto_settle=False)
        self.port = port
        self.address = address
        self.sent = 0
        self.settled = 0
        self.committed = False
        self.txn: Any = None
        self.sender: Any = None

    def on_start(self, event: Any) -> None:
        self.container = event.container
        self.deadline = event.container.schedule(10, self)  # whatever happens, the run ends
        self.conn = event.container.connect(
            f"amqp://127.0.0.1:{self.port}", sasl_enabled=True, allowed_mechs="ANONYMOUS", virtual_host="localhost"
        )
        self.cbs = event.container.create_sender(self.conn, "$cbs")
        self.cbs_replies = event.container.create_receiver(
            self.conn, "$cbs", name="cbs-replies", options=_ReplyTo("cbs-replies")
        )

    def on_link_opened(self, event: Any) -> None:
        if event.link.name == "cbs-replies":  # where the answer goes is open: ask
            audience = "sb://localhost/"
            token = make_token(audience, DEFAULT_KEY_NAME, DEFAULT_KEY, int(time.time()) + 3600)
            properties = {"operation": "put-token", "type": "servicebus.windows.net:sastoken", "name": audience}
            self.cbs.send(proton.Message(body=token, id="put", reply_to="cbs-replies", properties=properties))

    def on_message(self, event: Any) -> None:
        event.delivery.settle()
        if event.link.name == "cbs-replies" and self.txn is None:  # the token is on: attach, declare
            self.sender = self.container.create_sender(self.conn, self.address)
            self.txn = self.container.declare_transaction(self.conn, handler=self)

    def on_transaction_declared(self, event: Any) -> None:
        for n in range(3):
            self.txn.send(self.sender, proton.Message(body=f"proton{n}", id=f"proton{n}"))
            self.sent += 1

    def on_settled(self, event: Any) -> None:
        if self.sender is not None and event.link.name == self.sender.name:
            self.settled += 1
            if self.settled == self.sent:
                self.txn.commit()

    def on_timer_task(self, event: Any) -> None:
        self.conn.close()

    def on_link_error(self, event: Any) -> None:
        self.conn.close()

    def on_transaction_committed(self, event: Any) -> None:
        self.committed = True
        self.deadline.cancel()
        event.connection.close()

    def on_transaction_declare_failed(self, event: Any) -> None:
        self.conn.close()

    def on_transaction_commit_failed(self, event: Any) -> None:
        self.conn.close()


def test_python_qpid_protons_own_transaction_api_commits(server: InProcessServer) -> None:
    name = queue(server)
    handler = _ProtonTransactions(server.port, name)
    container = Container(handler)
    container.timeout = 10
    container.run()
    assert handler.committed
    assert bodies(server, name) == ["proton0", "proton1", "proton2"]


def test_dead_letter_and_defer_in_a_transaction_as_outside_one(server: InProcessServer, client: TxnClient) -> None:
    name = queue(server)
    client.send(name, msg("poison"))
    client.send(name, msg("later"))
    _, poison = client.receive(name)
    _, later = client.receive(name)
    txn = client.declare()
    error = proton.Described(
        proton.symbol("amqp:error:list"),
        [
            proton.symbol("com.microsoft:dead-letter"),
            None,
            {"DeadLetterReason": "bad", "DeadLetterErrorDescription": "why"},
        ],
    )
    assert client.settle(poison, txn, REJECTED_STATE, [error]).state == TRANSACTIONAL_STATE
    assert client.settle(later, txn, proton.Delivery.MODIFIED, [True, True, None]).state == TRANSACTIONAL_STATE
    assert client.discharge(txn).state == proton.Delivery.ACCEPTED

    async def states() -> tuple[Any, ...]:
        namespace = ns(server)
        (dead,) = namespace.peek_messages(f"{name}/$deadletterqueue")
        stats = namespace.stats(name)
        return dead.dead_letter_reason, dead.dead_letter_error_description, stats.deferred_message_count

    assert server.run(states) == ("bad", "why", 1)


def test_a_declare_past_the_connections_open_transactions_is_refused(server: InProcessServer) -> None:
    async def bound(limit: int) -> None:
        ns(server).transactions.max_open_per_connection = limit

    server.run(lambda: bound(2))
    client = TxnClient(server.port)
    try:
        client.declare()
        client.declare()
        delivery = client.coordinator.link.send(
            proton.Message(body=proton.Described(proton.symbol("amqp:declare:list"), [None]))
        )
        client.conn.wait(lambda: delivery.remote_state != 0, timeout=5)
        refused = delivery.remote.condition
        assert delivery.remote_state == REJECTED_STATE and refused is not None
        assert refused.name == "amqp:resource-limit-exceeded" and "2 open transactions" in refused.description
    finally:
        server.run(lambda: bound(1000))
        client.close()


def test_numeric_descriptors_as_the_dotnet_client_sends_them(server: InProcessServer, client: TxnClient) -> None:
    name = queue(server)
    declare = client.coordinator.link.send(proton.Message(body=proton.Described(proton.ulong(0x31), [None])))
    client.conn.wait(lambda: declare.remote_state != 0, timeout=5)
    assert declare.remote_state == DECLARED
    txn = bytes(declare.remote.data[0])
    assert client.send(name, msg("numeric"), txn).state == TRANSACTIONAL_STATE
    client.send(name, msg("numeric"))
    _, delivery = client.receive(name)
    delivery.local.data = [txn, proton.Described(proton.symbol("amqp:accepted:list"), [])]  # a symbolic outcome
    delivery.update(TRANSACTIONAL_STATE)
    client.conn.wait(lambda: delivery.remote_state != 0, timeout=5)
    assert delivery.remote_state == TRANSACTIONAL_STATE
    discharge = client.coordinator.link.send(proton.Message(body=proton.Described(proton.ulong(0x32), [txn, False])))
    client.conn.wait(lambda: discharge.remote_state != 0, timeout=5)
    assert discharge.remote_state == proton.Delivery.ACCEPTED, discharge.remote.condition
    assert bodies(server, name) == ["numeric"]  # the plain one completed, the transactional one stored


def test_abandon_with_binary_properties_to_modify_in_a_transaction(server: InProcessServer, client: TxnClient) -> None:
    name = queue(server)
    client.send(name, msg("modify me"))
    _, delivery = client.receive(name)
    txn = client.declare()
    annotations = {proton.symbol("note"): b"\x01\x02\x03" * 20}
    outcome = client.settle(delivery, txn, proton.Delivery.MODIFIED, [True, False, annotations])
    assert outcome.state == TRANSACTIONAL_STATE
    for _ in range(3):  # the disposition's buffers are reused meanwhile
        client.send(name, msg("noise"))
    assert client.discharge(txn).state == proton.Delivery.ACCEPTED

    async def note() -> Any:
        (message, *_) = ns(server).peek_messages(name, 1)
        return message.application_properties

    assert server.run(note) == {"note": b"\x01\x02\x03" * 20}


def test_a_management_request_inside_a_transaction_is_refused_not_applied_outside_it(
    server: InProcessServer, client: TxnClient
) -> None:
    """The Java/.NET SDKs send ``$management`` requests with a transactional state inside a transaction: oncebus
    refuses those that change something and that it cannot run in the transaction (here a purge), saying so, rather
    than applying them at once, outside the transaction."""
    name = queue(server)
    client.send(name, msg("kept"))
    requests = client.conn.create_sender(f"{name}/$management", name="mgmt-requests")
    txn = client.declare()
    request = proton.Message(
        body={"message-count": proton.int32(10)},
        reply_to="mgmt-replies",
        id="purge",
        properties={"operation": "com.microsoft:batch-delete-messages"},
    )
    delivery = requests.link.send(request)
    delivery.local.data = [txn]
    delivery.update(TRANSACTIONAL_STATE)
    client.conn.wait(lambda: delivery.remote_state != 0, timeout=5)
    condition = delivery.remote.condition
    assert delivery.remote_state == REJECTED_STATE and condition is not None
    assert "com.microsoft:batch-delete-messages" in condition.description
    assert "inside a transaction" in condition.description
    assert client.discharge(txn).state == proton.Delivery.ACCEPTED
    assert bodies(server, name) == ["kept"]


def test_a_peek_inside_a_transaction_is_answered_as_outside(server: InProcessServer, client: TxnClient) -> None:
    """Peeks, reads and lock renewals change nothing a transaction could undo: Service Bus runs them inside one."""
    name = queue(server)
    requests = client.conn.create_sender(f"{name}/$management", name="mgmt-requests")
    replies = client.conn.create_receiver(f"{name}/$management", name="mgmt-replies", options=_Target("mgmt-replies"))
    txn = client.declare()
    request = proton.Message(
        body={"from-sequence-number": proton.ulong(0), "message-count": proton.int32(1)},
        reply_to="mgmt-replies",
        id="peek",
        properties={"operation": "com.microsoft:peek-message"},
    )
    delivery = requests.link.send(request)
    delivery.local.data = [txn]
    delivery.update(TRANSACTIONAL_STATE)
    answer = replies.receive(timeout=10)
    assert (answer.properties or {}).get("statusCode") in (200, 204), answer.properties


# ------------------------------------------------------------------------------ $management inside a transaction
class _Management:
    """Raw ``$management`` requests on one entity, each inside a transaction (or not), as the Java/.NET SDKs send them
    inside a ``TransactionScope``: the transfer's state is ``transactional-state{txn-id}``."""

    def __init__(self, client: TxnClient, name: str) -> None:
        self.requests = client.conn.create_sender(f"{name}/$management", name=f"mgmt-requests-{name}")
        self.replies = client.conn.create_receiver(
            f"{name}/$management", name=f"mgmt-replies-{name}", options=_Target(f"mgmt-replies-{name}")
        )
        self.reply_to = f"mgmt-replies-{name}"
        self.ids = itertools.count()

    def request(self, operation: str, body: dict[str, Any], txn: bytes | None) -> proton.Message:
        request = proton.Message(
            body=body,
            reply_to=self.reply_to,
            id=f"request-{next(self.ids)}",
            properties={"operation": f"com.microsoft:{operation}"},
        )
        delivery = self.requests.link.send(request)
        if txn is not None:
            delivery.local.data = [txn]
            delivery.update(TRANSACTIONAL_STATE)
        answer: proton.Message = self.replies.receive(timeout=10)
        return answer


def _status(answer: proton.Message) -> Any:
    return (answer.properties or {}).get("statusCode"), (answer.properties or {}).get("statusDescription")


def _deferred(server: InProcessServer, client: TxnClient, name: str, body: str) -> Any:
    """Send ``body``, defer it, receive it again by its sequence number (peek-locked): its lock token."""
    client.send(name, msg(body))
    _, delivery = client.receive(name)
    delivery.local.failed = True
    delivery.local.undeliverable = True
    client.settle(delivery, None, proton.Delivery.MODIFIED)  # modified, undeliverable here: deferred

    async def lock() -> Any:
        namespace = ns(server)
        (deferred,) = namespace.peek_messages(name, 1)
        (locked,) = await namespace.receive_deferred_messages(
            name, [deferred.sequence_number], receive_mode=ServiceBusReceiveMode.PEEK_LOCK
        )
        return locked.lock_token

    return server.run(lock)


def _deferred_count(server: InProcessServer, name: str) -> int:
    async def deferred() -> int:
        return ns(server).stats(name).deferred_message_count

    return int(server.run(deferred))


@pytest.mark.parametrize("fail", [False, True])
def test_update_disposition_of_a_deferred_message_in_a_transaction(
    server: InProcessServer, client: TxnClient, fail: bool
) -> None:
    """Settling a deferred message by its lock token inside a transaction: completed only if the transaction commits
    (the Java/.NET SDKs' ``complete`` of a message received by sequence number, inside a ``TransactionScope``)."""
    name = queue(server, lock_duration="PT30S")
    token = _deferred(server, client, name, "deferred")
    management = _Management(client, name)
    txn = client.declare()
    answer = management.request("update-disposition", {"disposition-status": "completed", "lock-tokens": [token]}, txn)
    assert _status(answer)[0] == 200, _status(answer)
    assert _deferred_count(server, name) == 1  # held by the transaction
    assert client.discharge(txn, fail=fail).state == proton.Delivery.ACCEPTED
    assert _deferred_count(server, name) == (1 if fail else 0)
    if fail:  # still deferred and still locked by its receiver: completed outside a transaction now
        answer = management.request(
            "update-disposition", {"disposition-status": "completed", "lock-tokens": [token]}, None
        )
        assert _status(answer)[0] == 200, _status(answer)
        assert _deferred_count(server, name) == 0


def test_update_disposition_in_a_transaction_of_a_lost_lock_is_refused_at_once(
    server: InProcessServer, client: TxnClient
) -> None:
    name = queue(server)
    management = _Management(client, name)
    txn = client.declare()
    answer = management.request(
        "update-disposition", {"disposition-status": "completed", "lock-tokens": [uuid.uuid4()]}, txn
    )
    status, description = _status(answer)
    assert status == 410 and "lock" in description, (status, description)
    assert client.discharge(txn).state == proton.Delivery.ACCEPTED


def _scheduled(body: str, when_ms: int) -> bytes:
    message = proton.Message(
        body=body, id=body, annotations={proton.symbol("x-opt-scheduled-enqueue-time"): proton.timestamp(when_ms)}
    )
    return bytes(message.encode())


def _scheduled_numbers(server: InProcessServer, name: str) -> dict[int, str]:
    async def scheduled() -> dict[int, str]:
        return {
            m.sequence_number: bytes(m.body).decode()
            for m in ns(server).peek_messages(name, 250)
            if m.state == MessageState.SCHEDULED
        }

    return dict(server.run(scheduled))


@pytest.mark.parametrize("fail", [False, True])
def test_schedule_in_a_transaction(server: InProcessServer, client: TxnClient, fail: bool) -> None:
    """Scheduling inside a transaction: the response gives the sequence numbers at once (the SDK returns them); the
    messages are scheduled with those numbers if the transaction commits, and nothing is if it rolls back."""
    name = queue(server)
    client.send(name, msg("before"))
    management = _Management(client, name)
    txn = client.declare()
    when = int(time.time() * 1000) + 3_600_000
    answer = management.request(
        "schedule-message",
        {"messages": [{"message": _scheduled("s1", when), "message-id": "s1"}, {"message": _scheduled("s2", when)}]},
        txn,
    )
    assert _status(answer)[0] == 200, _status(answer)
    numbers = list(answer.body["sequence-numbers"])
    assert len(numbers) == 2 and numbers[0] < numbers[1], numbers
    assert _scheduled_numbers(server, name) == {}  # held by the transaction
    assert client.discharge(txn, fail=fail).state == proton.Delivery.ACCEPTED
    assert _scheduled_numbers(server, name) == ({} if fail else {numbers[0]: "s1", numbers[1]: "s2"})
    client.send(name, msg("after"))  # a number after the reserved ones (a rollback leaves a gap)

    async def last() -> int:
        return max(m.sequence_number for m in ns(server).peek_messages(name, 250))

    assert server.run(last) > numbers[1]


@pytest.mark.parametrize("fail", [False, True])
def test_cancel_scheduled_in_a_transaction(server: InProcessServer, client: TxnClient, fail: bool) -> None:
    """Cancelling a scheduled message inside a transaction: cancelled only if the transaction commits."""
    name = queue(server)
    management = _Management(client, name)
    when = int(time.time() * 1000) + 3_600_000
    answer = management.request("schedule-message", {"messages": [{"message": _scheduled("later", when)}]}, None)
    (number,) = list(answer.body["sequence-numbers"])
    txn = client.declare()
    answer = management.request("cancel-scheduled-message", {"sequence-numbers": [int(number)]}, txn)
    assert _status(answer)[0] == 200, _status(answer)
    assert _scheduled_numbers(server, name) == {number: "later"}  # held by the transaction
    missing = management.request("cancel-scheduled-message", {"sequence-numbers": [int(number) + 99]}, txn)
    assert _status(missing)[0] == 404, _status(missing)  # refused at once; the transaction keeps its cancel
    assert client.discharge(txn, fail=fail).state == proton.Delivery.ACCEPTED
    assert _scheduled_numbers(server, name) == ({number: "later"} if fail else {})


def _session_state(server: InProcessServer, name: str, session_id: str) -> Any:
    async def state() -> Any:
        return ns(server).receivable(name).session_states.get(session_id)

    return server.run(state)


@pytest.mark.parametrize("fail", [False, True])
def test_set_session_state_in_a_transaction(server: InProcessServer, client: TxnClient, fail: bool) -> None:
    """A session state set inside a transaction: stored only if the transaction commits."""
    name = queue(server, requires_session=True)
    client.send(name, proton.Message(body="in a session", id="s", group_id="s1"))
    client.conn.create_receiver(
        name,
        name="session-receiver",
        options=[PeekLock(), Filter({proton.symbol("com.microsoft:session-filter"): "s1"})],
    )
    management = _Management(client, name)
    txn = client.declare()
    answer = management.request("set-session-state", {"session-id": "s1", "session-state": b"step 2"}, txn)
    assert _status(answer)[0] == 200, _status(answer)
    assert _session_state(server, name, "s1") is None  # held by the transaction
    assert client.discharge(txn, fail=fail).state == proton.Delivery.ACCEPTED
    assert _session_state(server, name, "s1") == (None if fail else b"step 2")


def test_a_schedule_into_a_queue_created_again_before_the_commit_rolls_back(
    server: InProcessServer, client: TxnClient
) -> None:
    """The sequence numbers a schedule answered are the queue's that existed then: a queue deleted and created again
    before the commit has other numbers, so the transaction is rolled back rather than store messages under numbers
    the new queue will give again."""
    name = queue(server)
    management = _Management(client, name)
    txn = client.declare()
    when = int(time.time() * 1000) + 3_600_000
    answer = management.request("schedule-message", {"messages": [{"message": _scheduled("old", when)}]}, txn)
    assert _status(answer)[0] == 200, _status(answer)

    async def recreate() -> None:
        await ns(server).delete_queue(name)
        await ns(server).create_queue(name)

    server.run(recreate)
    answer = client.discharge(txn)
    assert answer.state == REJECTED_STATE and answer.condition == "amqp:transaction:rollback", answer
    assert "created again" in (answer.description or "")
    assert _scheduled_numbers(server, name) == {}


def test_a_schedule_on_a_topic_in_a_committed_transaction_waits_at_the_topic_then_fans_out(
    server: InProcessServer, client: TxnClient
) -> None:
    name = f"t{next(_names)}"

    async def topic() -> None:
        await ns(server).create_topic(name)
        await ns(server).create_subscription(name, "s")

    server.run(topic)
    management = _Management(client, name)
    txn = client.declare()
    when = server.run(_now_ms(ns(server))) + 3_600_000
    answer = management.request("schedule-message", {"messages": [{"message": _scheduled("fan", when)}]}, txn)
    (number,) = list(answer.body["sequence-numbers"])
    assert client.discharge(txn).state == proton.Delivery.ACCEPTED

    async def waiting() -> dict[int, Any]:  # a topic's scheduled messages wait at the topic until due
        holder = ns(server)._entity(name).scheduled
        assert holder is not None
        return {seq: entry.state for seq, entry in holder.messages.items()}

    assert server.run(waiting) == {number: MessageState.SCHEDULED}
    server.run(_advance(ns(server), 3601))

    async def tick() -> None:
        ns(server).tick()  # due: through the topic's rules to the subscription, with its number

    server.run(tick)
    assert _active(server, f"{name}/Subscriptions/s") == {number: "fan"}


def _now_ms(namespace: Namespace) -> Any:
    async def now() -> int:
        return namespace.clock.now_us() // 1000

    return now


def _active(server: InProcessServer, path: str) -> dict[int, str]:
    async def active() -> dict[int, str]:
        return {
            m.sequence_number: bytes(m.body).decode()
            for m in ns(server).peek_messages(path, 250)
            if m.state == MessageState.ACTIVE
        }

    return dict(server.run(active))
