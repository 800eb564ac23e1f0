"""Sending: validate a whole send, judge its keys, store it as one unit, fan it out once committed.

A send is judged by the entity's ``DuplicateDetector`` (the rule lives in
``oncebus.core``), written to the store as one unit (messages and dedup keys
together), and acknowledged once that unit is durable. Nothing is counted or
made receivable before it is committed; duplicates alone are acknowledged once
what they duplicate is durable.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from oncebus.broker.contents import ContentCache
from oncebus.broker.journal import Journal
from oncebus.broker.paths import parse_path
from oncebus.broker.receivable import QUOTA_BYTES_PER_MESSAGE, QUOTA_BYTES_PER_SESSION_STATE, Entry, Receivable
from oncebus.broker.registry import COUNTERS, Entity, Registry
from oncebus.broker.routing import Plan, Router
from oncebus.core.durations import to_micros
from oncebus.core.errors import InvalidArgumentError, MessageNotFoundError, QuotaExceededError
from oncebus.core.keys import MessageId, service_bus_text
from oncebus.core.messages import Message, MessageState, StoredMessage
from oncebus.core.sending import stored_message, validate_send
from oncebus.store.base import Op

_LOG = logging.getLogger("oncebus.broker")

SendLog = Callable[[dict[str, Any]], None]


@dataclass
class SendOutcome:
    """What happened to one message of a send (front ends report every send as accepted)."""

    message_id: MessageId
    sequence_number: int | None  # None for a dropped duplicate
    duplicate: bool
    late_resend_delay_us: int | None = None


def check_quota(entity: Entity, total: int, count: int, session_states: Mapping[str, int] | None = None) -> None:
    """Refuses (``QuotaExceededError``) what would take one of ``entity``'s queue or subscriptions past its size:
    ``count`` messages of ``total`` bytes sent to it (each counts its size plus ``QUOTA_BYTES_PER_MESSAGE``, so
    empty messages are bounded too) with what ``session_states``, by queue or subscription path, set there add
    (see ``Receivable.session_state_growth``)."""
    props = entity.properties
    sent = total + count * QUOTA_BYTES_PER_MESSAGE
    for receivable in entity.receivables():
        states = session_states.get(receivable.path, 0) if session_states else 0
        needed = sent + states
        held = receivable.quota_bytes
        if needed > 0 and held + needed > receivable.settings.max_size_bytes:
            what = "send" if not states else "session state" if not count else "transaction"
            raise QuotaExceededError(
                f"The maximum entity size has been reached or exceeded for '{props.name}': "
                f"max_size_in_megabytes={props.max_size_in_megabytes} ({receivable.settings.max_size_bytes} "
                f"bytes); {receivable.path!r} holds {held} bytes and this {what} needs {needed} more (each message "
                f"counts its size plus {QUOTA_BYTES_PER_MESSAGE} bytes, each session state its size plus "
                f"{QUOTA_BYTES_PER_SESSION_STATE})"
            )


class Sender:
    def __init__(
        self,
        registry: Registry,
        journal: Journal,
        now: Callable[[], int],
        send_log: SendLog | None,
        contents: ContentCache,
        router: Router | None = None,
    ) -> None:
        self.router = router if router is not None else Router(registry.entities.get)
        self.registry = registry
        self.journal = journal
        self.now = now
        self.send_log = send_log
        self.contents = contents
        self.send_log_failures = 0  # records the send log could not take (it observes; a send never fails for it)

    def _log_send(self, send_log: SendLog, record: dict[str, Any]) -> None:
        """One record to the send log, which only observes: a failure to write it (a full disk, its directory gone)
        is logged and counted, never raised into the send, whose keys are already judged (a send failed half-way
        would leave keys held whose messages were never stored, and the client's resend dropped as a duplicate)."""
        try:
            send_log(record)
        except Exception as exc:
            self.send_log_failures += 1
            if self.send_log_failures == 1 or self.send_log_failures % 10_000 == 0:
                _LOG.warning("the send log could not take a record (%d so far): %s", self.send_log_failures, exc)

    async def send(
        self,
        entity_name: str,
        batch: list[Message],
        scheduled_us: int | None,
        sequence_numbers: list[int] | None = None,
    ) -> list[SendOutcome]:
        """``sequence_numbers``: the numbers the messages take, reserved from the entity's counter before (a
        transaction's schedule-message answered them at its request); None: the next ones now."""
        self.journal.check_alive()
        if sequence_numbers is not None and len(sequence_numbers) != len(batch):
            raise InvalidArgumentError(f"{len(sequence_numbers)} sequence numbers for {len(batch)} messages")
        if not batch:
            raise InvalidArgumentError("nothing to send: give at least one message")
        where = parse_path(entity_name)
        if where.subscription is not None or where.dead_letter:
            raise InvalidArgumentError(
                f"cannot send to {entity_name!r}: send to a queue or a topic, not to a subscription or "
                "a dead-letter queue"
            )
        entity = self.registry.entity(where.entity)
        checked = validate_send(
            entity.properties, entity.detector, batch, scheduled=scheduled_us is not None, quotas=self.registry.quotas
        )
        check_quota(entity, checked.total_bytes, len(batch))
        now = self.now()
        verdicts_since = self.journal.failed_writes
        plan = Plan()
        outcomes: list[SendOutcome] = []
        deltas = dict.fromkeys(COUNTERS, 0)
        late_delays: list[int] = []
        resends: list[int] = []  # delays since each resent key's first acceptance (metrics)
        detector = entity.detector  # keys are None when duplicate detection is off
        reserved = iter(sequence_numbers) if sequence_numbers is not None else None
        # a queue that does not forward: each accepted message is put there (what ``Router.route`` would plan,
        # without its two calls a message); otherwise the router plans each
        direct = entity.receivable if entity.kind == "queue" and not entity.properties.forwards else None
        records: list[StoredMessage] = []  # to ``direct``, with their keys
        record_keys: list[tuple[str, str, int] | None] = []
        keys = checked.keys
        # From the judging of its keys until its unit is submitted, memory moves ahead of the store: a failure
        # there (a bug of ours, a message the record builder did not foresee) would leave keys held whose
        # messages are never stored, and the client's resend dropped as a duplicate. Memory is reloaded from the
        # store instead, as after a failed write, and the client gets the error.
        try:
            # every key judged in order, as one batch (the rule: core.dedup), before any record is built
            verdicts = detector.judge_many(keys, now) if detector.enabled else [None] * len(batch)
            props = entity.properties
            entity_path = entity.path  # (a property: lower-cased each time it is read)
            send_log = self.send_log
            for message, given_id, key, verdict in zip(batch, checked.ids, keys, verdicts, strict=True):
                reserved_seq = next(reserved) if reserved is not None else None
                message_id: MessageId = given_id if given_id is not None else uuid.uuid4().hex
                if send_log is not None and key is not None:
                    self._log_send(
                        send_log,
                        {
                            "entity": entity_path,
                            "key": key,
                            "message_id": message_id if isinstance(message_id, str) else service_bus_text(message_id),
                            "time_us": now,
                            "outcome": "duplicate"
                            if verdict and verdict.duplicate
                            else ("late" if verdict and verdict.late_resend_delay_us is not None else "new"),
                            "window_us": to_micros(detector.window),
                        },
                    )
                if verdict is not None and verdict.duplicate:
                    deltas["duplicates"] += 1
                    if verdict.first_accepted_us is not None:
                        resends.append(now - verdict.first_accepted_us)
                    outcomes.append(SendOutcome(message_id, None, True))
                    continue
                late = verdict.late_resend_delay_us if verdict is not None else None
                if late is not None:
                    deltas["late_resends"] += 1
                    late_delays.append(late)
                    resends.append(late)
                if reserved_seq is not None:
                    seq = reserved_seq
                else:
                    seq = entity.next_sequence_number
                    entity.next_sequence_number += 1
                deltas["accepted"] += 1
                record = stored_message(props, message, message_id, seq, now, scheduled_us)
                if direct is not None:  # put after the loop, each with its key
                    records.append(record)
                    record_keys.append(None if key is None else (entity_path, key, now))
                else:
                    plan.dedup_key = None if key is None else (entity_path, key, now)  # written with the first copy
                    self.router.route(entity, record, now, plan)
                    plan.flush_key()  # no copy (no subscription took it): the key is remembered all the same
                outcomes.append(SendOutcome(message_id, seq, False, late))
            if records:
                plan.put_all(direct, records, record_keys)
            ops: list[Op] = []
            if deltas["accepted"]:
                ops = plan.ops
                counters = entity.counters_op(deltas)
                assert counters is not None
                ops.append(counters)
                ops += [
                    op for path, more in plan.deltas.items() if (op := plan.touched[path].counters_op(more)) is not None
                ]
        except BaseException as exc:
            self.journal.unwritten(
                f"a send to {entity.path!r} failed before it was stored ({type(exc).__name__}: {exc})"
            )
            raise
        if deltas["accepted"]:

            def visible() -> None:  # counted and shown only once committed
                for name, delta in deltas.items():
                    entity.counters[name] += delta
                entity.late_delays_us.extend(late_delays)
                plan.count_committed()
                entity.observed.resends(resends)
                committed_at = self.now()
                grouped: dict[Receivable, list[StoredMessage]] = {}
                for receivable, copy in plan.placements:
                    grouped.setdefault(receivable, []).append(copy)
                for receivable, copies in grouped.items():
                    waiting = receivable.changes.waiting  # (before add_records wakes them)
                    receivable.add_records(copies, committed_at)
                    # the next delivered if a receiver waits for them; else they join a backlog: no eviction for them
                    self.contents.put_many(copies, evict=waiting > 0)

            await self.journal.write(
                ops, on_commit=visible, verdicts_since=verdicts_since if deltas["duplicates"] else None
            )
        else:  # duplicates only: acknowledged once what they duplicate is durable
            await self.journal.barrier(verdicts_since)
            entity.counters["duplicates"] += deltas["duplicates"]
            entity.unsaved["duplicates"] = entity.unsaved.get("duplicates", 0) + deltas["duplicates"]
            entity.observed.resends(resends)
        return outcomes

    async def cancel_scheduled(self, entity_name: str, sequence_numbers: Iterable[int]) -> None:
        """Cancel scheduled messages; their dedup keys stay in the history."""
        self.journal.check_alive()
        entity = self.registry.entity(entity_name)
        targets: list[tuple[Receivable, Entry]] = []
        for seq in sequence_numbers:
            holders = [*entity.receivables(), *([entity.scheduled] if entity.scheduled is not None else [])]
            found = [
                (r, r.messages[seq])
                for r in holders
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
            self.contents.discard(receivable.path, message.sequence_number)
        await self.journal.write(ops)
