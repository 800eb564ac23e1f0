"""Where an accepted message goes: subscription rules, auto-forwarding, and the copies each place gets.

A message accepted at a queue goes to the queue; one accepted at a topic goes
to each subscription whose rules give it copies (``core.rules``: one copy for
the matching rules without an action, one more per matching rule with an
action, changed by it). A queue or subscription with ``forward_to`` does not
keep what arrives: it goes on to the destination queue or topic, whose
duplicate detection judges it as a send (its own window, at the time of the
hop), and so on, up to :data:`MAX_HOPS` transfers; a message that would need
more is dead-lettered where it is (``MaxTransferHopCountExceeded``, as Service
Bus does). Everything one message causes is planned here and written by the
caller in one unit with the send: it lands everywhere or nowhere.

A scheduled message sent to a topic waits at the topic and goes through the
rules when it becomes due (:meth:`Router.route` of the due message), as in
Service Bus; one scheduled to a queue that forwards waits in that queue and
is forwarded when due.

Extra copies (from rules with actions) take their own sequence numbers from
the topic's counter, so every copy in a subscription has its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from oncebus.broker.receivable import QUOTA_BYTES_PER_MESSAGE
from oncebus.core.durations import TIMESPAN_MAX, to_micros
from oncebus.core.messages import MessageState, StoredMessage
from oncebus.core.rules import MessageView
from oncebus.core.sending import subscription_copy
from oncebus.core.timeutil import add_us
from oncebus.store.base import DLQ_SUFFIX, Op, PutDedupKey, PutMessage

MAX_HOPS = 4  # Service Bus: a message is transferred at most 4 times
HOP_LIMIT_REASON = "MaxTransferHopCountExceeded"
HOP_LIMIT_DESCRIPTION = "The maximum number of allowed hops when forwarding between queues was exceeded (4)."
FILTER_REASON = "FilterEvaluationException"
NO_DESTINATION_REASON = "ForwardingDestinationNotFound"
FULL_DESTINATION_REASON = "QuotaExceeded"


@dataclass
class Plan:
    """What routing decided, to be written as one unit and made visible once it is durable."""

    ops: list[Op] = field(default_factory=list)
    placements: list[tuple[Any, StoredMessage]] = field(default_factory=list)  # (Receivable, copy)
    deltas: dict[str, dict[str, int]] = field(default_factory=dict)  # forwarded-to entity path -> counter deltas
    touched: dict[str, Any] = field(default_factory=dict)  # entity path -> Entity (for their counters)
    dedup_key: tuple[str, str, int] | None = None  # written with the next message put (the send's own key)
    added_bytes: dict[str, int] = field(default_factory=dict)  # receivable path -> quota bytes this plan adds

    def put(self, receivable: Any, copy: StoredMessage) -> None:
        self.placements.append((receivable, copy))
        self.added_bytes[receivable.path] = (
            self.added_bytes.get(receivable.path, 0) + copy.size + QUOTA_BYTES_PER_MESSAGE
        )
        self.ops.append(PutMessage(copy, self.dedup_key))
        self.dedup_key = None

    def put_all(self, receivable: Any, copies: list[StoredMessage], keys: list[tuple[str, str, int] | None]) -> None:
        """``put`` of each copy in order, each with its dedup key (one send's accepted messages to one queue)."""
        self.placements += [(receivable, copy) for copy in copies]
        self.ops += map(PutMessage, copies, keys)
        added = sum([copy.size for copy in copies]) + len(copies) * QUOTA_BYTES_PER_MESSAGE
        self.added_bytes[receivable.path] = self.added_bytes.get(receivable.path, 0) + added

    def count(self, entity: Any, name: str) -> None:
        self.touched[entity.path] = entity
        deltas = self.deltas.setdefault(entity.path, {})
        deltas[name] = deltas.get(name, 0) + 1

    def count_committed(self) -> None:
        """Add the forwarded-to entities' counts (once the unit is durable)."""
        for path, deltas in self.deltas.items():
            counters = self.touched[path].counters
            for name, delta in deltas.items():
                counters[name] = counters.get(name, 0) + delta

    def flush_key(self) -> None:
        """The send's key when no copy was stored (a topic without matching subscriptions still remembers it)."""
        if self.dedup_key is not None:
            self.ops.append(PutDedupKey(*self.dedup_key))
            self.dedup_key = None


def dead_lettered(message: StoredMessage, receivable: Any, reason: str, description: str) -> StoredMessage:
    dead = message.copy_for(receivable.path + DLQ_SUFFIX)
    dead.state = MessageState.DEAD_LETTERED
    dead.dead_letter_reason = reason
    dead.dead_letter_error_description = description
    return dead


class Router:
    """Plans the route of accepted messages through rules and forwarding (pure bookkeeping, no I/O).

    ``lookup(name)`` finds a queue or topic (None when there is none). A copy a rule action changed
    keeps its sender's encoding and names what changed (``StoredMessage.rewritten``): the door that
    delivers it encodes those fields again; the broker never encodes.
    """

    def __init__(
        self,
        lookup: Callable[[str], Any],
        touch: Callable[[str], None] | None = None,
    ) -> None:
        self.lookup = lookup
        self.touch = touch  # a forward into an entity is a send to it (not idle)

    # ------------------------------------------------------------------------------ one message
    def route(self, entity: Any, record: StoredMessage, now: int, plan: Plan, hops: int = 0) -> None:
        """Plan where ``record`` (accepted at ``entity``, sequence number taken) goes."""
        if entity.kind == "queue":
            self._arrive(entity.receivable, entity.properties, record, now, plan, hops)
            return
        if record.state == MessageState.SCHEDULED:
            plan.put(entity.scheduled, record)  # waits at the topic until due, then goes through the rules
            return
        view: MessageView | None = None
        for subscription in entity.subscriptions.values():
            receivable = subscription.receivable
            rules = subscription.rules
            if rules.delivers_everything_unchanged:
                copy = subscription_copy(record, receivable.path, subscription.properties)
                self._arrive(receivable, subscription.properties, copy, now, plan, hops)
                continue
            if view is None:
                view = MessageView.of(record)
            outcome = rules.evaluate(view)
            for i, delivery in enumerate(outcome.deliveries):
                copy = subscription_copy(record, receivable.path, subscription.properties)
                if i > 0:  # a rule with an action gives one more copy: a sequence number of its own
                    copy.sequence_number = entity.next_sequence_number
                    entity.next_sequence_number += 1
                if delivery.changed:
                    copy = delivery.apply_to(copy)  # marks what changed; the encoding stays the sender's
                self._arrive(receivable, subscription.properties, copy, now, plan, hops)
            if outcome.failures and subscription.properties.dead_lettering_on_filter_evaluation_exceptions:
                reasons = "; ".join(f"rule {f.rule_name!r}: {f.reason}" for f in outcome.failures)
                copy = subscription_copy(record, receivable.path, subscription.properties)
                if outcome.deliveries:
                    copy.sequence_number = entity.next_sequence_number
                    entity.next_sequence_number += 1
                dead = dead_lettered(copy, receivable, FILTER_REASON, reasons[:1024])
                plan.put(receivable.dead_letter_queue, dead)

    def _arrive(self, receivable: Any, props: Any, copy: StoredMessage, now: int, plan: Plan, hops: int) -> None:
        target = getattr(props, "forward_to", None)
        if target is None or copy.state == MessageState.SCHEDULED:
            plan.put(receivable, copy)
            return
        self.forward(copy, receivable, target, now, plan, hops)

    # ------------------------------------------------------------------------------ forwarding
    def has_room(self, target: str, size: int) -> bool:
        """Whether ``target`` has room for a message of ``size`` bytes (a missing one: :meth:`forward` decides)."""
        destination = self.lookup(target)
        return destination is None or _full(destination, size, Plan()) is None

    def forward(self, message: StoredMessage, source: Any, target: str, now: int, plan: Plan, hops: int) -> None:
        """``message`` leaves ``source`` (a queue, subscription or dead-letter queue) for ``target``.

        The destination judges it as a send: a duplicate within its window is dropped there (counted
        as a duplicate of the destination); the message keeps its id, body and properties.
        """
        if hops >= MAX_HOPS:
            plan.put(
                source.dead_letter_queue or source, _dead(message, source, HOP_LIMIT_REASON, HOP_LIMIT_DESCRIPTION)
            )
            return
        destination = self.lookup(target)
        if destination is None:
            text = f"the forwarding destination {target!r} does not exist"
            plan.put(source.dead_letter_queue or source, _dead(message, source, NO_DESTINATION_REASON, text))
            return
        full = _full(destination, message.size, plan)
        if full is not None:  # as Service Bus: the source dead-letters it (a dead-letter queue keeps it)
            plan.put(source.dead_letter_queue or source, _dead(message, source, FULL_DESTINATION_REASON, full))
            return
        if self.touch is not None:
            self.touch(destination.path)
        detector = destination.detector
        key = None
        if detector.enabled and message.message_id is not None:
            key = detector.key_of_valid(message.message_id, message.partition_key, message.session_id)
            verdict = detector.judge(key, now)
            if verdict.duplicate:
                plan.count(destination, "duplicates")
                return
            if verdict.late_resend_delay_us is not None:
                plan.count(destination, "late_resends")
        seq = destination.next_sequence_number
        destination.next_sequence_number += 1
        plan.count(destination, "accepted")
        record = arrived(message, destination, seq, now, hops + 1)
        if key is not None:
            plan.ops.append(PutDedupKey(destination.path, key, now))
        self.route(destination, record, now, plan, hops + 1)


def _full(destination: Any, size: int, plan: Plan) -> str | None:
    """Why ``destination`` has no room for a message of ``size`` bytes (its size quota, with what this plan adds).

    A destination's status does not refuse forwarding into it: Service Bus forwards into a disabled entity
    (its team in Azure/azure-service-bus#666 and #743); its size does."""
    needed = size + QUOTA_BYTES_PER_MESSAGE
    for receivable in destination.receivables():
        held = receivable.quota_bytes + plan.added_bytes.get(receivable.path, 0)
        if held + needed > receivable.settings.max_size_bytes:
            return (
                f"the forwarding destination {destination.properties.name!r} is full: {receivable.path!r} holds "
                f"{held} of its {receivable.settings.max_size_bytes} bytes (max_size_in_megabytes="
                f"{destination.properties.max_size_in_megabytes}) and this message needs {needed}"
            )[:1024]
    return None


def _dead(message: StoredMessage, source: Any, reason: str, description: str) -> StoredMessage:
    if getattr(source, "is_dead_letter", False):  # already in a dead-letter queue: it stays there
        stay = message.copy_for(source.path)
        stay.state = MessageState.DEAD_LETTERED
        return stay
    return dead_lettered(message, source, reason, description)


def arrived(message: StoredMessage, destination: Any, seq: int, now: int, hops: int) -> StoredMessage:
    """``message`` as the destination of a forward stores it: its sequence number, enqueued now, its time to live,
    the transfers it has taken (``hops``, kept with it for a later forward)."""
    ttl_us = message.time_to_live_us
    default = destination.properties.default_message_time_to_live
    if default < TIMESPAN_MAX and (ttl_us is None or to_micros(default) < ttl_us):
        ttl_us = to_micros(default)
    return dataclasses.replace(
        message,
        path=destination.path,
        sequence_number=seq,
        enqueued_time_us=now,
        expires_at_us=add_us(now, ttl_us),
        time_to_live_us=ttl_us,
        state=MessageState.ACTIVE,
        delivery_count=0,
        application_properties=dict(message.application_properties),
        hops=hops,
    )
