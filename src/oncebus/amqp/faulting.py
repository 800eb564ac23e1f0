"""Faults armed on the namespace (``oncebus.broker.FaultBook``), applied where the AMQP adapter meets them.

The link handlers call these only while a fault is armed (``namespace.faults.armed``), so the hot path pays
one attribute test. Each function asks the book whether a fault fires on this operation and does what the
fault means on the wire: cut or close the connection, detach the link, refuse with ``server-busy``, hold an
acknowledgement or a delivery back, lose a lock.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING

import proton

from oncebus.amqp import engine
from oncebus.amqp.errors import TRACKING_ID
from oncebus.core.errors import ServerBusyError

if TYPE_CHECKING:
    from oncebus.amqp.connection import AmqpConnection
    from oncebus.broker import ArmedFault, Broker, SessionLock

CONNECTION_FORCED = "amqp:connection:forced"
LINK_DETACH_FORCED = "amqp:link:detach-forced"


def _busy(fault: ArmedFault, path: str) -> ServerBusyError:
    return ServerBusyError(
        f"The request was terminated because the entity '{path}' is being throttled. Error code : 50009. "
        f"Please wait 2 seconds and try again. (oncebus fault {fault.fault_id}: server-busy)"
    )


def _detach(conn: AmqpConnection, link: engine.Link, fault: ArmedFault) -> None:
    text = f"The link {link.name!r} is force detached. (oncebus fault {fault.fault_id}: {fault.spec.kind})"
    conn.close_link(link, proton.Condition(LINK_DETACH_FORCED, text, {TRACKING_ID: str(uuid.uuid4())}))


def before_send(conn: AmqpConnection, link: engine.Link, namespace: Broker, entity: str) -> bool:
    """Before a send is judged: True when the connection or the link is gone (nothing of the send is stored);
    raises ``ServerBusyError`` for ``server-busy`` (the send is refused with it)."""
    book = namespace.faults
    if book.fire("drop-connection", entity) is not None:
        conn.drop()
        return True
    fault = book.fire("detach-link", entity)
    if fault is not None:
        _detach(conn, link, fault)
        return True
    fault = book.fire("server-busy", entity)
    if fault is not None:
        raise _busy(fault, entity)
    return False


async def after_send(conn: AmqpConnection, link: engine.Link, namespace: Broker, entity: str) -> bool:
    """A send was committed, its acknowledgement not sent yet: True when the acknowledgement is lost (the
    connection or link gone); ``slow-ack`` holds it back first."""
    book = namespace.faults
    fault = book.fire("lost-ack", entity)
    if fault is not None:
        if fault.spec.how == "detach":
            _detach(conn, link, fault)
        elif fault.spec.how == "close":
            conn.protocol_error(CONNECTION_FORCED, f"oncebus fault {fault.fault_id}: lost-ack (connection closed)")
        else:
            conn.drop()
        return True
    fault = book.fire("slow-ack", entity)
    if fault is not None and fault.spec.seconds:
        await asyncio.sleep(fault.spec.seconds)
    return conn.closed


def settle_refused(namespace: Broker, path: str) -> ServerBusyError | None:
    """``server-busy`` on a settlement (complete, abandon, defer, dead-letter): the error to answer it with."""
    fault = namespace.faults.fire("server-busy", path)
    return None if fault is None else _busy(fault, path)


async def hold_delivery(namespace: Broker, path: str) -> None:
    """``slow-delivery``: hold messages taken for a receiver back before they are sent."""
    fault = namespace.faults.fire("slow-delivery", path)
    if fault is not None and fault.spec.seconds:
        await asyncio.sleep(fault.spec.seconds)


def delivered(
    conn: AmqpConnection,
    link: engine.Link,
    namespace: Broker,
    path: str,
    lock_token: uuid.UUID | None,
    session: SessionLock | None,
) -> None:
    """A message went out (into proton's buffers, not yet onto the socket): ``drop-connection`` cuts the
    connection (the client never gets it; a peek-locked one stays locked until its lock expires, a received-and-
    deleted one is gone), ``detach-link`` detaches the link; ``lock-lost`` loses a peek-lock, ``session-lock-lost``
    its session's lock."""
    book = namespace.faults
    if book.fire("drop-connection", path) is not None:
        conn.drop()
        return
    fault = book.fire("detach-link", path)
    if fault is not None:
        _detach(conn, link, fault)
        return
    if lock_token is None:
        return
    if session is not None and book.fire("session-lock-lost", path) is not None:
        namespace.lose_session_lock(session)
    elif book.fire("lock-lost", path) is not None:
        namespace.lose_lock(path, lock_token)
