"""Link handlers: a client's sender to an entity, its receiver from an entity, and request-response nodes.

Each handler belongs to one proton link of one :class:`AmqpConnection` and runs
its broker work as tasks on the connection's loop.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, cast

import proton

from oncebus.amqp import codec, engine, faulting, outgoing
from oncebus.amqp.errors import TRACKING_ID, condition_of
from oncebus.auth import SEND
from oncebus.broker import PendingSettlement
from oncebus.core.errors import (
    InvalidArgumentError,
    MessageSizeExceededError,
    OncebusError,
    UnauthorizedError,
)
from oncebus.core.messages import Message, ServiceBusReceiveMode
from oncebus.core.received import ReceivedMessage

if TYPE_CHECKING:
    from oncebus.amqp.connection import AmqpConnection
    from oncebus.broker import Broker, SessionLock

_LOG = logging.getLogger(__name__)

SESSION_FILTER = proton.symbol("com.microsoft:session-filter")
LOCKED_UNTIL_UTC = proton.symbol("com.microsoft:locked-until-utc")
OPERATION_TIMEOUT = proton.symbol("com.microsoft:timeout")
MAX_BATCH_SIZE = proton.symbol("com.microsoft:max-message-batch-size")
TRANSFER_DESTINATION = proton.symbol("com.microsoft:transfer-destination-address")  # send-via
TRANSACTIONAL_STATE = 0x34  # AMQP 1.0 section 4.5.5 (see oncebus.amqp.coordinator)
DOTNET_EPOCH_TICKS = 621_355_968_000_000_000
NOT_ENCODED_REASON = "MessageEncodingFailed"  # the DeadLetterReason of a message the encoder failed on
DEFAULT_SESSION_WAIT_SECONDS = 65.0
SEND_CREDIT = 64
REQUEST_CREDIT = 16
IDLE_POLL_SECONDS = 1.0  # a link waiting for its client to read looks again at least this often
# a link with credit and nothing to deliver: its receivable's signal wakes it when something arrives, so
# this poll is only a safety net; thousands of idle links must not cost the loop thousands of receives a second
IDLE_RECEIVE_POLL_SECONDS = 5.0


def dotnet_ticks(moment_us: int) -> int:
    """Microseconds since the Unix epoch as .NET ticks (100 ns since 0001-01-01), as Service Bus sends them."""
    return DOTNET_EPOCH_TICKS + moment_us * 10


def read_filter(terminus: engine.Terminus) -> dict[Any, Any]:
    if isinstance(terminus, engine.Terminus):
        return terminus.filter_map()
    data = terminus.filter
    data.rewind()
    if data.next() is None:
        return {}
    value = data.get_object()
    return dict(value) if isinstance(value, dict) else {}


def filter_value(value: Any) -> Any:
    """A source filter's value: the filter-set holds described values (the Go SDK sends them so; the Python and
    JavaScript SDKs send the bare value)."""
    return value.value if isinstance(value, proton.Described) else value


def read_payload(link: engine.Link, delivery: engine.Delivery) -> bytes:
    chunks = []
    while True:
        chunk = link.recv(max(delivery.pending, 1024))
        if not chunk:
            break
        chunks.append(chunk)
    link.advance()
    return b"".join(chunks)


def refuse(link: engine.Link, condition: proton.Condition) -> None:
    """Answer an attach we cannot serve: attach with a null terminus, then detach with the error."""
    if link.is_sender:
        link.source.type = engine.UNSPECIFIED
        link.target.copy(link.remote_target)
    else:
        link.target.type = engine.UNSPECIFIED
        link.source.copy(link.remote_source)
    link.open()
    link.condition = condition
    link.close()


def close_with(link: engine.Link, condition: proton.Condition) -> None:
    if link.state & engine.LOCAL_ACTIVE:
        link.condition = condition
        link.close()


async def wait_for_change(namespace: Broker, path: str, wake: asyncio.Future[None], timeout: float) -> None:
    """Wait until messages may have become available at ``path`` (or the namespace changed for every
    receiver), ``wake`` is set, or ``timeout`` passes."""
    await namespace.wait_for_change(timeout, wake, path=path)


def detach_if_gone(conn: AmqpConnection, link: engine.Link, namespace: Broker, paths: Iterable[str]) -> bool:
    """Detach ``link`` with ``amqp:not-found`` if the entity of one of ``paths`` was deleted (Service Bus detaches
    a deleted entity's links at once, with or without credit); True if it did."""
    for path in paths:
        gone = namespace.entity_gone(path)
        if gone is not None:
            close_with(link, condition_of(gone))
            conn.pump()
            return True
    return False


def too_large(size: int, limit: int) -> MessageSizeExceededError:
    return MessageSizeExceededError(
        f"the message is larger than the link's max-message-size of {limit} bytes ({size} bytes arrived before "
        "it was refused; the rest was not read); nothing was stored"
    )


# ---------------------------------------------------------------------------------------- sending

# $management operations that change nothing a transaction could undo (lock renewals extend a lock now, as Service
# Bus does inside a transaction; peeks and reads change nothing): answered as usual inside one
OUTSIDE_TRANSACTIONS = frozenset(
    {
        "com.microsoft:renew-lock",
        "com.microsoft:renew-session-lock",
        "com.microsoft:peek-message",
        "com.microsoft:get-session-state",
        "com.microsoft:get-message-sessions",
        "com.microsoft:enumerate-rules",
    }
)
# $management operations that run inside the transaction their request's transfer names (transactional-state): held
# until the commit and applied in its durable unit, as Service Bus does; any other that changes something is refused
IN_TRANSACTIONS = frozenset(
    {
        "com.microsoft:update-disposition",
        "com.microsoft:schedule-message",
        "com.microsoft:cancel-scheduled-message",
        "com.microsoft:set-session-state",
    }
)


class SendLink:
    """The client sends to a queue or topic: every transfer is judged and answered settled."""

    def __init__(
        self, conn: AmqpConnection, link: engine.Link, namespace: Broker, entity: str, max_message_size: int
    ) -> None:
        self.conn = conn
        self.link = link
        self.namespace = namespace
        self.entity = entity
        self.destination = entity  # where its messages go: another entity for a send-via link
        self.max_message_size = max_message_size
        self.max_batch_size = max_message_size  # what the link advertises for a batch (the tier's: see routing)
        self.queue: collections.deque[tuple[engine.Delivery, list[Message] | BaseException]] = collections.deque()
        self.worker: asyncio.Task[None] | None = None
        self.closed = False
        self.wake: asyncio.Future[None] = conn.loop.create_future()  # set when the link closes

    def open(self) -> None:
        link = self.link
        link.target.copy(link.remote_target)
        link.source.copy(link.remote_source)
        link.rcv_settle_mode = engine.RCV_FIRST
        link.max_message_size = self.max_message_size
        link.properties = {MAX_BATCH_SIZE: proton.ulong(min(self.max_batch_size, self.max_message_size))}
        self.conn.serve(link, self)
        link.open()
        link.flow(SEND_CREDIT)
        self.conn.spawn(self._watch())

    async def _watch(self) -> None:
        """Detach the link when its entity (or a send-via link's destination) is deleted, sending or not: the
        namespace's changes for every link wake it (an entity deleted, a reset)."""
        paths = tuple(dict.fromkeys((self.entity, self.destination)))
        while not self.closed:
            await self.namespace.wait_for_change(IDLE_RECEIVE_POLL_SECONDS, self.wake)
            if not self.closed and detach_if_gone(self.conn, self.link, self.namespace, paths):
                return

    def covered_path(self) -> str | None:
        return self.entity

    def on_flow(self) -> None:
        pass

    def refuse_partial(self, delivery: engine.Delivery, size: int, limit: int) -> None:
        delivery.notes.refused = True
        self._answer(delivery, too_large(size, limit))
        self._top_up()
        self.conn.pump()

    def on_delivery(self, delivery: engine.Delivery) -> None:
        if delivery.partial or delivery.notes.refused:  # refused ones: bytes were dropped
            return
        payload = read_payload(self.link, delivery)
        if delivery.aborted:
            delivery.settle()
            self._top_up()
            return
        item: list[Message] | BaseException
        try:
            if delivery.oversized:
                raise too_large(delivery.size, self.max_message_size)
            if len(payload) > self.max_message_size:
                raise MessageSizeExceededError(
                    f"the transfer is {len(payload)} bytes, over the link's max-message-size of "
                    f"{self.max_message_size} bytes"
                )
            for path in dict.fromkeys((self.entity, self.destination)):
                denied = self.conn.access_denied(path, SEND)
                if denied is not None:
                    raise UnauthorizedError(denied)
            item = codec.decode_transfer(payload, delivery.message_format, self.conn.limits.max_value_depth)
        except (OncebusError, ValueError) as exc:
            item = exc if isinstance(exc, OncebusError) else InvalidArgumentError(str(exc))
        except Exception as exc:  # a message the codec did not foresee: refuse it, keep the connection
            _LOG.exception("cannot decode a message sent to %r", self.entity)
            item = InvalidArgumentError(f"the message cannot be decoded: {type(exc).__name__}: {exc}")
        if delivery.remote_state == TRANSACTIONAL_STATE:
            delivery.notes.txn_id = _txn_id(delivery)  # held by the transaction until its discharge
        self.queue.append((delivery, item))
        if self.worker is None or self.worker.done():
            self.worker = self.conn.spawn(self._work())

    async def _work(self) -> None:
        namespace = self.namespace
        while self.queue:
            delivery, item = self.queue.popleft()
            outcome: BaseException | None = item if isinstance(item, BaseException) else None
            txn_id = delivery.notes.txn_id
            if outcome is None and txn_id is not None:
                assert not isinstance(item, BaseException)
                try:
                    namespace.transactions.send(txn_id, self.conn, self.entity, self.destination, item)
                except Exception as exc:
                    outcome = exc
                else:
                    self._answer_transactional(delivery, txn_id)
                    self._top_up()
                    self.conn.pump()
                    continue
            elif outcome is None:
                assert not isinstance(item, BaseException)
                faults = namespace.faults.armed
                try:
                    if faults and faulting.before_send(self.conn, self.link, namespace, self.entity):
                        self.queue.clear()  # the link or connection is gone: nothing more of it is read
                        return
                    await namespace.send(self.destination, item)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    outcome = exc
                if (
                    faults
                    and outcome is None
                    and await faulting.after_send(self.conn, self.link, namespace, self.entity)
                ):
                    self.queue.clear()  # the acknowledgement is lost (the send is stored)
                    return
            self._answer(delivery, outcome)
            self._top_up()
            self.conn.pump()

    def _answer(self, delivery: engine.Delivery, error: BaseException | None) -> None:
        if self.closed:
            return
        if delivery.settled:  # the client settled first (pre-settled send): nothing to answer
            delivery.settle()
            return
        if error is None:
            delivery.update(engine.ACCEPTED)
        else:
            delivery.local.condition = condition_of(error)
            delivery.update(engine.REJECTED)
        delivery.settle()

    def _answer_transactional(self, delivery: engine.Delivery, txn_id: bytes) -> None:
        """Held by the transaction: ``transactional-state{txn-id, accepted}`` (stored only if it commits)."""
        if self.closed:
            return
        if delivery.settled:  # the client settled first: nothing to answer
            delivery.settle()
            return
        delivery.local.data = [txn_id, proton.Described(proton.ulong(0x24), [])]
        delivery.update(TRANSACTIONAL_STATE)
        delivery.settle()

    def _top_up(self) -> None:
        if not self.closed and self.link.credit < SEND_CREDIT // 2:
            self.link.flow(SEND_CREDIT - self.link.credit)

    def on_closed(self) -> None:
        self.closed = True
        if not self.wake.done():
            self.wake.set_result(None)


# ---------------------------------------------------------------------------------------- receiving
def _nothing() -> None:
    pass


class ReceiveLink:
    """The client receives from a queue, subscription or dead-letter queue, with credit and drain."""

    def __init__(
        self,
        conn: AmqpConnection,
        link: engine.Link,
        namespace: Broker,
        path: str,
        mode: ServiceBusReceiveMode,
        session: SessionLock | None,
    ) -> None:
        self.conn = conn
        self.link = link
        self.namespace = namespace
        self.path = path
        self.mode = mode
        self.session = session
        self.closed = False
        self.wake: asyncio.Future[None] = conn.loop.create_future()
        self.task: asyncio.Task[None] | None = None
        self.largest = 0  # the largest delivery sent on this link so far (bytes): sizes the next batch
        self.release: Callable[[], None] = _nothing  # ends this receiver's count (the tier's concurrent receives)

    def open(self) -> None:
        link = self.link
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        if self.mode == ServiceBusReceiveMode.RECEIVE_AND_DELETE:
            link.snd_settle_mode = engine.SND_SETTLED
        else:
            link.snd_settle_mode = engine.SND_UNSETTLED
        # the receiver's own mode, echoed: go-amqp fails a link answered with another than it asked (second)
        link.rcv_settle_mode = link.remote_rcv_settle_mode
        if self.session is not None:
            # echoed in the form it came (go-amqp cannot read a bare value where it sent a described one)
            asked = read_filter(link.remote_source).get(SESSION_FILTER)
            locked: Any = self.session.session_id
            if isinstance(asked, proton.Described):
                locked = proton.Described(asked.descriptor, locked)
            if isinstance(link.source, engine.Terminus):
                link.source.set_filter({SESSION_FILTER: locked})
            else:
                link.source.filter.clear()
                link.source.filter.put_object({SESSION_FILTER: locked})
            link.properties = {LOCKED_UNTIL_UTC: int(dotnet_ticks(self.session.locked_until_us))}
            self.conn.sessions[(self.session.path, self.session.session_id)] = self.session
        self.conn.serve(link, self)
        link.settler = self._client_settled  # its completions come straight from the frame (no events)
        link.open()
        self.task = self.conn.spawn(self._deliver_loop())

    def _poke(self) -> None:
        if not self.wake.done():
            self.wake.set_result(None)

    def on_flow(self) -> None:
        self._poke()

    def covered_path(self) -> str | None:
        return self.path

    def _batch(self, credit: int) -> int:
        """How many messages to take from the broker now: no more than the client's buffer has room for."""
        limits = self.conn.limits
        if self.largest == 0:
            count = limits.first_delivery_batch
        else:
            count = max((limits.outgoing_buffer_limit - self.conn.outgoing_bytes()) // self.largest, 1)
        return min(credit, count, limits.max_delivery_batch)

    async def _wait_for_room(self) -> None:
        """Until the client reads (the socket drains, or a flow opens its session window) or a poll passes."""
        room = self.conn.room_changed()
        try:
            await asyncio.wait([room, self.wake], timeout=IDLE_POLL_SECONDS, return_when=asyncio.FIRST_COMPLETED)
        finally:
            room.cancel()

    async def _deliver_loop(self) -> None:
        namespace = self.namespace
        link = self.link
        while not self.closed:
            if self.wake.done():
                self.wake = self.conn.loop.create_future()
            credit = link.credit
            if credit <= 0:
                await wait_for_change(namespace, self.path, self.wake, IDLE_RECEIVE_POLL_SECONDS)
                # with credit, the next receive says the entity is gone; without, this does (as Service Bus)
                if not self.closed and detach_if_gone(self.conn, link, namespace, (self.path,)):
                    return
                continue
            if not self.conn.has_room():
                # the client does not read what it was sent: take (and lock) nothing more until it does
                await self._wait_for_room()
                continue
            try:
                messages = await namespace.receive(
                    self.path,
                    self._batch(credit),
                    receive_mode=self.mode,
                    max_wait_time=0,
                    session=self.session,
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                close_with(link, condition_of(exc))
                self.conn.pump()
                return
            if messages and namespace.faults.armed:
                await faulting.hold_delivery(namespace, self.path)
            if messages and self.closed:  # the link went away while they were fetched: let them go
                await self._let_go(messages)
                return
            if messages and not namespace.faults.armed:
                self._transfer_all(messages)  # (nothing on that path closes the link)
                self.conn.pump()
                continue
            if messages:
                for index, message in enumerate(messages):
                    self._transfer(message)
                    if self.closed:  # a fault cut the connection or detached the link: the rest are let go
                        await self._let_go(messages[index + 1 :])
                        return
                self.conn.pump()
                continue
            if link.drain_mode:
                link.drained()
                self.conn.pump()
            await wait_for_change(namespace, self.path, self.wake, IDLE_RECEIVE_POLL_SECONDS)

    async def _let_go(self, messages: list[ReceivedMessage]) -> None:
        for message in messages:
            if message.lock_token is not None:
                await self.namespace.abandon(self.path, message.lock_token, failed=False)  # never sent

    def _transfer_all(self, messages: list[ReceivedMessage]) -> None:
        """:meth:`_transfer` for a batch in one pass, no fault armed: each message encoded and queued on the link
        as one whole delivery (framed when the connection writes)."""
        link = self.link
        locks = self.session is None
        deleting = self.mode == ServiceBusReceiveMode.RECEIVE_AND_DELETE
        encode = outgoing.encode_received
        largest = self.largest
        for message in messages:
            token = None if deleting else message.lock_token
            try:
                payload = encode(message, lock_annotations=locks, lock_token=token, delivered_section=True)
            except Exception as exc:  # a failure of ours: this message is not sent, the others are
                self._not_encoded(message, token, exc)
                continue
            if len(payload) > largest:
                largest = len(payload)
            if token is None:  # settled at once, no lock: an empty tag (see _transfer)
                link.send_whole(b"", payload).settle()
            else:
                link.send_whole(outgoing.lock_token_tag(token), payload).notes.lock_token = token
        self.largest = largest

    def _transfer(self, message: ReceivedMessage) -> None:
        token = message.lock_token if self.mode != ServiceBusReceiveMode.RECEIVE_AND_DELETE else None
        try:
            payload = outgoing.encode_received(
                message, lock_annotations=self.session is None, lock_token=token, delivered_section=True
            )
        except Exception as exc:  # a failure of ours: this message is not sent, the others are
            self._not_encoded(message, token, exc)
            return
        self.largest = max(self.largest, len(payload))
        if token is None:
            # settled at once, no lock: an empty tag, as Service Bus sends it (the SDK's test_message.py reads
            # receive-and-delete deliveries' tag as None)
            delivery = self.link.delivery(b"")
            self.link.send(payload)
            self.link.advance()
            delivery.settle()
        else:
            delivery = self.link.delivery(outgoing.lock_token_tag(token))
            delivery.notes.lock_token = token
            self.link.send(payload)
            self.link.advance()
        if self.namespace.faults.armed:
            faulting.delivered(self.conn, self.link, self.namespace, self.path, message.lock_token, self.session)

    def _not_encoded(self, message: ReceivedMessage, token: uuid.UUID | None, exc: Exception) -> None:
        """A message the encoder failed on (the broker dead-letters what the core refuses before it gets here): logged,
        not sent; locked, it goes to the dead-letter queue with why (one already there keeps its lock until it expires,
        and is tried again then); received and deleted, it is gone, and the log says so."""
        gone = "it was received and deleted, so it is lost" if token is None else "it is not sent"
        _LOG.error(
            "message %d of %s could not be encoded for its receiver; %s",
            message.sequence_number,
            self.path,
            gone,
            exc_info=exc,
        )
        if token is not None:
            description = f"oncebus could not encode it for an AMQP receiver: {type(exc).__name__}: {exc}"
            self.conn.spawn(self._dead_letter_not_encoded(token, description[:1024]))

    async def _dead_letter_not_encoded(self, token: uuid.UUID, description: str) -> None:
        try:
            await self.namespace.dead_letter(self.path, token, NOT_ENCODED_REASON, description)
        except OncebusError as exc:  # in a dead-letter queue already, or the lock is gone: it stays where it is
            _LOG.warning("the message that could not be encoded stays in %s: %s", self.path, exc)

    def _client_settled(self, deliveries: list[engine.Delivery]) -> None:
        """The client's disposition of ``deliveries`` (one frame's range), straight from the frame: a completion
        goes to the broker at once and its outcome is said when committed (:meth:`_completed`); anything else
        as :meth:`on_delivery` handles it (the same checks, in the same order)."""
        if self.closed:  # (the connection no longer serves it: its events would reach no handler)
            return
        namespace = self.namespace
        path = self.path
        for delivery in deliveries:
            notes = delivery.notes
            token = notes.lock_token
            if (
                delivery.remote_state != engine.ACCEPTED
                or token is None
                or notes.done
                or notes.settling
                or namespace.faults.armed
            ):
                self.on_delivery(delivery)
                continue
            notes.settling = True
            try:
                namespace.complete_soon(path, token, functools.partial(self._completed, delivery))
            except Exception as exc:
                self._settled(delivery, engine.ACCEPTED, exc)

    def _completed(self, delivery: engine.Delivery, error: BaseException | None) -> None:
        """A completion from :meth:`_client_settled` is committed (``error``: it failed): its outcome."""
        if error is not None or delivery.settled or delivery.notes.done or self.closed:
            self._settled(delivery, engine.ACCEPTED, error)
            return
        delivery.notes.done = True
        delivery.settle_as(engine.ACCEPTED)
        self.conn.pump()

    def on_delivery(self, delivery: engine.Delivery) -> None:
        """The client settled (or proposed an outcome for) a delivery (``settled`` is the client's flag)."""
        if delivery.notes.done:
            return
        token = delivery.notes.lock_token
        state = delivery.remote_state
        if token is None or delivery.notes.settling:
            if delivery.settled and token is None:
                delivery.notes.done = True
                delivery.settle()
            return
        if not state and not delivery.settled:
            return
        delivery.notes.settling = True
        if state == TRANSACTIONAL_STATE:
            self._settle_in_transaction(delivery, token)
            return
        if self.namespace.faults.armed and (busy := faulting.settle_refused(self.namespace, self.path)) is not None:
            self._settled(delivery, state, busy)
            return
        if state == engine.ACCEPTED:  # complete: no task, settled when the store has it
            try:
                self.namespace.complete_soon(self.path, token, lambda error: self._settled(delivery, state, error))
            except Exception as exc:
                self._settled(delivery, state, exc)
            return
        remote = delivery.remote
        info: dict[Any, Any] = {}
        if state == engine.REJECTED and remote.condition is not None and remote.condition.info:
            info = {str(k): v for k, v in cast(dict[Any, Any], remote.condition.info).items()}
        settle = self._settlement(
            token,
            state,
            undeliverable=bool(remote.undeliverable),
            annotations=dict(remote.annotations or {}),
            info=info,
        )
        self.conn.spawn(self._settle(delivery, settle, state))

    def _settlement(
        self,
        token: uuid.UUID,
        state: int,
        *,
        undeliverable: bool,
        annotations: dict[Any, Any],
        info: dict[str, Any],
    ) -> Callable[[], Awaitable[None]]:
        namespace = self.namespace
        path = self.path
        modify = {str(k): codec.property_value(v) for k, v in annotations.items()} or None
        if state == engine.ACCEPTED:
            return lambda: namespace.complete(path, token)
        if state == engine.MODIFIED and undeliverable:
            return lambda: namespace.defer(path, token, modify)
        if state == engine.REJECTED:
            reason, description, modify = _dead_letter_info(info)
            return lambda: namespace.dead_letter(
                path, token, reason=reason, error_description=description, properties_to_modify=modify
            )
        counted = counts_delivery(state == engine.MODIFIED)
        return lambda: namespace.abandon(path, token, modify, failed=counted)

    def _settle_in_transaction(self, delivery: engine.Delivery, token: uuid.UUID) -> None:
        """A settlement under a transaction: held (the message stays locked) until the transaction commits."""
        txn_id = _txn_id(delivery)
        data = delivery.remote.data or []
        outcome = data[1] if len(data) > 1 else None
        code, fields = _outcome(outcome)
        error: BaseException | None = None
        try:
            settlement = _transactional_settlement(self.path, token, code, fields)
            self.namespace.transactions.settle(txn_id, self.conn, settlement)
        except Exception as exc:
            error = exc
        if delivery.notes.done or self.closed:
            return
        delivery.notes.done = True
        if error is not None:
            delivery.local.condition = condition_of(error)
            delivery.update(engine.REJECTED)
        else:
            delivery.local.data = [txn_id, outcome]
            delivery.update(TRANSACTIONAL_STATE)
        delivery.settle()
        self.conn.pump()

    async def _settle(self, delivery: engine.Delivery, settle: Callable[[], Awaitable[None]], state: int) -> None:
        error: BaseException | None = None
        try:
            await settle()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error = exc
        self._settled(delivery, state, error)

    def _settled(self, delivery: engine.Delivery, state: int, error: BaseException | None) -> None:
        """Tell the client the outcome of its settlement (``error``: it failed)."""
        if delivery.notes.done or self.closed:
            return
        delivery.notes.done = True
        if delivery.settled:
            delivery.settle()
        elif error is not None:
            delivery.local.condition = condition_of(error)
            delivery.update(engine.REJECTED)
            delivery.settle()
        else:
            if state == engine.MODIFIED:
                delivery.local.failed = delivery.remote.failed
                delivery.local.undeliverable = delivery.remote.undeliverable
            delivery.update(state if state else engine.ACCEPTED)
            delivery.settle()
        self.conn.pump()

    def on_closed(self) -> None:
        self.closed = True
        self.link.settler = None
        self.release()
        self._poke()
        if self.session is not None:
            self.conn.sessions.pop((self.session.path, self.session.session_id), None)
            session = self.session
            self.conn.spawn(self.namespace.close_session(session))


# ---------------------------------------------------------------------------------------- transactions
_OUTCOMES = {
    "amqp:accepted:list": 0x24,
    "amqp:rejected:list": 0x25,
    "amqp:released:list": 0x26,
    "amqp:modified:list": 0x27,
}


def counts_delivery(modified: bool) -> bool:
    """Whether an abandon counts a delivery attempt: ``modified`` does, whatever its delivery-failed flag (the
    Python SDK sets it, the JavaScript SDK does not, and Service Bus counts both); ``released`` does not (what an
    SDK sends for messages it never handed to the application: AMQP 1.0 3.4.4)."""
    return modified


def _txn_id(delivery: engine.Delivery) -> bytes:
    data = delivery.remote.data or []
    value = data[0] if data else None
    return bytes(value) if isinstance(value, (bytes, bytearray, memoryview)) else b""  # none: refused as an unknown id


def _outcome(outcome: Any) -> tuple[int | None, list[Any]]:
    """The descriptor code and fields of a transactional state's outcome (``None``: it has none)."""
    if not isinstance(outcome, proton.Described):
        return None, []
    descriptor = outcome.descriptor
    code = int(descriptor) if isinstance(descriptor, int) else _OUTCOMES.get(str(descriptor))
    return code, list(outcome.value) if isinstance(outcome.value, list) else []


def _dead_letter_info(info: dict[str, Any]) -> tuple[str | None, str | None, dict[str, Any] | None]:
    """A dead-letter's error info: (reason, description, properties to modify: every other entry, as the .NET
    and Go SDKs put them there)."""
    reason, description = info.get(codec.DEAD_LETTER_REASON), info.get(codec.DEAD_LETTER_ERROR_DESCRIPTION)
    dead_letter_keys = (codec.DEAD_LETTER_REASON, codec.DEAD_LETTER_ERROR_DESCRIPTION)
    modify = {k: codec.property_value(v) for k, v in info.items() if k not in dead_letter_keys}
    return (
        None if reason is None else str(reason),
        None if description is None else str(description),
        modify or None,
    )


def _transactional_settlement(path: str, token: uuid.UUID, code: int | None, fields: list[Any]) -> PendingSettlement:
    """A transactional disposition's outcome as a settlement, mapped as a plain disposition is (see
    ``ReceiveLink._settlement``): accepted completes, rejected dead-letters, modified with undeliverable-here
    defers, released or modified abandons."""
    if code == 0x24:
        return PendingSettlement(path, token, "complete")
    if code == 0x25:
        error = fields[0] if fields else None
        info: dict[str, Any] = {}
        if isinstance(error, proton.Described) and isinstance(error.value, list) and len(error.value) > 2:
            info = {str(k): codec.copy_value(v) for k, v in dict(cast(Any, error.value[2]) or {}).items()}
        reason, description, properties = _dead_letter_info(info)
        return PendingSettlement(path, token, "dead_letter", properties, reason=reason, error_description=description)
    annotations = fields[2] if code == 0x27 and len(fields) > 2 and isinstance(fields[2], dict) else {}
    modify = {str(k): codec.property_value(v) for k, v in annotations.items()}  # copied: held past this disposition
    if code == 0x27 and len(fields) > 1 and fields[1]:
        return PendingSettlement(path, token, "defer", modify or None)
    if code in (0x26, 0x27):
        return PendingSettlement(path, token, "abandon", modify or None, failed=counts_delivery(code == 0x27))
    raise InvalidArgumentError(
        "a transactional disposition carries an outcome: accepted (complete), rejected (dead-letter), released or "
        f"modified (abandon; modified with undeliverable-here: defer), not {code!r}"
    )


# ---------------------------------------------------------------------------------------- nodes
# (the connection, the request link, the request, and the transaction it runs in: None outside any)
RequestHandler = Callable[
    ["AmqpConnection", engine.Link, proton.Message, bytes | None], Awaitable[proton.Message | None]
]


class RequestLink:
    """The client's request link to a node ($cbs, <entity>/$management)."""

    def __init__(
        self,
        conn: AmqpConnection,
        link: engine.Link,
        node: str,
        handler: RequestHandler,
        *,
        max_message_size: int,
        entity: str | None = None,
        covered: str | None = None,
    ) -> None:
        self.conn = conn
        self.link = link
        self.node = node
        self.handler = handler
        self.max_message_size = max_message_size
        self.entity = entity  # the entity the node serves (None for $cbs)
        self.covered = covered  # the node path a token must keep covering (None for $cbs)
        self.closed = False

    def open(self) -> None:
        link = self.link
        link.target.copy(link.remote_target)
        link.source.copy(link.remote_source)
        link.rcv_settle_mode = engine.RCV_FIRST
        link.max_message_size = self.max_message_size
        self.conn.serve(link, self)
        link.open()
        link.flow(REQUEST_CREDIT)

    def covered_path(self) -> str | None:
        return self.covered

    def on_flow(self) -> None:
        pass

    def refuse_partial(self, delivery: engine.Delivery, size: int, limit: int) -> None:
        delivery.notes.refused = True
        self._reject(delivery, condition_of(too_large(size, limit)))
        self.conn.pump()

    def _reject(self, delivery: engine.Delivery, condition: proton.Condition) -> None:
        delivery.local.condition = condition
        delivery.update(engine.REJECTED)
        delivery.settle()

    def on_delivery(self, delivery: engine.Delivery) -> None:
        if delivery.partial or delivery.notes.refused:
            return
        payload = read_payload(self.link, delivery)
        if delivery.aborted:
            delivery.settle()
            return
        if delivery.oversized:
            self._reject(delivery, condition_of(too_large(delivery.size, self.max_message_size)))
            return
        # read as Any: proton declares a Message's fields as None, which compiled code would check (every request
        # with properties refused: TypeError: None object expected; got dict)
        request: Any = proton.Message()
        try:
            codec.check_sections(payload, self.conn.limits.max_value_depth)
            request.decode(payload)
        except Exception as exc:  # whatever the bytes: refuse this request, keep the connection
            condition = proton.Condition(
                "amqp:decode-error", f"the request cannot be decoded: {exc}", {TRACKING_ID: str(uuid.uuid4())}
            )
            self._reject(delivery, condition)
            return
        properties: dict[Any, Any] = request.properties or {}
        operation = properties.get("operation")
        operation = operation if isinstance(operation, str) else repr(operation)  # hashable, whatever was sent
        txn_id: bytes | None = None
        if delivery.remote_state == TRANSACTIONAL_STATE and operation in IN_TRANSACTIONS:
            txn_id = _txn_id(delivery)  # run in the transaction (management.handle_request)
        elif delivery.remote_state == TRANSACTIONAL_STATE and operation not in OUTSIDE_TRANSACTIONS:
            refused = InvalidArgumentError(  # rather refused than applied outside its transaction
                f"{operation!s} on {self.node} inside a transaction (transactional-state on its transfer) is not "
                "supported by oncebus: make this request outside the transaction; inside one oncebus runs "
                "update-disposition, schedule-message, cancel-scheduled-message and set-session-state in the "
                "transaction, and lock renewals, peeks and reads as outside"
            )
            self._reject(delivery, condition_of(refused))
            return
        delivery.update(engine.ACCEPTED)
        delivery.settle()
        if self.link.credit < REQUEST_CREDIT // 2:
            self.link.flow(REQUEST_CREDIT - self.link.credit)
        self.conn.spawn(self._answer(request, txn_id))

    async def _answer(self, request: Any, txn_id: bytes | None) -> None:  # a proton.Message (read as Any: above)
        response: Any = await self.handler(self.conn, self.link, request, txn_id)
        if response is None or self.conn.closed:
            return
        response.correlation_id = request.id
        target = self.conn.response_link(self.link, request.reply_to, self.node)
        if target is None:
            _LOG.warning("no response link for a request to %s (reply-to %r)", self.node, request.reply_to)
            return
        delivery = target.delivery(uuid.uuid4().bytes)
        target.send(response.encode())
        target.advance()
        if target.snd_settle_mode != engine.SND_UNSETTLED:
            # sent settled (the link is mixed): a client that never settles its responses keeps nothing here
            delivery.settle()
        self.conn.pump()

    def on_closed(self) -> None:
        self.closed = True


class ResponseLink:
    """The client's receiver link a node answers on."""

    def __init__(self, conn: AmqpConnection, link: engine.Link, address: str) -> None:
        self.conn = conn
        self.link = link
        self.address = address

    def open(self) -> None:
        link = self.link
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        # responses go settled (a client that never settles them keeps nothing here): settled when asked (go-amqp
        # fails a reply link answered with another mode than the settled it asks for), mixed otherwise
        asked = link.remote_snd_settle_mode
        link.snd_settle_mode = engine.SND_SETTLED if asked == engine.SND_SETTLED else engine.SND_MIXED
        link.rcv_settle_mode = link.remote_rcv_settle_mode
        self.conn.serve(link, self)
        link.open()
        self.conn.add_response_link(link, self.address)
        target = link.remote_target.address
        if target and target.lower() != self.address.lower():
            self.conn.add_response_link(link, target)

    def on_flow(self) -> None:
        pass

    def on_delivery(self, delivery: engine.Delivery) -> None:
        if delivery.settled:
            delivery.settle()

    def covered_path(self) -> str | None:
        return None

    def on_closed(self) -> None:
        pass
