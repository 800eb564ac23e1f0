"""The transaction coordinator (AMQP 1.0 section 4): a client's sender link whose target is a coordinator.

The client sends ``declare`` (answered ``declared`` with a transaction id) and ``discharge``
(answered ``accepted`` once a commit is durable, or once a rollback is done; ``rejected`` with
``amqp:transaction:*`` when it cannot be). The work itself arrives on the entity links with a
``transactional-state`` (``SendLink``, ``ReceiveLink``) and is held by the broker's
``Transactions`` until the discharge.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import proton

from oncebus.amqp import engine, faulting
from oncebus.amqp.errors import TRACKING_ID, condition_of
from oncebus.amqp.links import read_payload, too_large
from oncebus.core.errors import InvalidArgumentError

if TYPE_CHECKING:
    from oncebus.amqp.connection import AmqpConnection
    from oncebus.broker import Broker

DECLARE = (proton.symbol("amqp:declare:list"), 0x31)
DISCHARGE = (proton.symbol("amqp:discharge:list"), 0x32)
DECLARED = 0x33
COORDINATOR_CREDIT = 16
COORDINATOR_MESSAGE_SIZE = 64 * 1024


def reject(delivery: engine.Delivery, error: BaseException) -> None:
    delivery.local.condition = condition_of(error)
    delivery.update(engine.REJECTED)
    delivery.settle()


class CoordinatorLink:
    """The client's link to the coordinator: declares and discharges transactions on this connection."""

    def __init__(self, conn: AmqpConnection, link: engine.Link) -> None:
        self.conn = conn
        self.link = link
        self.closed = False

    @property
    def namespace(self) -> Broker:
        """The connection's namespace (bound by its first CBS token, whenever that came)."""
        return self.conn.namespace

    def open(self) -> None:
        link = self.link
        link.target.copy(link.remote_target)
        link.source.copy(link.remote_source)
        link.rcv_settle_mode = engine.RCV_FIRST
        link.max_message_size = COORDINATOR_MESSAGE_SIZE
        self.conn.serve(link, self)
        link.open()
        link.flow(COORDINATOR_CREDIT)

    def covered_path(self) -> str | None:
        return None

    def on_flow(self) -> None:
        pass

    def refuse_partial(self, delivery: engine.Delivery, size: int, limit: int) -> None:
        delivery.notes.refused = True
        reject(delivery, too_large(size, limit))
        self.conn.pump()

    def on_delivery(self, delivery: engine.Delivery) -> None:
        if delivery.partial or delivery.notes.refused:
            return
        payload = read_payload(self.link, delivery)
        if delivery.aborted:
            delivery.settle()
            return
        if self.link.credit < COORDINATOR_CREDIT // 2:
            self.link.flow(COORDINATOR_CREDIT - self.link.credit)
        try:
            request = proton.Message()
            request.decode(payload)
            body = request.body
            if not isinstance(body, proton.Described):
                raise InvalidArgumentError("a coordinator message's body is a declare or a discharge")
            descriptor = body.descriptor
            fields = list(body.value) if isinstance(body.value, list) else []
        except Exception as exc:
            reject(delivery, exc if isinstance(exc, InvalidArgumentError) else InvalidArgumentError(str(exc)))
            return
        if descriptor in DECLARE:
            try:
                declared = self.namespace.transactions.declare(self.conn)
            except Exception as exc:  # too many open on this connection
                reject(delivery, exc)
                return
            delivery.local.data = [declared]
            delivery.update(DECLARED)
            delivery.settle()
            return
        if descriptor in DISCHARGE:
            txn_id = fields[0] if fields else None
            if isinstance(txn_id, (bytearray, memoryview)):  # a view into the decoded request's buffer: copy it now
                txn_id = bytes(txn_id)
            fail = bool(fields[1]) if len(fields) > 1 else False
            self.conn.spawn(self._discharge(delivery, txn_id, fail))
            return
        reject(
            delivery,
            InvalidArgumentError(f"the coordinator takes declare (0x31) and discharge (0x32), not {descriptor!r}"),
        )

    async def _discharge(self, delivery: engine.Delivery, txn_id: Any, fail: bool) -> None:
        error: BaseException | None = None
        try:
            if not isinstance(txn_id, (bytes, bytearray, memoryview)):
                raise InvalidArgumentError(f"a discharge names the transaction's txn-id (binary), not {txn_id!r}")
            entity = await self.namespace.transactions.discharge(bytes(txn_id), self.conn, fail)
            # a committed discharge is acknowledged as a send is: the lost-ack and slow-ack faults apply
            if entity is not None and self.namespace.faults.armed:
                if await faulting.after_send(self.conn, self.link, self.namespace, entity):
                    return  # the acknowledgement is lost (the transaction is stored)
        except Exception as exc:
            error = exc
        if self.conn.closed:
            return
        if error is None:
            delivery.update(engine.ACCEPTED)
            delivery.settle()
        else:
            condition = condition_of(error)
            if condition.info is None:
                condition.info = {TRACKING_ID: str(uuid.uuid4())}
            delivery.local.condition = condition
            delivery.update(engine.REJECTED)
            delivery.settle()
        self.conn.pump()

    def on_closed(self) -> None:
        self.closed = True
        self.namespace.transactions.release(self.conn)
