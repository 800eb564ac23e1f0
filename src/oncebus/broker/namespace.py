"""The broker engine: one namespace of queues, topics and subscriptions.

All state lives on one asyncio event loop; front ends (AMQP, HTTP, the CLI's
control socket) call these coroutines from that loop and never share the
structures. A send is judged by the entity's ``DuplicateDetector`` (the rule
lives in ``oncebus.core``), written to the store as one unit (messages and
dedup keys together), and acknowledged once that unit is durable.

If the store fails a write (disk full, I/O error), the caller gets a
``StoreWriteError`` (server-busy) naming the cause, the failure is logged once,
and the namespace refuses work, saying why, until every write in flight has
finished; it then reloads what the store holds, as a restart would (memory may
have been ahead of the disk: keys judged, messages settled, entities changed),
and accepts work again. Nothing is counted before it is committed; a send that
was judged a duplicate of a send whose write then failed is refused too, so
the sender resends it.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from oncebus.broker.clock import Clock, SystemClock
from oncebus.broker.paths import EntityPath, parse_path, subscription_path
from oncebus.broker.receivable import Receivable, ReceivableSettings, SessionLock
from oncebus.core.dedup import DuplicateDetector
from oncebus.core.durations import TIMESPAN_MAX, to_micros
from oncebus.core.entities import (
    QueueProperties,
    SubscriptionProperties,
    TopicProperties,
    validate_entity_name,
    validate_subscription_name,
)
from oncebus.core.errors import (
    EntityAlreadyExistsError,
    EntityNotFoundError,
    InvalidArgumentError,
    MessageLockLostError,
    MessageNotFoundError,
    MessageSizeExceededError,
    OperationTimeoutError,
    QuotaExceededError,
    SessionCannotBeLockedError,
    SessionLockLostError,
    StoreWriteError,
)
from oncebus.core.keys import MessageId, normalize_message_id, require_identifiable, service_bus_text, validate_ids
from oncebus.core.messages import (
    Message,
    MessageState,
    ReceivedMessage,
    ServiceBusReceiveMode,
    StoredMessage,
    check_message,
)
from oncebus.core.timeutil import MAX_US, add_us, clamp_us, datetime_to_us, us_to_datetime
from oncebus.store.base import (
    AddCounters,
    DeleteEntity,
    Op,
    PruneDedupKeys,
    PutDedupKey,
    PutEntity,
    PutMessage,
    PutSessionState,
    Store,
)

PRUNE_EVERY_US = 60_000_000
LATE_DELAYS_KEPT = 1_000
POLL_SECONDS = 0.25
RECOVER_FIRST_SECONDS = 0.05  # after a failed write, the first reload waits this long, doubling up to the next
RECOVER_MAX_SECONDS = 5.0
_LOG = logging.getLogger("oncebus.broker")
_COUNTERS = ("accepted", "duplicates", "late_resends")


@dataclass
class SendOutcome:
    """What happened to one message of a send (front ends report every send as accepted)."""

    message_id: MessageId
    sequence_number: int | None  # None for a dropped duplicate
    duplicate: bool
    late_resend_delay_us: int | None = None


@dataclass
class _Subscription:
    properties: SubscriptionProperties
    receivable: Receivable

    def accepts(self, message: Message) -> bool:
        """Every message for now; correlation and SQL filters plug in here."""
        return True


@dataclass
class _Entity:
    kind: str  # "queue" | "topic"
    properties: QueueProperties | TopicProperties
    detector: DuplicateDetector
    receivable: Receivable | None = None  # queues
    subscriptions: dict[str, _Subscription] = field(default_factory=dict)  # topics
    next_sequence_number: int = 1
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_COUNTERS, 0))
    unsaved: dict[str, int] = field(default_factory=dict)  # counted (committed sends' duplicates), not yet stored
    late_delays_us: collections.deque[int] = field(default_factory=lambda: collections.deque(maxlen=LATE_DELAYS_KEPT))
    last_prune_us: int = 0

    @property
    def path(self) -> str:
        return self.properties.name.lower()


def _settings(props: QueueProperties | SubscriptionProperties, max_size_mb: int) -> ReceivableSettings:
    return ReceivableSettings(
        lock_duration_us=to_micros(props.lock_duration),
        max_delivery_count=props.max_delivery_count,
        dead_lettering_on_message_expiration=props.dead_lettering_on_message_expiration,
        requires_session=props.requires_session,
        max_size_bytes=max_size_mb * 1024 * 1024,
    )


def _detector(props: QueueProperties | TopicProperties) -> DuplicateDetector:
    return DuplicateDetector(
        requires_duplicate_detection=props.requires_duplicate_detection,
        window=props.duplicate_detection_history_time_window,
        partitioned=props.enable_partitioning,
    )


SendLog = Callable[[dict[str, Any]], None]


class Namespace:
    """A Service Bus namespace. Create with ``await Namespace.open(store)``."""

    def __init__(self, store: Store, clock: Clock | None = None, *, send_log: SendLog | None = None) -> None:
        self.store = store
        self.clock = clock or SystemClock()
        self.send_log = send_log
        self._entities: dict[str, _Entity] = {}
        self._waiters: set[asyncio.Future[None]] = set()
        self._failure: StoreWriteError | None = None  # set from a failed write until the reload after it
        self._failed_writes = 0  # failed writes so far: a duplicate's verdict holds only if none failed meanwhile
        self._failure_logged = False  # one log line per episode (until a write succeeds again)
        self._recover_delay = RECOVER_FIRST_SECONDS
        self._recovery: asyncio.Task[None] | None = None
        self._in_flight = 0  # writes submitted whose outcome the loop has not handled yet
        self._idle: asyncio.Event | None = None
        self._floor_us = 0  # time never runs backwards for the broker, across restarts too
        self.reloads = 0
        self._timer_error: str | None = None

    # ------------------------------------------------------------------------------ lifecycle
    @classmethod
    async def open(cls, store: Store, clock: Clock | None = None, *, send_log: SendLog | None = None) -> Namespace:
        namespace = cls(store, clock, send_log=send_log)
        namespace._load()
        return namespace

    def _load(self) -> None:
        snapshot = self.store.load()
        self._entities = {}
        if snapshot.dedup_keys:
            self._floor_us = max(self._floor_us, max(k.first_accepted_us for k in snapshot.dedup_keys))
        now = self._now()
        subscriptions = []
        for record in snapshot.entities:
            if record.kind == "queue":
                self._install_queue(QueueProperties.from_dict(record.properties))
            elif record.kind == "topic":
                self._install_topic(TopicProperties.from_dict(record.properties))
            else:
                subscriptions.append(record)
        for record in subscriptions:
            topic = record.path.rsplit("/subscriptions/", 1)[0]
            if topic in self._entities:
                self._install_subscription(topic, SubscriptionProperties.from_dict(record.properties))
        for path, counters in snapshot.counters.items():
            entity = self._entities.get(path)
            if entity is not None:
                entity.next_sequence_number = counters.next_sequence_number
                entity.counters.update(counters.counters)
        for key in snapshot.dedup_keys:
            entity = self._entities.get(key.entity)
            if entity is None or not entity.detector.enabled:
                continue
            if key.first_accepted_us + to_micros(entity.detector.window) > now:
                entity.detector.index.restore(key.key, key.first_accepted_us)
        for message in snapshot.messages:
            if message.expires_at_us is not None and message.expires_at_us > MAX_US:
                message.expires_at_us = None  # stored by a release that did not cap expiries: never
            receivable = self._receivable_by_path(message.path)
            if receivable is not None:
                receivable.add(message, now)
        for state in snapshot.session_states:
            receivable = self._receivable_by_path(state.path)
            if receivable is not None and state.state is not None:
                receivable.session_states[state.session_id] = state.state

    async def close(self) -> None:
        """Persist the counts not stored yet; the store stays open (its owner closes it)."""
        if self._recovery is not None:
            self._recovery.cancel()
        if self._failure is None:
            ops: list[Op] = [op for e in self._entities.values() if (op := self._counters_op(e, {})) is not None]
            if ops:
                await self._write(ops)

    # ------------------------------------------------------------------------------ plumbing
    def _check_alive(self) -> None:
        if self._failure is not None:
            raise StoreWriteError(
                f"{self._failure} (oncebus is reloading what the store holds and refuses work until then; "
                "try again shortly)"
            )

    async def _write(
        self, ops: Sequence[Op], on_commit: Callable[[], None] | None = None, *, verdicts_since: int | None = None
    ) -> None:
        """Submit one unit and wait until it is durable.

        ``on_commit`` runs on the loop once the unit is durable, even if the caller was cancelled
        meanwhile, so memory never ends up behind the disk. A failed write is reported to the caller
        (and starts the recovery, see the module). ``verdicts_since``: the count of failed writes when
        this unit's duplicates were judged; if a write failed since, a key they were judged against
        may be gone, so the call is refused (what this unit stored stays: a resend is judged afresh).
        """
        self._check_alive()
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        done.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved even if nobody waits

        def committed(future: Future[None]) -> None:
            self._landed()
            error = future.exception()
            if error is not None:
                refusal = self._store_failed(error)
                if not done.done():
                    done.set_exception(refusal)
                return
            self._store_succeeded()
            if on_commit is not None:
                on_commit()
            if done.done():
                return
            if verdicts_since is not None and self._failed_writes != verdicts_since:
                done.set_exception(
                    StoreWriteError(
                        "a send this one was judged a duplicate of failed to store meanwhile; send again "
                        f"(the store's error: {self._failure or 'see the server log'})"
                    )
                )
                return
            done.set_result(None)

        future = self._submit(ops)
        future.add_done_callback(lambda f: loop.call_soon_threadsafe(committed, f))
        await asyncio.shield(done)

    def _submit(self, ops: Sequence[Op]) -> Future[None]:
        future = self.store.submit(ops)
        self._in_flight += 1
        if self._idle is not None:
            self._idle.clear()
        return future

    def _landed(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0 and self._idle is not None:
            self._idle.set()

    def _write_later(self, ops: Sequence[Op]) -> None:
        """Background writes (expiry, lock-expiry dead-lettering): nobody waits; a failure starts the recovery."""
        if not ops or self._failure is not None:
            return  # while failed, memory is reloaded from the store anyway
        loop = asyncio.get_running_loop()

        def done(f: Future[None]) -> None:
            self._landed()
            if f.exception() is not None:
                self._store_failed(f.exception())  # type: ignore[arg-type]
            else:
                self._store_succeeded()

        future = self._submit(ops)
        future.add_done_callback(lambda f: loop.call_soon_threadsafe(done, f))

    def _store_failed(self, error: BaseException) -> StoreWriteError:
        """A write failed (on the loop): refuse work, log once, and reload from the store once writes are idle."""
        refusal = error if isinstance(error, StoreWriteError) else StoreWriteError(f"the message store failed: {error}")
        self._failed_writes += 1
        if self._failure is None:
            self._failure = refusal
            if not self._failure_logged:
                self._failure_logged = True
                _LOG.error("%s; refusing work until what the store holds is reloaded", refusal)
            self._recovery = asyncio.get_running_loop().create_task(self._recover())
        return refusal

    def _store_succeeded(self) -> None:
        if self._failure is None and self._failure_logged:
            self._failure_logged = False
            self._recover_delay = RECOVER_FIRST_SECONDS
            _LOG.warning("the message store accepts writes again")

    async def _recover(self) -> None:
        """After a failed write: wait until no write is in flight, reload from the store, accept work again."""
        while True:
            await asyncio.sleep(self._recover_delay)
            self._recover_delay = min(self._recover_delay * 2, RECOVER_MAX_SECONDS)
            if self._idle is None:
                self._idle = asyncio.Event()
            if self._in_flight:
                self._idle.clear()
                await self._idle.wait()
            try:
                self._load()
            except Exception as exc:
                _LOG.error("could not reload the store after a failed write (%s); trying again", exc)
                continue
            self.reloads += 1
            self._failure = None
            self._recovery = None
            self._notify()
            return

    async def _barrier(self, verdicts_since: int) -> None:
        """Wait until every write submitted so far is durable (duplicates ack after their original)."""
        if self._in_flight:  # the empty unit's outcome is handled after every earlier one's
            await self._write([], verdicts_since=verdicts_since)
        elif self._failed_writes != verdicts_since:
            self._check_alive()
            raise StoreWriteError("a send this one was judged a duplicate of failed to store meanwhile; send again")

    def _now(self) -> int:
        now = self.clock.now_us()
        if now < self._floor_us:
            return self._floor_us
        self._floor_us = now
        return now

    def _notify(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    async def _wait(self, deadline: float | None) -> bool:
        """Wait for a change or the next poll; False once the deadline has passed."""
        loop = asyncio.get_running_loop()
        timeout = POLL_SECONDS
        if deadline is not None:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            timeout = min(timeout, remaining)
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.add(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except TimeoutError:
            pass
        finally:
            self._waiters.discard(waiter)
        return True

    async def wait_for_change(self, timeout: float, wake: asyncio.Future[None] | None = None) -> None:
        """Return when messages may have become available (a send, an abandon, a tick), when ``wake``
        completes, or after ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        change: asyncio.Future[None] = loop.create_future()
        self._waiters.add(change)
        try:
            waits: set[asyncio.Future[None]] = {change} if wake is None else {change, wake}
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._waiters.discard(change)
            if not change.done():
                change.cancel()

    def tick(self) -> None:
        """Apply everything due now (scheduled enqueues, lock and message expiry, history pruning)."""
        if self._failure is not None:
            return  # memory is reloaded from the store before anything is due again
        now = self._now()
        ops: list[Op] = []
        for entity in self._entities.values():
            for receivable in self._receivables(entity):
                ops += receivable.advance(now)
                if receivable.dead_letter_queue is not None:
                    ops += receivable.dead_letter_queue.advance(now)
            if entity.detector.enabled:
                entity.detector.index.expire(now)
                if now - entity.last_prune_us >= PRUNE_EVERY_US:
                    entity.last_prune_us = now
                    ops.append(PruneDedupKeys(entity.path, now - to_micros(entity.detector.window) + 1))
        self._write_later(ops)
        self._notify()

    async def run_timers(self, interval: float = 0.5) -> None:
        """Background task for a served namespace: tick on the real clock. It runs until cancelled:
        an error in one tick is logged (once until a tick succeeds) and the next tick runs as usual."""
        while True:
            await asyncio.sleep(interval)
            try:
                self.tick()
            except Exception as exc:
                text = f"{type(exc).__name__}: {exc}"
                if text != self._timer_error:
                    _LOG.error("the timer tick failed (%s); ticking on", text, exc_info=exc)
                self._timer_error = text
            else:
                self._timer_error = None

    # ------------------------------------------------------------------------------ lookup
    def _entity(self, name: str, kind: str | None = None) -> _Entity:
        entity = self._entities.get(name.lower())
        if entity is None:
            raise EntityNotFoundError(
                f"The messaging entity '{name}' could not be found: no queue or topic named {name!r} exists"
            )
        if kind is not None and entity.kind != kind:
            raise EntityNotFoundError(
                f"The messaging entity '{name}' could not be found: {name!r} is a {entity.kind}, not a {kind}"
            )
        return entity

    def _receivables(self, entity: _Entity) -> Iterable[Receivable]:
        if entity.receivable is not None:
            yield entity.receivable
        for subscription in entity.subscriptions.values():
            yield subscription.receivable

    def _receivable_by_path(self, path: str) -> Receivable | None:
        try:
            return self._resolve(parse_path(path))
        except EntityNotFoundError:
            return None

    def _resolve(self, where: EntityPath) -> Receivable:
        entity = self._entities.get(where.entity)
        if entity is None:
            raise EntityNotFoundError(f"The messaging entity '{where.entity}' could not be found")
        if where.subscription is None:
            if entity.receivable is None:
                raise InvalidArgumentError(
                    f"'{entity.properties.name}' is a topic: receive from one of its subscriptions "
                    f"('{entity.properties.name}/Subscriptions/<name>')"
                )
            receivable = entity.receivable
        else:
            subscription = entity.subscriptions.get(where.subscription)
            if subscription is None:
                raise EntityNotFoundError(
                    f"The messaging entity '{where.entity}/Subscriptions/{where.subscription}' could not be found"
                )
            receivable = subscription.receivable
        if where.dead_letter:
            assert receivable.dead_letter_queue is not None
            return receivable.dead_letter_queue
        return receivable

    def receivable(self, path: str) -> Receivable:
        """The queue, subscription or dead-letter sub-queue at ``path`` (advanced to now)."""
        self._check_alive()
        receivable = self._resolve(parse_path(path))
        self._write_later(receivable.advance(self._now()))
        return receivable

    # ------------------------------------------------------------------------------ entities
    def _install_queue(self, props: QueueProperties) -> _Entity:
        entity = _Entity("queue", props, _detector(props))
        entity.receivable = Receivable(props.name.lower(), _settings(props, props.max_size_in_megabytes))
        self._entities[entity.path] = entity
        return entity

    def _install_topic(self, props: TopicProperties) -> _Entity:
        entity = _Entity("topic", props, _detector(props))
        self._entities[entity.path] = entity
        return entity

    def _install_subscription(self, topic: str, props: SubscriptionProperties) -> _Subscription:
        entity = self._entity(topic, "topic")
        path = subscription_path(entity.path, props.name)
        receivable = Receivable(path, _settings(props, entity.properties.max_size_in_megabytes))
        subscription = _Subscription(props, receivable)
        entity.subscriptions[props.name.lower()] = subscription
        return subscription

    def _counters_op(self, entity: _Entity, deltas: dict[str, int]) -> AddCounters | None:
        """This unit's counts plus those counted but not stored yet (None when there is nothing to store)."""
        merged = dict(entity.unsaved)
        entity.unsaved.clear()
        for name, delta in deltas.items():
            merged[name] = merged.get(name, 0) + delta
        merged = {name: delta for name, delta in merged.items() if delta}
        if not merged and not deltas:
            return None
        return AddCounters(entity.path, entity.next_sequence_number, merged)

    async def create_queue(self, name: str, **properties: Any) -> QueueProperties:
        self._check_alive()
        validate_entity_name(name, kind="queue")
        if name.lower() in self._entities:
            raise EntityAlreadyExistsError(f"a {self._entities[name.lower()].kind} named {name!r} already exists")
        props = QueueProperties.create(name, **properties)
        self._install_queue(props)
        await self._write([PutEntity(name.lower(), "queue", props.to_dict())])
        return props

    async def create_topic(self, name: str, **properties: Any) -> TopicProperties:
        self._check_alive()
        validate_entity_name(name, kind="topic")
        if name.lower() in self._entities:
            raise EntityAlreadyExistsError(f"a {self._entities[name.lower()].kind} named {name!r} already exists")
        props = TopicProperties.create(name, **properties)
        self._install_topic(props)
        await self._write([PutEntity(name.lower(), "topic", props.to_dict())])
        return props

    async def create_subscription(self, topic_name: str, name: str, **properties: Any) -> SubscriptionProperties:
        self._check_alive()
        validate_subscription_name(name)
        topic = self._entity(topic_name, "topic")
        if name.lower() in topic.subscriptions:
            raise EntityAlreadyExistsError(f"topic {topic_name!r} already has a subscription named {name!r}")
        props = SubscriptionProperties.create(name, **properties)
        self._install_subscription(topic.path, props)
        await self._write([PutEntity(subscription_path(topic.path, name), "subscription", props.to_dict())])
        return props

    def get_queue(self, name: str) -> QueueProperties:
        props = self._entity(name, "queue").properties
        assert isinstance(props, QueueProperties)
        return props

    def get_topic(self, name: str) -> TopicProperties:
        props = self._entity(name, "topic").properties
        assert isinstance(props, TopicProperties)
        return props

    def get_subscription(self, topic_name: str, name: str) -> SubscriptionProperties:
        return self._subscription(topic_name, name).properties

    def _subscription(self, topic_name: str, name: str) -> _Subscription:
        topic = self._entity(topic_name, "topic")
        subscription = topic.subscriptions.get(name.lower())
        if subscription is None:
            raise EntityNotFoundError(
                f"The messaging entity '{topic_name}/Subscriptions/{name}' could not be found: "
                f"topic {topic_name!r} has no subscription named {name!r}"
            )
        return subscription

    def list_queues(self) -> list[QueueProperties]:
        return [e.properties for e in self._entities.values() if isinstance(e.properties, QueueProperties)]

    def list_topics(self) -> list[TopicProperties]:
        return [e.properties for e in self._entities.values() if isinstance(e.properties, TopicProperties)]

    def list_subscriptions(self, topic_name: str) -> list[SubscriptionProperties]:
        return [s.properties for s in self._entity(topic_name, "topic").subscriptions.values()]

    async def update_queue(self, name: str, **changes: Any) -> QueueProperties:
        self._check_alive()
        entity = self._entity(name, "queue")
        props = entity.properties.updated(**changes)
        prune = self._apply_entity_update(entity, props)
        await self._write([PutEntity(entity.path, "queue", props.to_dict()), prune])
        return props

    async def update_topic(self, name: str, **changes: Any) -> TopicProperties:
        self._check_alive()
        entity = self._entity(name, "topic")
        props = entity.properties.updated(**changes)
        prune = self._apply_entity_update(entity, props)
        await self._write([PutEntity(entity.path, "topic", props.to_dict()), prune])
        return props

    def _apply_entity_update(self, entity: _Entity, props: QueueProperties | TopicProperties) -> PruneDedupKeys:
        """Apply new properties; returns the pruning of keys that left the old window (for the same unit)."""
        now = self._now()
        prune = PruneDedupKeys(entity.path, now - to_micros(entity.detector.window) + 1)
        entity.properties = props
        entity.detector.set_window(props.duplicate_detection_history_time_window, now)
        if entity.receivable is not None and isinstance(props, QueueProperties):
            new = _settings(props, props.max_size_in_megabytes)
            entity.receivable.settings.__dict__.update(new.__dict__)
        for subscription in entity.subscriptions.values():
            subscription.receivable.settings.max_size_bytes = props.max_size_in_megabytes * 1024 * 1024
        return prune

    async def update_subscription(self, topic_name: str, name: str, **changes: Any) -> SubscriptionProperties:
        self._check_alive()
        subscription = self._subscription(topic_name, name)
        topic = self._entity(topic_name, "topic")
        props = subscription.properties.updated(**changes)
        subscription.properties = props
        new = _settings(props, topic.properties.max_size_in_megabytes)
        subscription.receivable.settings.__dict__.update(new.__dict__)
        await self._write([PutEntity(subscription.receivable.path, "subscription", props.to_dict())])
        return props

    async def delete_queue(self, name: str) -> None:
        self._check_alive()
        entity = self._entity(name, "queue")
        del self._entities[entity.path]
        self._notify()
        await self._write([DeleteEntity(entity.path)])

    async def delete_topic(self, name: str) -> None:
        self._check_alive()
        entity = self._entity(name, "topic")
        del self._entities[entity.path]
        self._notify()
        await self._write([DeleteEntity(entity.path)])

    async def delete_subscription(self, topic_name: str, name: str) -> None:
        self._check_alive()
        subscription = self._subscription(topic_name, name)
        topic = self._entity(topic_name, "topic")
        del topic.subscriptions[name.lower()]
        self._notify()
        await self._write([DeleteEntity(subscription.receivable.path)])

    # ------------------------------------------------------------------------------ sending
    def _validate(
        self, entity: _Entity, messages: Sequence[Message], scheduled: bool
    ) -> tuple[list[MessageId | None], list[str | None]]:
        """Check a whole send before judging any of it; returns each message's id (normalized) and dedup key."""
        props = entity.properties
        limit = props.max_message_size_in_kilobytes * 1024
        requires_session = isinstance(props, QueueProperties) and props.requires_session
        ids: list[MessageId | None] = []
        keys: list[str | None] = []
        total = 0
        for position, message in enumerate(messages):
            where = f"message {position + 1} of {len(messages)}" if len(messages) > 1 else "the message"
            if not isinstance(message, Message):
                raise InvalidArgumentError(f"{where} is a {type(message).__name__}, not a Message")
            try:
                check_message(message)
                message_id = None if message.message_id is None else normalize_message_id(message.message_id)
                validate_ids(message_id, message.partition_key, message.session_id)
                require_identifiable(
                    message_id,
                    message.partition_key,
                    message.session_id,
                    partitioned=props.enable_partitioning,
                    requires_duplicate_detection=props.requires_duplicate_detection,
                )
            except InvalidArgumentError as exc:
                raise type(exc)(f"{where}: {exc}") from None
            if requires_session and message.session_id is None:
                raise InvalidArgumentError(
                    f"{where}: the SessionId was not set on a message, and it cannot be sent to the entity "
                    f"{props.name!r}. Entities that have session support enabled can only receive messages "
                    "that have the SessionId set"
                )
            size = message.size
            if size > limit:
                raise MessageSizeExceededError(
                    f"{where} is {size} bytes, over the limit of {limit} bytes "
                    f"(max_message_size_in_kilobytes={props.max_message_size_in_kilobytes} of {props.name!r})"
                )
            total += size
            ids.append(message_id)
            if entity.detector.enabled and message_id is not None:
                keys.append(entity.detector.key_of_valid(message_id, message.partition_key, message.session_id))
            else:
                keys.append(None)
        if not scheduled and len(messages) > 1 and total > max(limit, 1024 * 1024):
            raise MessageSizeExceededError(
                f"the batch is {total} bytes, over the limit of {max(limit, 1024 * 1024)} bytes for one send"
            )
        for receivable in self._receivables(entity):
            if receivable.size_bytes + total > receivable.settings.max_size_bytes:
                raise QuotaExceededError(
                    f"The maximum entity size has been reached or exceeded for '{props.name}': "
                    f"max_size_in_megabytes={props.max_size_in_megabytes} ({receivable.settings.max_size_bytes} "
                    f"bytes); {receivable.path!r} holds {receivable.size_bytes} bytes and this send needs {total} more"
                )
        return ids, keys

    async def send(self, entity_name: str, messages: Message | Sequence[Message]) -> list[SendOutcome]:
        """Send one message or an atomic batch to a queue or topic."""
        batch = [messages] if isinstance(messages, Message) else list(messages)
        return await self._send(entity_name, batch, None)

    async def schedule_messages(
        self, entity_name: str, messages: Message | Sequence[Message], schedule_time_utc: datetime
    ) -> list[int]:
        """Schedule messages; returns their sequence numbers (for cancelling)."""
        batch = [messages] if isinstance(messages, Message) else list(messages)
        outcomes = await self._send(entity_name, batch, datetime_to_us(schedule_time_utc))
        return [o.sequence_number if o.sequence_number is not None else 0 for o in outcomes]

    async def _send(self, entity_name: str, batch: list[Message], scheduled_us: int | None) -> list[SendOutcome]:
        self._check_alive()
        if not batch:
            raise InvalidArgumentError("nothing to send: give at least one message")
        where = parse_path(entity_name)
        if where.subscription is not None or where.dead_letter:
            raise InvalidArgumentError(
                f"cannot send to {entity_name!r}: send to a queue or a topic, not to a subscription or "
                "a dead-letter queue"
            )
        entity = self._entity(where.entity)
        ids, keys = self._validate(entity, batch, scheduled_us is not None)
        now = self._now()
        verdicts_since = self._failed_writes
        ops: list[Op] = []
        outcomes: list[SendOutcome] = []
        stored: list[tuple[Receivable, StoredMessage]] = []
        deltas = dict.fromkeys(_COUNTERS, 0)
        late_delays: list[int] = []
        index = entity.detector.index  # keys are None when duplicate detection is off
        for message, given_id, key in zip(batch, ids, keys, strict=True):
            message_id: MessageId = given_id if given_id is not None else uuid.uuid4().hex
            verdict = index.judge(key, now) if key is not None else None
            if self.send_log is not None and key is not None:
                self.send_log(
                    {
                        "entity": entity.path,
                        "key": key,
                        "message_id": message_id if isinstance(message_id, str) else service_bus_text(message_id),
                        "time_us": now,
                        "outcome": "duplicate"
                        if verdict and verdict.duplicate
                        else ("late" if verdict and verdict.late_resend_delay_us is not None else "new"),
                        "window_us": to_micros(entity.detector.window),
                    }
                )
            if verdict is not None and verdict.duplicate:
                deltas["duplicates"] += 1
                outcomes.append(SendOutcome(message_id, None, True))
                continue
            late = verdict.late_resend_delay_us if verdict is not None else None
            if late is not None:
                deltas["late_resends"] += 1
                late_delays.append(late)
            seq = entity.next_sequence_number
            entity.next_sequence_number += 1
            deltas["accepted"] += 1
            record = self._stored(entity, message, message_id, seq, now, scheduled_us)
            dedup_key = None if key is None else (entity.path, key, now)
            for receivable, copy in self._fan_out(entity, message, record):
                stored.append((receivable, copy))
                ops.append(PutMessage(copy, dedup_key))
                dedup_key = None  # written once, with the first copy
            if dedup_key is not None:  # a topic without subscriptions still remembers the key
                ops.append(PutDedupKey(*dedup_key))
            outcomes.append(SendOutcome(message_id, seq, False, late))
        if deltas["accepted"]:
            counters = self._counters_op(entity, deltas)
            assert counters is not None
            ops.append(counters)

            def visible() -> None:  # counted and shown only once committed
                for name, delta in deltas.items():
                    entity.counters[name] += delta
                entity.late_delays_us.extend(late_delays)
                committed_at = self._now()
                for receivable, copy in stored:
                    receivable.add(copy, committed_at)
                self._notify()

            await self._write(ops, on_commit=visible, verdicts_since=verdicts_since if deltas["duplicates"] else None)
        else:  # duplicates only: acknowledged once what they duplicate is durable
            await self._barrier(verdicts_since)
            entity.counters["duplicates"] += deltas["duplicates"]
            entity.unsaved["duplicates"] = entity.unsaved.get("duplicates", 0) + deltas["duplicates"]
        return outcomes

    def _stored(
        self, entity: _Entity, message: Message, message_id: MessageId, seq: int, now: int, scheduled_us: int | None
    ) -> StoredMessage:
        if scheduled_us is None and message.scheduled_enqueue_time_utc is not None:
            scheduled_us = datetime_to_us(message.scheduled_enqueue_time_utc)
        ttl = entity.properties.default_message_time_to_live
        if message.time_to_live is not None:
            ttl = min(ttl, message.time_to_live)
        ttl_us = None if ttl >= TIMESPAN_MAX else to_micros(ttl)
        enqueued = scheduled_us if scheduled_us is not None and scheduled_us > now else now
        return StoredMessage(
            path=entity.path,
            sequence_number=seq,
            message_id=message_id,
            body=bytes(message.body),
            enqueued_time_us=enqueued,
            expires_at_us=add_us(enqueued, ttl_us),  # None: never (no time to live, or past year 9999)
            state=MessageState.SCHEDULED if scheduled_us is not None and scheduled_us > now else MessageState.ACTIVE,
            session_id=message.session_id,
            partition_key=message.partition_key,
            correlation_id=message.correlation_id,
            subject=message.subject,
            content_type=message.content_type,
            reply_to=message.reply_to,
            reply_to_session_id=message.reply_to_session_id,
            to=message.to,
            application_properties=dict(message.application_properties),
            time_to_live_us=ttl_us,
            scheduled_enqueue_time_us=scheduled_us,
            wire=message.wire,
        )

    def _fan_out(
        self, entity: _Entity, message: Message, record: StoredMessage
    ) -> list[tuple[Receivable, StoredMessage]]:
        if entity.receivable is not None:
            return [(entity.receivable, record)]
        copies = []
        for subscription in entity.subscriptions.values():
            if subscription.accepts(message):
                copy = record.copy_for(subscription.receivable.path)
                ttl = subscription.properties.default_message_time_to_live
                if ttl < TIMESPAN_MAX and (copy.time_to_live_us is None or to_micros(ttl) < copy.time_to_live_us):
                    copy.time_to_live_us = to_micros(ttl)
                    copy.expires_at_us = add_us(copy.enqueued_time_us, copy.time_to_live_us)
                copies.append((subscription.receivable, copy))
        return copies

    async def cancel_scheduled_messages(self, entity_name: str, sequence_numbers: Iterable[int]) -> None:
        """Cancel scheduled messages; their dedup keys stay in the history."""
        self._check_alive()
        entity = self._entity(entity_name)
        targets: list[tuple[Receivable, StoredMessage]] = []
        for seq in sequence_numbers:
            found = [
                (r, r.messages[seq])
                for r in self._receivables(entity)
                if seq in r.messages and r.messages[seq].state == MessageState.SCHEDULED
            ]
            if not found and not (entity.kind == "topic" and 0 < seq < entity.next_sequence_number):
                raise MessageNotFoundError(
                    f"no scheduled message with sequence number {seq} in {entity.properties.name!r}"
                )
            targets += found
        ops: list[Op] = []
        for receivable, message in targets:
            ops += receivable.remove(message)
        await self._write(ops)

    # ------------------------------------------------------------------------------ receiving
    async def receive(
        self,
        path: str,
        max_message_count: int = 1,
        *,
        receive_mode: ServiceBusReceiveMode = ServiceBusReceiveMode.PEEK_LOCK,
        max_wait_time: float | None = 0.0,
        session: SessionLock | None = None,
    ) -> list[ReceivedMessage]:
        """Receive up to ``max_message_count`` messages, waiting up to ``max_wait_time`` s for the first.

        ``max_wait_time=None`` waits until a message arrives.
        """
        if max_message_count < 1:
            raise InvalidArgumentError(f"max_message_count must be at least 1, not {max_message_count}")
        loop = asyncio.get_running_loop()
        deadline = None if max_wait_time is None else loop.time() + max_wait_time
        while True:
            receivable = self.receivable(path)
            session_id = self._check_session(receivable, session, path)
            got: list[StoredMessage] = []
            while len(got) < max_message_count:
                message = receivable.take(session_id)
                if message is None:
                    break
                got.append(message)
            if got:
                return await self._deliver(receivable, got, receive_mode, session)
            if not await self._wait(deadline):
                return []

    def _check_session(self, receivable: Receivable, session: SessionLock | None, path: str) -> str | None:
        if receivable.settings.requires_session and not receivable.is_dead_letter:
            if session is None:
                raise InvalidArgumentError(
                    f"It is not possible for an entity that requires sessions to create a non-sessionful "
                    f"message receiver: {path!r} requires sessions; accept a session first"
                )
            self._session_lock(receivable, session)
            return session.session_id
        if session is not None:
            raise InvalidArgumentError(f"{path!r} does not require sessions; receive without a session")
        return None

    def _session_lock(self, receivable: Receivable, session: SessionLock) -> SessionLock:
        current = receivable.sessions.get(session.session_id)
        if current is None or current.lock_token != session.lock_token:
            raise SessionLockLostError(
                f"the lock on session {session.session_id!r} of {receivable.path!r} was lost "
                "(it expired or was closed); accept the session again"
            )
        return current

    async def _deliver(
        self,
        receivable: Receivable,
        messages: list[StoredMessage],
        mode: ServiceBusReceiveMode,
        session: SessionLock | None,
    ) -> list[ReceivedMessage]:
        now = self._now()
        if mode == ServiceBusReceiveMode.RECEIVE_AND_DELETE:
            out = []
            ops: list[Op] = []
            for message in messages:
                message.delivery_count += 1
                out.append(ReceivedMessage.of(message))
                ops += receivable.remove(message)
            await self._write(ops)
            return out
        for message in messages:
            message.delivery_count += 1
            receivable.lock(message, now, session)
        return [ReceivedMessage.of(m) for m in messages]

    def _locked(self, path: str, lock_token: uuid.UUID | str) -> tuple[Receivable, StoredMessage]:
        receivable = self.receivable(path)
        token = lock_token if isinstance(lock_token, uuid.UUID) else uuid.UUID(str(lock_token))
        seq = receivable.locks.get(token)
        if seq is None:
            why = receivable.lost_tokens.get(token)
            if why == "session":
                raise SessionLockLostError(
                    "The session lock has expired on the MessageSession. Accept a new MessageSession."
                )
            raise MessageLockLostError(
                f"The lock supplied is invalid. Either the lock expired, or the message has already been "
                f"removed from the queue ({receivable.path}, lock token {token})"
            )
        message = receivable.messages[seq]
        if receivable.settings.requires_session and message.session_id in receivable.sessions:
            session = receivable.sessions[message.session_id or ""]
            if token not in session.locked_messages:
                raise SessionLockLostError("the session lock that delivered this message was lost")
        return receivable, message

    async def complete(self, path: str, lock_token: uuid.UUID | str) -> None:
        receivable, message = self._locked(path, lock_token)
        ops = receivable.remove(message)
        self._drop_session_token(receivable, message)
        await self._settle(ops)

    async def abandon(
        self, path: str, lock_token: uuid.UUID | str, properties_to_modify: dict[str, Any] | None = None
    ) -> None:
        receivable, message = self._locked(path, lock_token)
        if properties_to_modify:
            message.application_properties.update(properties_to_modify)
        self._drop_session_token(receivable, message)
        ops = receivable.unlock(message, self._now())
        if message.sequence_number in receivable.messages:
            ops.append(PutMessage(message))
        self._notify()
        await self._settle(ops)

    async def defer(self, path: str, lock_token: uuid.UUID | str) -> None:
        receivable, message = self._locked(path, lock_token)
        self._drop_session_token(receivable, message)
        message.state = MessageState.DEFERRED
        receivable.unlock(message, self._now())
        await self._settle([PutMessage(message)])

    async def dead_letter(
        self,
        path: str,
        lock_token: uuid.UUID | str,
        reason: str | None = None,
        error_description: str | None = None,
    ) -> None:
        receivable, message = self._locked(path, lock_token)
        if receivable.is_dead_letter:
            raise InvalidArgumentError("a message in a dead-letter queue cannot be dead-lettered again")
        self._drop_session_token(receivable, message)
        ops = receivable.move_to_dead_letter(message, reason, error_description)
        await self._settle(ops)

    async def _settle(self, ops: list[Op]) -> None:
        """Settlements are acknowledged once durable: a completed message never comes back after a crash."""
        await self._write(ops)

    def _drop_session_token(self, receivable: Receivable, message: StoredMessage) -> None:
        if message.session_id is not None and message.lock_token is not None:
            session = receivable.sessions.get(message.session_id)
            if session is not None:
                session.locked_messages.discard(message.lock_token)

    async def renew_lock(self, path: str, lock_token: uuid.UUID | str) -> datetime:
        receivable, message = self._locked(path, lock_token)
        if receivable.settings.requires_session and not receivable.is_dead_letter:
            session = receivable.sessions[message.session_id or ""]
            return us_to_datetime(session.locked_until_us)
        message.locked_until_us = clamp_us(self._now() + receivable.settings.lock_duration_us)
        receivable.push_lock_expiry(message)
        assert message.locked_until_us is not None
        return us_to_datetime(message.locked_until_us)

    async def receive_deferred_messages(
        self,
        path: str,
        sequence_numbers: Iterable[int],
        *,
        receive_mode: ServiceBusReceiveMode = ServiceBusReceiveMode.PEEK_LOCK,
        session: SessionLock | None = None,
    ) -> list[ReceivedMessage]:
        receivable = self.receivable(path)
        session_id = self._check_session(receivable, session, path)
        found = []
        for seq in sequence_numbers:
            message = receivable.messages.get(seq)
            if (
                message is None
                or message.state != MessageState.DEFERRED
                or message.lock_token is not None
                or (session_id is not None and message.session_id != session_id)
            ):
                raise MessageNotFoundError(
                    f"Failed to lock one or more specified messages. Either the message is not deferred or "
                    f"already locked: no deferred message with sequence number {seq} in {receivable.path!r}"
                )
            found.append(message)
        return await self._deliver(receivable, found, receive_mode, session)

    def peek_messages(
        self,
        path: str,
        max_message_count: int = 1,
        *,
        sequence_number: int = 0,
        session_id: str | None = None,
    ) -> list[ReceivedMessage]:
        """Messages from ``sequence_number`` on, in order, whatever their state; nothing is locked."""
        receivable = self.receivable(path)
        chosen = sorted(
            seq
            for seq, m in receivable.messages.items()
            if seq >= sequence_number and (session_id is None or m.session_id == session_id)
        )[:max_message_count]
        return [ReceivedMessage.of(receivable.messages[seq]) for seq in chosen]

    # ------------------------------------------------------------------------------ sessions
    async def accept_session(
        self, path: str, session_id: str | None = None, *, max_wait_time: float | None = 0.0
    ) -> SessionLock:
        """Lock a named session, or the next session with available messages."""
        loop = asyncio.get_running_loop()
        deadline = None if max_wait_time is None else loop.time() + max_wait_time
        while True:
            receivable = self.receivable(path)
            if not receivable.settings.requires_session or receivable.is_dead_letter:
                raise InvalidArgumentError(f"{path!r} does not require sessions; receive without a session")
            now = self._now()
            if session_id is not None:
                validate_ids(None, None, session_id)
                if session_id in receivable.sessions:
                    raise SessionCannotBeLockedError(
                        f"The requested session '{session_id}' cannot be accepted. It may be locked by another "
                        "receiver."
                    )
                return self._lock_session(receivable, session_id, now)
            candidate = receivable.next_available_session()
            if candidate is not None:
                return self._lock_session(receivable, candidate, now)
            if not await self._wait(deadline):
                raise OperationTimeoutError(f"no unlocked session with messages in {path!r} became available")

    def _lock_session(self, receivable: Receivable, session_id: str, now: int) -> SessionLock:
        lock = SessionLock(
            receivable.path, session_id, uuid.uuid4(), clamp_us(now + receivable.settings.lock_duration_us)
        )
        receivable.sessions[session_id] = lock
        return lock

    async def renew_session_lock(self, session: SessionLock) -> datetime:
        receivable = self.receivable(session.path)
        current = self._session_lock(receivable, session)
        current.locked_until_us = clamp_us(self._now() + receivable.settings.lock_duration_us)
        for token in current.locked_messages:
            seq = receivable.locks.get(token)
            if seq is not None:
                receivable.messages[seq].locked_until_us = current.locked_until_us
        session.locked_until_us = current.locked_until_us
        return us_to_datetime(current.locked_until_us)

    async def close_session(self, session: SessionLock) -> None:
        """Release a session lock; messages still locked under it become available again."""
        receivable = self._receivable_by_path(session.path)
        if receivable is None:
            return
        current = receivable.sessions.get(session.session_id)
        if current is not None and current.lock_token == session.lock_token:
            self._write_later(receivable.release_session(session.session_id, self._now(), reason="session"))
            self._notify()

    async def get_session_state(self, session: SessionLock) -> bytes | None:
        receivable = self.receivable(session.path)
        self._session_lock(receivable, session)
        return receivable.session_states.get(session.session_id)

    async def set_session_state(self, session: SessionLock, state: bytes | None) -> None:
        receivable = self.receivable(session.path)
        self._session_lock(receivable, session)
        if state is None:
            receivable.session_states.pop(session.session_id, None)
        else:
            receivable.session_states[session.session_id] = bytes(state)
        await self._write([PutSessionState(receivable.path, session.session_id, state)])

    def list_sessions(self, path: str) -> list[str]:
        return self.receivable(path).session_ids()

    # ------------------------------------------------------------------------------ statistics
    def stats(self, entity_name: str) -> dict[str, Any]:
        """Per-entity statistics, including what Azure drops silently (only what was committed)."""
        self._check_alive()
        entity = self._entity(entity_name)
        now = self._now()
        index = entity.detector.index
        if entity.detector.enabled:
            index.expire(now)
        oldest = index.oldest_first_accepted_us() if entity.detector.enabled else None
        delays = sorted(entity.late_delays_us)
        out: dict[str, Any] = {
            "name": entity.properties.name,
            "kind": entity.kind,
            "requires_duplicate_detection": entity.detector.enabled,
            "duplicate_detection_history_time_window": entity.properties.to_dict()[
                "duplicate_detection_history_time_window"
            ],
            "enable_partitioning": entity.properties.enable_partitioning,
            "accepted": entity.counters["accepted"],
            "duplicates_dropped": entity.counters["duplicates"],
            "keys_held": len(index) if entity.detector.enabled else 0,
            "index_bytes": index.nbytes() if entity.detector.enabled else 0,
            "oldest_key_age_seconds": None if oldest is None else (now - oldest) / 1e6,
            "late_resends": entity.counters["late_resends"],
            "late_resend_delay_seconds": {
                "p50": delays[len(delays) // 2] / 1e6 if delays else None,
                "p99": delays[min(len(delays) - 1, int(len(delays) * 0.99))] / 1e6 if delays else None,
                "max": delays[-1] / 1e6 if delays else None,
                "recent": [d / 1e6 for d in list(entity.late_delays_us)[-10:]],
            },
            "next_sequence_number": entity.next_sequence_number,
        }
        if entity.receivable is not None:
            out.update(entity.receivable.counts())
        else:
            out["subscriptions"] = {s.properties.name: s.receivable.counts() for s in entity.subscriptions.values()}
        return out

    def entity_names(self) -> list[str]:
        return [e.properties.name for e in self._entities.values()]

    async def reset(self) -> None:
        """Delete every entity with its messages, sessions, counters and dedup history, in one commit, and
        let the time start again from the clock's reading (``oncebus.testing``'s fresh namespace per test)."""
        self._check_alive()
        paths = list(self._entities)
        self._entities.clear()
        self._floor_us = 0
        self._notify()
        if paths:
            await self._write([DeleteEntity(path) for path in paths])
