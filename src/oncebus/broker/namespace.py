"""The broker engine: one namespace of queues, topics and subscriptions (the facade front ends call).

All state lives on one asyncio event loop; front ends (AMQP, HTTP, the CLI's
control socket) call these coroutines from that loop and never share the
structures. The parts:

- ``journal``: units written to the store, acknowledged once durable; a failed
  write refuses work until what the store holds is reloaded (``recovery``);
- ``signals``: receivers waiting for messages are woken on changes;
- ``registry``: queues, topics and subscriptions, created, updated, deleted, looked up;
- ``sending``: a send validated (``oncebus.core.sending``), judged by the
  entity's ``DuplicateDetector``, stored as one unit, fanned out once committed;
- ``delivery``: receiving, settling, sessions (a mixin of the namespace's);
- here: the facade, lifecycle, timers; ``stats`` (``broker.stats``).

Nothing is counted before it is committed; a send that was judged a duplicate
of a send whose write then failed is refused too, so the sender resends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, cast

from oncebus.broker.clock import Clock, SystemClock
from oncebus.broker.contents import ContentCache
from oncebus.broker.counters import EntityView
from oncebus.broker.delivery import Delivery
from oncebus.broker.faults import FaultBook
from oncebus.broker.journal import Journal
from oncebus.broker.observation import NamespaceObserver, view_entities
from oncebus.broker.paths import parse_path, subscription_path
from oncebus.broker.receivable import Receivable
from oncebus.broker.recovery import (
    DedupCheckpoints,
    KeyLoader,
    newest_time_us,
    restore,
    restore_messages_in_steps,
)
from oncebus.broker.registry import Entity, EntityKind, Registry, Subscription
from oncebus.broker.routing import Router
from oncebus.broker.rulebook import Rules
from oncebus.broker.runtime_properties import (
    RuntimeProperties,
    queue_runtime_properties,
    subscription_runtime_properties,
    topic_runtime_properties,
)
from oncebus.broker.sending import Sender, SendLog, SendOutcome
from oncebus.broker.signals import ChangeSignal, wait_any, wait_until
from oncebus.broker.stats import EntityStats, entity_stats
from oncebus.broker.transactions import Transactions
from oncebus.broker.upkeep import Activity, delete_idle, pump_forwarding, release_scheduled
from oncebus.core.durations import to_micros
from oncebus.core.entities import QueueProperties, SubscriptionProperties, TopicProperties, entity_of_path
from oncebus.core.errors import (
    EntityDisabledError,
    EntityNotFoundError,
    InvalidArgumentError,
    OncebusError,
    ServerBusyError,
    StoreError,
    StoreWriteError,
)
from oncebus.core.messages import Message, MessageState
from oncebus.core.rules import RuleProperties
from oncebus.core.tiers import STANDARD, TierQuotas
from oncebus.core.timeutil import datetime_to_us
from oncebus.store.base import (
    DeleteEntity,
    MessageRow,
    MoveMessage,
    Op,
    PruneDedupKeys,
    PutMessage,
    Store,
    UpdateMessage,
)

__all__ = ["Namespace", "SendLog", "SendOutcome"]

PRUNE_EVERY_US = 60_000_000
MAX_BATCH_DELETE = 500
"""The most messages one batch delete removes: Service Bus's Standard tier (its Premium tier: 4000)."""
POLL_SECONDS = 0.25
RESOLVED_KEPT = 1024
"""The most path strings whose resolution ``Namespace.receivable`` keeps (past it, it starts again)."""
_LOG = logging.getLogger("oncebus.broker")


@dataclasses.dataclass(frozen=True, slots=True)
class _Resolved:
    """What a path string resolved to, valid while ``entity`` (and ``subscription``) is the one registered."""

    receivable: Receivable
    entity: Entity
    entity_key: str
    subscription: Subscription | None
    subscription_key: str
    touched: tuple[str, ...]  # the paths a use of it keeps from idling (the topic's and the subscription's)


class Namespace(Delivery):
    """A Service Bus namespace. Create with ``await Namespace.open(store)``."""

    def __init__(
        self,
        store: Store,
        clock: Clock | None = None,
        *,
        send_log: SendLog | None = None,
        quotas: TierQuotas = STANDARD,
        checkpoint_keys: int | None = None,
        checkpoint_seconds: float | None = None,
    ) -> None:
        self.store = store
        self.clock = clock or SystemClock()
        self.quotas = quotas  # the tier (Standard or Premium) and Azure's quotas on it
        self._registry = Registry(quotas)
        self._entities = self._registry.entities  # the same dict, for readers of the namespace's entities
        self._resolved: dict[str, _Resolved] = {}  # see ``receivable``
        self._changes = ChangeSignal()
        self._journal = Journal(store, reload=self._load, reloaded=self._notify)
        self._contents = ContentCache(store)
        self._router = Router(lambda name: self._entities.get(name.lower()), self._touch)
        self._sender = Sender(self._registry, self._journal, self._now, send_log, self._contents, self._router)
        self._floor_us = 0  # time never runs backwards for the broker, across restarts too
        self._timer_error: str | None = None
        self._activity = Activity(self.clock.now_us())  # auto_delete_on_idle
        self._rules = Rules(self._registry, self._journal, self._now, self._touch_subscription)
        self.observer = NamespaceObserver()  # metrics, dashboard history, per-minute duplicate log
        self.observer.attach_store(store)
        self._backlog: asyncio.Task[None] | None = None  # the stored messages, restored after open returned
        self._backlog_loaded = asyncio.Event()
        self._backlog_loaded.set()
        self._backlog_error: BaseException | None = None
        self._checkpoints = DedupCheckpoints(  # dedup images while serving (recovery); None: its defaults
            store, self._registry, keys=checkpoint_keys, min_seconds=checkpoint_seconds
        )
        self.faults = FaultBook(self.clock.now_us)  # failures armed by a test (oncebus.broker.faults)
        self.transactions = Transactions(self)  # open AMQP transactions (oncebus.broker.transactions)

    # ------------------------------------------------------------------------------ lifecycle
    @classmethod
    async def open(
        cls,
        store: Store,
        clock: Clock | None = None,
        *,
        send_log: SendLog | None = None,
        backlog_in_background: bool = False,
        quotas: TierQuotas = STANDARD,
        checkpoint_keys: int | None = None,
        checkpoint_seconds: float | None = None,
    ) -> Namespace:
        """``backlog_in_background``: return once entities and dedup keys are loaded (sends are judged exactly
        from then on) and restore the stored messages in steps on the loop; until that is done, what reads or
        removes stored messages (receiving, peeking, sessions, entity changes, the timers) waits for it."""
        namespace = cls(
            store,
            clock,
            send_log=send_log,
            quotas=quotas,
            checkpoint_keys=checkpoint_keys,
            checkpoint_seconds=checkpoint_seconds,
        )
        namespace._load(background=backlog_in_background)
        return namespace

    def _load(self, *, background: bool = False) -> None:
        if self._backlog is not None:  # a reload after a failed write: everything again, at once
            self._backlog.cancel()
            self._backlog = None
        snapshot = self.store.load()
        self._entities.clear()
        self._contents.clear()
        self._floor_us = max(self._floor_us, newest_time_us(snapshot))
        keys = restore(self._registry, snapshot, self._now(), messages=not background)
        self._checkpoints.loaded(keys.read, keys)
        self._activity.since_us = self._now()
        forget = self._activity.restore(self._registry, self._now())
        if forget:  # the first write: every later one (each acknowledged send) commits with it or after it
            self._write_later(forget)
        self._backlog_error = None
        if background:
            self._backlog_loaded.clear()
            self._backlog = asyncio.get_running_loop().create_task(self._restore_backlog(snapshot.messages, keys))
        else:
            self._backlog_loaded.set()

    async def _restore_backlog(self, rows: Iterable[MessageRow], keys: KeyLoader) -> None:
        try:
            await keys.loaded()  # the dedup images load on a thread first: one GIL, so not both at once
            for _ in restore_messages_in_steps(self._registry, rows, self._now):
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._backlog_error = exc
            _LOG.error("the stored messages could not be loaded: %s", exc)
        finally:
            if self._backlog is asyncio.current_task():
                self._backlog = None
            self._backlog_loaded.set()
            self._notify()

    async def backlog_restored(self) -> None:
        """Wait until the stored messages are all in memory (see ``open``)."""
        await self._backlog_restored()

    async def _backlog_restored(self) -> None:
        if not self._backlog_loaded.is_set():
            await self._backlog_loaded.wait()
        if self._backlog_error is not None:
            raise StoreError(f"the stored messages could not be loaded: {self._backlog_error}")

    def _require_backlog(self) -> None:
        """``_backlog_restored`` for what cannot wait: refused, to be tried again, while the backlog loads."""
        if not self._backlog_loaded.is_set():
            raise ServerBusyError("oncebus is loading the stored messages after a restart; try again shortly")
        if self._backlog_error is not None:
            raise StoreError(f"the stored messages could not be loaded: {self._backlog_error}")

    async def close(self) -> None:
        """Persist the counts not stored yet, and the locks this stop ends; the store stays open (its owner
        closes it)."""
        self._journal.cancel()
        if self._backlog is not None:
            self._backlog.cancel()
        if self._journal.failure is None:
            ops: list[Op] = self._locks_ended()
            ops += [op for e in self._entities.values() if (op := e.counters_op({})) is not None]
            ops += self._activity.save(self._registry, self._now())
            if ops:
                await self._write(ops)
        if self._journal.failure is None:  # memory holds exactly what the store does
            entities = self._entities
            self.store.keep_dedup_images(
                lambda: [(path, e.detector) for path, e in entities.items() if e.detector.enabled], self._now()
            )

    def _locks_ended(self) -> list[Op]:
        """Every message still locked, given back as a lock that expired is: its delivery, counted when it was
        locked, is stored (a restart would otherwise forget it), and a message whose delivery was its last goes to
        the dead letters (``Receivable.unlock``)."""
        now = self._now()
        ops: list[Op] = []
        for entity in self._entities.values():
            for receivable in entity.receivables():
                for held in (receivable, receivable.dead_letter_queue):
                    if held is None:
                        continue
                    for seq in list(held.locks.values()):
                        entry = held.messages[seq]
                        ops.append(UpdateMessage(held.path, seq, int(entry.state), entry.delivery_count, None))
                        ops += held.unlock(entry, now)
        return ops

    @property
    def send_log(self) -> SendLog | None:
        return self._sender.send_log

    @property
    def reloads(self) -> int:
        """Reloads from the store after failed writes, so far."""
        return self._journal.reloads

    @property
    def _failure(self) -> StoreWriteError | None:
        return self._journal.failure

    # ------------------------------------------------------------------------------ journal, time, signals
    def _check_alive(self) -> None:
        self._journal.check_alive()

    async def _write(self, ops: Sequence[Op]) -> None:
        await self._journal.write(ops, self._note_moves(ops))

    @contextlib.asynccontextmanager
    async def one_unit(self) -> AsyncIterator[None]:
        """Every change made inside is stored in one transaction when the block ends, even if it raises (memory
        moved already): a crash before that commit leaves the store as it was, after it, all of the block's
        changes. Only while nothing else changes the namespace (``oncebus serve`` applying ``--config``)."""
        self._journal.start_batch()
        try:
            yield
        finally:
            await self._journal.end_batch()

    def _write_later(self, ops: Sequence[Op]) -> None:
        if ops:
            self._journal.write_later(ops, self._note_moves(ops))

    def _note_moves(self, ops: Sequence[Op]) -> Callable[[], None] | None:
        """Memory runs ahead of the store for messages dead-lettered (their move) and placed by the timers
        (forwarded, released from a topic's schedule): until the write is committed, their content is read
        from memory or where it was (see ``_contents_of``)."""
        moves = [op for op in ops if isinstance(op, MoveMessage)]
        contents = self._contents
        placed = [op.message for op in ops if isinstance(op, PutMessage) and contents.pinned(op.message)]
        if not moves and not placed:
            return None
        for move in moves:
            contents.move(move)

        def committed() -> None:
            for move in moves:
                contents.moved(move)
            for record in placed:
                contents.unpin(record)

        return committed

    def _now(self) -> int:
        now = self.clock.now_us()
        if now < self._floor_us:
            return self._floor_us
        self._floor_us = now
        return now

    def _notify(self) -> None:
        self._changes.notify()

    async def _wait(self, deadline: float | None, receivable: Receivable) -> bool:
        """Wait for a change of ``receivable`` (or of the whole namespace) or the next poll; False once the
        deadline (loop time) has passed."""
        return await wait_until((self._changes, receivable.changes), deadline, POLL_SECONDS)

    async def wait_for_change(
        self, timeout: float, wake: asyncio.Future[None] | None = None, *, path: str | None = None
    ) -> None:
        """Return when messages may have become available at ``path`` (a send committed, an abandon, a lock
        released, a scheduled message due) or something changed for every receiver (an entity deleted, a
        reset), when ``wake`` completes, or after ``timeout`` seconds. Without ``path``: any change at all
        is not reported, only the namespace-wide ones. A path that no longer resolves waits for the
        namespace-wide ones only (the caller's next receive reports why): returning at once would never
        suspend, and a caller with nothing to ask for (a link without credit whose queue was deleted) would
        loop on it without giving the event loop back."""
        signals = [self._changes]
        if path is not None:
            try:
                signals.append(self._registry.resolve(parse_path(path)).changes)
            except OncebusError:
                pass
        await wait_any(signals, timeout, wake)

    def entity_gone(self, path: str) -> EntityNotFoundError | None:
        """None while the queue, topic or subscription ``path`` names (a dead-letter sub-queue: its owner's) exists;
        otherwise the error saying it is not found. Touches nothing (no activity, no clock read)."""
        where = parse_path(path)
        try:
            if where.subscription is None:
                self._registry.entity(where.entity)
            else:
                self._registry.subscription(where.entity, where.subscription)
        except EntityNotFoundError as exc:
            return exc
        return None

    def tick(self) -> None:
        """Apply everything due now (scheduled enqueues, lock and message expiry, history pruning,
        forwarding, idle entities: see ``upkeep``)."""
        if self._journal.failure is not None or not self._backlog_loaded.is_set():
            return  # memory is reloaded from the store before anything is due again (or still loading)
        now = self._now()
        ops: list[Op] = delete_idle(self._registry, self._activity, now)
        if ops:  # entities deleted: their links learn it as from an explicit delete
            self._notify()
        ops += release_scheduled(self._registry, self._router, now, self._contents)
        for entity in self._entities.values():
            for receivable in entity.receivables():
                ops += receivable.advance(now)
                if receivable.dead_letter_queue is not None:
                    ops += receivable.dead_letter_queue.advance(now)
            if entity.detector.enabled:
                entity.detector.expire(now)
                if now - entity.last_prune_us >= PRUNE_EVERY_US:
                    entity.last_prune_us = now
                    ops.append(PruneDedupKeys(entity.path, now - to_micros(entity.detector.window) + 1))
        for op in ops:  # dead-lettered just now: forwarded below before the move is written
            if isinstance(op, MoveMessage):
                self._contents.move(op)
        ops += pump_forwarding(self._registry, self._router, now, self._contents)
        self._write_later(ops)
        self._checkpoints.tick(now)  # after this step's writes were submitted: the image holds their keys
        self.observer.tick(self._entities, now)  # what became available woke its own receivers (Receivable.changes)

    def checkpoint_dedup(self) -> bool:
        """Start a dedup checkpoint now (see ``recovery.DedupCheckpoints``); False if the store has none or one is
        being written."""
        if self._journal.failure is not None:
            return False
        return self._checkpoints.start(self._now())

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

    # ------------------------------------------------------------------------------ entities
    def _entity(self, name: str, kind: EntityKind | None = None) -> Entity:
        return self._registry.entity(name, kind)

    def _touch(self, path: str) -> None:
        """Activity on the queue, topic or subscription at ``path`` (lower case): not idle."""
        self._activity.touch(path, self._now())

    def receivable(self, path: str) -> Receivable:
        """The queue, subscription or dead-letter sub-queue at ``path`` (advanced to now).

        Every receive and settlement asks this with the same few path strings: what a path resolved to is kept
        (``_resolved``) and used while its entity (and subscription) is still the object registered under its
        name, so a path of an entity deleted, or deleted and created again, or reloaded after a failed write,
        resolves afresh. One clock read."""
        if self._journal.failure is not None:
            self._journal.check_alive()
        now = self._now()
        hit = self._resolved.get(path)
        if hit is None or self._entities.get(hit.entity_key) is not hit.entity:
            hit = self._resolve(path)
        elif (sub := hit.subscription) is not None and hit.entity.subscriptions.get(hit.subscription_key) is not sub:
            hit = self._resolve(path)
        last = self._activity.last
        for touched in hit.touched:
            last[touched] = now
        receivable = hit.receivable
        ops = receivable.advance(now)
        if ops:
            self._write_later(ops)
        return receivable

    def _resolve(self, path: str) -> _Resolved:
        where = parse_path(path)
        receivable = self._registry.resolve(where)
        entity = self._entities[where.entity]
        if where.subscription is None:
            hit = _Resolved(receivable, entity, where.entity, None, "", (where.entity,))
        else:
            subscription = entity.subscriptions[where.subscription]
            touched = (where.entity, subscription_path(where.entity, where.subscription))
            hit = _Resolved(receivable, entity, where.entity, subscription, where.subscription, touched)
        if len(self._resolved) >= RESOLVED_KEPT:  # paths are the clients': a bound on what they can make it hold
            self._resolved.clear()
        self._resolved[path] = hit
        return hit

    def queue_runtime_properties(self, name: str) -> RuntimeProperties:
        """The queue's counts and sizes, as ``ServiceBusAdministrationClient`` names them."""
        return queue_runtime_properties(self, name)

    def topic_runtime_properties(self, name: str) -> RuntimeProperties:
        return topic_runtime_properties(self, name)

    def subscription_runtime_properties(self, topic_name: str, name: str) -> RuntimeProperties:
        return subscription_runtime_properties(self, topic_name, name)

    def open_receiver(self, path: str) -> Callable[[], None]:
        """A receiver opens on ``path`` (an AMQP receiver link): counted against the tier's concurrent receive
        requests per queue or topic (server busy past it); call the returned function when it closes."""
        return self._registry.open_receiver(path)

    def check_receivable(self, path: str, *, sessionful: bool | None = None) -> None:
        """Raise the error a receiver of ``path`` would meet (no such entity, a topic, disabled, ...); nothing else.
        ``sessionful=False``: a receiver without a session, refused on an entity that requires sessions (Service
        Bus refuses it when its link opens, not at its first receive)."""
        receivable = self.receivable(path)
        self._check_status(path, "receive")
        if sessionful is False:
            self._check_session(receivable, None, path)

    def _check_status(self, path: str, operation: str) -> None:
        """Refuse a send or a receive that the status of the entity (or of the subscription's topic) forbids."""
        where = parse_path(path)
        entity = self._entities.get(where.entity)
        if entity is None:
            return  # what looks the entity up says so
        blocked = ("Disabled", "SendDisabled") if operation == "send" else ("Disabled", "ReceiveDisabled")
        statuses = [(entity.properties.name, entity.properties.status)]
        subscription = entity.subscriptions.get(where.subscription) if where.subscription is not None else None
        if subscription is not None:
            name = f"{entity.properties.name}/Subscriptions/{subscription.properties.name}"
            statuses.append((name, subscription.properties.status))
        for name, status in statuses:
            if status in blocked:
                raise EntityDisabledError(
                    f"Messaging entity '{name}' is currently disabled: its status is {status}, which refuses "
                    f"{operation}s until it is Active again"
                )

    async def create_entity(self, kind: EntityKind, name: str, **properties: Any) -> QueueProperties | TopicProperties:
        self._check_alive()
        props, ops = self._registry.create(kind, name, properties, self._now())
        self._touch(name.lower())
        await self._write(ops)
        return cast(QueueProperties | TopicProperties, props)

    async def update_entity(self, kind: EntityKind, name: str, **changes: Any) -> QueueProperties | TopicProperties:
        self._check_alive()
        props, ops = self._registry.update(kind, name, changes, self._now())
        self._touch(name.lower())
        await self._write(ops)
        return cast(QueueProperties | TopicProperties, props)

    async def delete_entity(self, kind: EntityKind, name: str) -> None:
        await self._backlog_restored()
        self._check_alive()
        ops = self._registry.delete(kind, name)
        self._notify()
        await self._write(ops)

    def get_entity(self, kind: EntityKind, name: str) -> QueueProperties | TopicProperties:
        entity = self._registry.entity(name, kind)
        self._touch(entity.path)
        return entity.properties

    async def create_queue(self, name: str, **properties: Any) -> QueueProperties:
        return cast(QueueProperties, await self.create_entity("queue", name, **properties))

    async def create_topic(self, name: str, **properties: Any) -> TopicProperties:
        return cast(TopicProperties, await self.create_entity("topic", name, **properties))

    async def update_queue(self, name: str, **changes: Any) -> QueueProperties:
        return cast(QueueProperties, await self.update_entity("queue", name, **changes))

    async def update_topic(self, name: str, **changes: Any) -> TopicProperties:
        return cast(TopicProperties, await self.update_entity("topic", name, **changes))

    async def delete_queue(self, name: str) -> None:
        await self.delete_entity("queue", name)

    async def delete_topic(self, name: str) -> None:
        await self.delete_entity("topic", name)

    def authorization_rules(self, path: str) -> list[tuple[str, tuple[str, str], tuple[str, ...]]]:
        """The shared access rules of the queue or topic ``path`` belongs to (its subscriptions, sub-queues and
        ``$management`` node included): (key name, (primary, secondary key), rights) each. ``a/b`` belongs to the
        entity ``a/b`` (none when there is none), never to ``a``: a rule of ``a`` reaches no other entity."""
        entity = self._entities.get(entity_of_path(path.lower()))
        if entity is None or entity.kind not in ("queue", "topic"):
            return []
        rules = getattr(entity.properties, "authorization_rules", ())
        return [(r.key_name, (r.primary_key, r.secondary_key), r.rights) for r in rules]

    def get_queue(self, name: str) -> QueueProperties:
        return cast(QueueProperties, self.get_entity("queue", name))

    def get_topic(self, name: str) -> TopicProperties:
        return cast(TopicProperties, self.get_entity("topic", name))

    def list_queues(self) -> list[QueueProperties]:
        return [cast(QueueProperties, e.properties) for e in self._registry.of_kind("queue")]

    def list_topics(self) -> list[TopicProperties]:
        return [cast(TopicProperties, e.properties) for e in self._registry.of_kind("topic")]

    async def create_subscription(
        self,
        topic_name: str,
        name: str,
        *,
        default_rule: RuleProperties | None = None,
        rules: Sequence[RuleProperties] | None = None,
        **properties: Any,
    ) -> SubscriptionProperties:
        """A new subscription with the ``$Default`` rule, or ``default_rule`` instead, or exactly ``rules``."""
        self._check_alive()
        first = [default_rule, *(rules or [])] if default_rule is not None else rules
        props, ops = self._registry.create_subscription(topic_name, name, properties, first, self._now())
        self._touch_subscription(topic_name, name)
        await self._write(ops)
        return props

    async def update_subscription(self, topic_name: str, name: str, **changes: Any) -> SubscriptionProperties:
        self._check_alive()
        props, ops = self._registry.update_subscription(topic_name, name, changes, self._now())
        self._touch_subscription(topic_name, name)
        await self._write(ops)
        return props

    def _touch_subscription(self, topic_name: str, name: str) -> None:
        self._touch(topic_name.lower())
        self._touch(subscription_path(topic_name.lower(), name))

    async def delete_subscription(self, topic_name: str, name: str) -> None:
        await self._backlog_restored()
        self._check_alive()
        ops = self._registry.delete_subscription(topic_name, name)
        self._notify()
        await self._write(ops)

    # ------------------------------------------------------------------------------ rules (broker.rulebook)
    def list_rules(self, topic_name: str, name: str) -> list[RuleProperties]:
        """A subscription's rules, in the order they were created."""
        return self._rules.list(topic_name, name)

    def get_rule(self, topic_name: str, name: str, rule_name: str) -> RuleProperties:
        return self._rules.get(topic_name, name, rule_name)

    async def create_rule(self, topic_name: str, name: str, rule: RuleProperties) -> RuleProperties:
        return await self._rules.create(topic_name, name, rule)

    async def update_rule(self, topic_name: str, name: str, rule: RuleProperties) -> RuleProperties:
        return await self._rules.update(topic_name, name, rule)

    async def delete_rule(self, topic_name: str, name: str, rule_name: str) -> None:
        await self._rules.delete(topic_name, name, rule_name)

    async def set_rules(self, topic_name: str, name: str, rules: Sequence[RuleProperties]) -> None:
        """Replace a subscription's rules (an empty list: it receives nothing)."""
        await self._rules.replace(topic_name, name, rules)

    def get_subscription(self, topic_name: str, name: str) -> SubscriptionProperties:
        subscription = self._registry.subscription(topic_name, name)
        self._touch_subscription(topic_name, name)
        return subscription.properties

    def list_subscriptions(self, topic_name: str) -> list[SubscriptionProperties]:
        return [s.properties for s in self._entity(topic_name, "topic").subscriptions.values()]

    def entity_names(self) -> list[str]:
        return [e.properties.name for e in self._entities.values()]

    # ------------------------------------------------------------------------------ sending
    async def send(self, entity_name: str, messages: Message | Sequence[Message]) -> list[SendOutcome]:
        """Send one message or an atomic batch to a queue or topic."""
        batch = [messages] if isinstance(messages, Message) else list(messages)
        self._touch(parse_path(entity_name).entity)
        self._check_status(entity_name, "send")
        return await self._sender.send(entity_name, batch, None)

    async def schedule_messages(
        self, entity_name: str, messages: Message | Sequence[Message], schedule_time_utc: datetime
    ) -> list[int]:
        """Schedule messages; returns their sequence numbers (for cancelling)."""
        batch = [messages] if isinstance(messages, Message) else list(messages)
        self._touch(parse_path(entity_name).entity)
        self._check_status(entity_name, "send")
        outcomes = await self._sender.send(entity_name, batch, datetime_to_us(schedule_time_utc))
        return [o.sequence_number if o.sequence_number is not None else 0 for o in outcomes]

    async def cancel_scheduled_messages(self, entity_name: str, sequence_numbers: Iterable[int]) -> None:
        """Cancel scheduled messages; their dedup keys stay in the history."""
        await self._backlog_restored()
        await self._sender.cancel_scheduled(entity_name, sequence_numbers)

    # ------------------------------------------------------------------------------ batch delete (purge)
    async def delete_messages(
        self,
        path: str,
        max_message_count: int,
        *,
        before_enqueued_time: datetime | None = None,
        session_id: str | None = None,
    ) -> int:
        """Delete up to ``max_message_count`` of the oldest messages of a queue, subscription or dead-letter queue
        enqueued before ``before_enqueued_time`` (None: now), of one session if ``session_id`` is given; returns how
        many were deleted (Service Bus's ``batch-delete-messages``: its SDKs' ``deleteMessages``/``purgeMessages``).

        Locked and scheduled messages are not eligible (as in Service Bus); deferred ones are. At most
        ``MAX_BATCH_DELETE`` a call (Service Bus's Standard tier). One durable unit: a crash leaves all of them or
        none. Their dedup keys stay: a resend of a deleted message inside the window is still a duplicate."""
        await self._backlog_restored()
        self._check_alive()
        if isinstance(max_message_count, bool) or not 1 <= max_message_count <= MAX_BATCH_DELETE:
            raise InvalidArgumentError(
                f"message-count {max_message_count!r} is out of range: a batch delete deletes 1 to "
                f"{MAX_BATCH_DELETE} messages a call on the Standard tier (4000 on Premium); delete in batches"
            )
        receivable = self.receivable(path)
        now = self._now()
        before_us = now if before_enqueued_time is None else datetime_to_us(before_enqueued_time)
        chosen: list[int] = []
        for seq, entry in receivable.messages.items():  # in the order they arrived: the oldest first
            if (
                entry.lock_token is None
                and entry.enqueued_time_us < before_us
                and entry.state != MessageState.SCHEDULED
                and (session_id is None or entry.session_id == session_id)
            ):
                chosen.append(seq)
                if len(chosen) == max_message_count:
                    break
        ops: list[Op] = []
        for seq in chosen:
            ops += receivable.remove(receivable.messages[seq])
            self._contents.discard(receivable.path, seq)
        if ops:
            await self._write(ops)
        return len(chosen)

    # ------------------------------------------------------------------------------ statistics
    def entity_views(self) -> list[EntityView]:
        """Every entity's settings, counters and gauges (metrics, dashboard), in O(entities)."""
        return view_entities(self._entities.values(), self._now())

    def stats(self, entity_name: str) -> EntityStats:
        """Per-entity statistics, including what Azure drops silently (only what was committed)."""
        self._check_alive()
        return entity_stats(self._entity(entity_name), self._now())

    async def reset(self) -> None:
        """Delete every entity with its messages, sessions, counters and dedup history, in one commit, and
        let the time start again from the clock's reading (``oncebus.testing``'s fresh namespace per test)."""
        await self._backlog_restored()
        self._check_alive()
        paths = list(self._entities)
        self._entities.clear()
        self._floor_us = 0
        self._notify()
        if paths:
            await self._write([DeleteEntity(path) for path in paths])
