"""A blocking python-qpid-proton client that speaks AMQP transactions (the coordinator, declare, discharge,
transactional sends and settlements) and send-via, as the .NET and Java SDKs do against Service Bus.

Built on ``proton.utils.BlockingConnection`` with proton's own transaction encodings (``proton.reactor``'s
``Transaction`` sends the same declare/discharge bodies and ``transactional-state`` dispositions).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import proton
from proton.reactor import LinkOption
from proton.utils import BlockingConnection, BlockingReceiver, BlockingSender

from oncebus.amqp.sas import DEFAULT_KEY, DEFAULT_KEY_NAME, make_token

DECLARE = proton.symbol("amqp:declare:list")
DISCHARGE = proton.symbol("amqp:discharge:list")
TRANSACTIONAL_STATE = 0x34
DECLARED = 0x33
ACCEPTED, REJECTED, RELEASED, MODIFIED = 0x24, 0x25, 0x26, 0x27
TRANSFER_DESTINATION = proton.symbol("com.microsoft:transfer-destination-address")


class Coordinator(LinkOption):
    def apply(self, link: proton.Link) -> None:
        link.target.type = proton.Terminus.COORDINATOR
        link.target.capabilities.put_object(proton.symbol("amqp:local-transactions"))


class SendVia(LinkOption):
    def __init__(self, destination: str) -> None:
        self.destination = destination

    def apply(self, link: proton.Link) -> None:
        link.properties = {TRANSFER_DESTINATION: self.destination}


class PeekLock(LinkOption):
    def apply(self, link: proton.Link) -> None:
        link.snd_settle_mode = proton.Link.SND_UNSETTLED
        link.rcv_settle_mode = proton.Link.RCV_SECOND


class Outcome:
    """What the broker answered a delivery: its state, the data (txn-id, ...) and the error, if any."""

    def __init__(self, delivery: proton.Delivery) -> None:
        self.state = delivery.remote_state
        data = delivery.remote.data  # views into proton's buffers, freed with the delivery: copied now
        self.data = None if data is None else [bytes(v) if isinstance(v, memoryview) else v for v in data]
        condition = delivery.remote.condition
        self.condition = None if condition is None else condition.name
        self.description = None if condition is None else condition.description

    def __repr__(self) -> str:
        return f"Outcome({self.state!r}, {self.data!r}, {self.condition!r}, {self.description!r})"


class TxnClient:
    """One AMQP connection with a coordinator link; every call blocks until the broker answered."""

    def __init__(
        self, port: int, host: str = "localhost", timeout: float = 10.0, scope: str = "", *, cross_entity: bool = False
    ) -> None:
        """``scope``: the entity the connection's token covers (all of the namespace by default). Every link is on
        the connection's one session; ``cross_entity``: the coordinator is that session's first link, then $cbs, as
        the Java SDK's ``enableCrossEntityTransactions`` lays them out (the .NET SDK's ``EnableCrossEntityTransactions``
        also opens its controller first on its single session)."""
        self.host = host
        self.scope = scope
        self.conn = BlockingConnection(
            f"amqp://127.0.0.1:{port}",
            timeout=timeout,
            sasl_enabled=True,
            allowed_mechs="ANONYMOUS",
            virtual_host=host,
        )
        if cross_entity:
            self.coordinator = self.conn.create_sender(None, options=Coordinator())
            self._put_token()
        else:
            self._put_token()
            self.coordinator = self.conn.create_sender(None, options=Coordinator())
        self.senders: dict[tuple[str, str | None], BlockingSender] = {}
        self.receivers: dict[str, BlockingReceiver] = {}

    def _put_token(self) -> None:
        reply = "cbs-reply-" + uuid.uuid4().hex
        requests = self.conn.create_sender("$cbs")
        responses = self.conn.create_receiver("$cbs", options=_Target(reply))
        audience = f"sb://{self.host}/{self.scope}"
        token = make_token(audience, DEFAULT_KEY_NAME, DEFAULT_KEY, int(time.time()) + 3600)
        request = proton.Message(
            body=token,
            reply_to=reply,
            id=uuid.uuid4().hex,
            properties={"operation": "put-token", "type": "servicebus.windows.net:sastoken", "name": audience},
        )
        requests.send(request)
        response = responses.receive(timeout=10)

        status = (response.properties or {}).get("status-code")
        assert status in (200, 202), response.properties

    def _wait(self, delivery: proton.Delivery) -> Outcome:
        self.conn.wait(lambda: delivery.settled or delivery.remote_state != 0, msg="waiting for the broker's answer")
        outcome = Outcome(delivery)
        delivery.settle()
        return outcome

    # ------------------------------------------------------------------------------ the coordinator
    def declare(self) -> bytes:
        delivery = self.coordinator.link.send(proton.Message(body=proton.Described(DECLARE, [None])))
        outcome = self._wait(delivery)
        assert outcome.state == DECLARED, outcome
        assert outcome.data and isinstance(outcome.data[0], (bytes, memoryview)), outcome
        return bytes(outcome.data[0])

    def discharge(self, txn_id: Any, fail: bool = False) -> Outcome:
        delivery = self.coordinator.link.send(proton.Message(body=proton.Described(DISCHARGE, [txn_id, fail])))
        return self._wait(delivery)

    # ------------------------------------------------------------------------------ work
    def sender(self, address: str, via: str | None = None) -> BlockingSender:
        key = (address, via)
        if key not in self.senders:
            self.senders[key] = self.conn.create_sender(
                address, name=uuid.uuid4().hex, options=SendVia(via) if via else None
            )
        return self.senders[key]

    def send(
        self, address: str, message: proton.Message, txn_id: bytes | None = None, via: str | None = None
    ) -> Outcome:
        """Send ``message`` to ``address`` (through it to ``via``'s destination with send-via), in ``txn_id``."""
        delivery = self.sender(address, via).link.send(message)
        if txn_id is not None:
            delivery.local.data = [txn_id]
            delivery.update(TRANSACTIONAL_STATE)
        return self._wait(delivery)

    def receive(self, address: str, timeout: float = 5.0) -> tuple[proton.Message, proton.Delivery]:
        """One message, peek-locked; its delivery is for ``settle``."""
        if address not in self.receivers:
            self.receivers[address] = self.conn.create_receiver(
                address, credit=0, name=uuid.uuid4().hex, options=PeekLock()
            )
        receiver = self.receivers[address]
        receiver.link.flow(1)
        fetcher = receiver.fetcher
        assert fetcher is not None
        self.conn.wait(lambda: fetcher.has_message, timeout=timeout, msg=f"receiving from {address}")
        message, delivery = fetcher.incoming.popleft()
        return message, delivery

    def settle(
        self, delivery: proton.Delivery, txn_id: bytes | None, outcome: int = ACCEPTED, fields: list[Any] | None = None
    ) -> Outcome:
        """Settle a received message (complete by default) in ``txn_id``; waits for the broker's answer."""
        if txn_id is None:
            delivery.update(outcome)
        else:
            delivery.local.data = [txn_id, proton.Described(proton.ulong(outcome), fields or [])]
            delivery.update(TRANSACTIONAL_STATE)
        self.conn.wait(lambda: delivery.remote_state != 0 or delivery.settled, msg="waiting for the settlement")
        result = Outcome(delivery)
        delivery.settle()
        return result

    def discharge_unanswered(self, txn_id: bytes, pump_seconds: float = 0.05) -> proton.Delivery:
        """Send a commit and run the connection for ``pump_seconds`` (it is written out) without waiting for the
        answer (the broker may be about to be killed)."""
        delivery = self.coordinator.link.send(proton.Message(body=proton.Described(DISCHARGE, [txn_id, False])))
        try:
            self.conn.wait(lambda: delivery.remote_state != 0, timeout=pump_seconds, msg="pumping")
        except proton.Timeout:
            pass
        return delivery

    def close(self, timeout: float | None = None) -> None:
        """Close the connection (``timeout``: at most that long, e.g. when the broker was killed)."""
        if timeout is not None:
            self.conn.timeout = timeout
        try:
            self.conn.close()
        except Exception:
            pass


class _Target(LinkOption):
    def __init__(self, address: str) -> None:
        self.address = address

    def apply(self, link: proton.Link) -> None:
        link.target.address = self.address
