"""What a send must satisfy before anything of it is judged or stored, and the record it becomes.

Pure functions of the entity's properties and the messages: the broker calls
``validate_send`` on a whole batch (a refused batch stores none of it), then
``stored_message`` for each accepted message, and ``subscription_copy`` per
subscription a topic's message goes to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from oncebus.core.dedup import DuplicateDetector
from oncebus.core.durations import TIMESPAN_MAX, to_micros
from oncebus.core.entities import QueueProperties, SubscriptionProperties, TopicProperties
from oncebus.core.errors import InvalidArgumentError, InvalidOperationError, MessageSizeExceededError
from oncebus.core.keys import MessageId, normalize_message_id, require_identifiable, validate_ids
from oncebus.core.messages import Message, MessageState, StoredMessage, check_message
from oncebus.core.tiers import STANDARD, TierQuotas
from oncebus.core.timeutil import add_us, datetime_to_us

_NOT_REWRITTEN: frozenset[str] = frozenset()


@dataclass(slots=True)
class CheckedSend:
    ids: list[MessageId | None]  # each message's id, normalized (None: none given)
    keys: list[str | None]  # each message's dedup key (None: duplicate detection off, or no id)
    total_bytes: int


def validate_send(
    props: QueueProperties | TopicProperties,
    detector: DuplicateDetector,
    messages: Sequence[Message],
    *,
    scheduled: bool,
    quotas: TierQuotas = STANDARD,
) -> CheckedSend:
    """Check a whole send before judging any of it: types, ids, sessions, sizes (the tier's, ``quotas``)."""
    limit_kb = quotas.message_limit_kb(props)
    limit = limit_kb * 1024
    requires_session = isinstance(props, QueueProperties) and props.requires_session
    ids: list[MessageId | None] = []
    keys: list[str | None] = []
    total = 0
    count = len(messages)
    for position, message in enumerate(messages):
        where = f"message {position + 1} of {count}" if count > 1 else "the message"
        if not isinstance(message, Message):
            raise InvalidArgumentError(f"{where} is a {type(message).__name__}, not a Message")
        try:
            check_message(message)
            message_id = None if message.message_id is None else normalize_message_id(message.message_id)
            validate_ids(None, message.partition_key, message.session_id)  # the id was checked just above
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
            raise InvalidOperationError(
                f"{where}: the SessionId was not set on a message, and it cannot be sent to the entity "
                f"{props.name!r}. Entities that have session support enabled can only receive messages "
                "that have the SessionId set"
            )
        size = message.size
        if size > limit:
            setting = (
                f"max_message_size_in_kilobytes={limit_kb} of {props.name!r}"
                if limit_kb == props.max_message_size_in_kilobytes
                else f"{limit_kb} KB on a namespace of the {quotas.tier.value} tier"
            )
            raise MessageSizeExceededError(f"{where} is {size} bytes, over the limit of {limit} bytes ({setting})")
        quotas.check_header(where, size - len(message.body), message.application_properties)
        total += size
        ids.append(message_id)
        if detector.enabled and message_id is not None:
            keys.append(detector.key_of_valid(message_id, message.partition_key, message.session_id))
        else:
            keys.append(None)
    batch_limit = quotas.batch_limit_bytes(props)
    if not scheduled and count > 1 and total > batch_limit:
        raise MessageSizeExceededError(
            f"the batch is {total} bytes, over the limit of {batch_limit} bytes for one send of several messages "
            f"on a namespace of the {quotas.tier.value} tier"
        )
    return CheckedSend(ids, keys, total)


def stored_message(
    props: QueueProperties | TopicProperties,
    message: Message,
    message_id: MessageId,
    seq: int,
    now_us: int,
    scheduled_us: int | None,
) -> StoredMessage:
    """The record of an accepted message: its sequence number, enqueue and expiry times, state."""
    if scheduled_us is None and message.scheduled_enqueue_time_utc is not None:
        scheduled_us = datetime_to_us(message.scheduled_enqueue_time_utc)
    ttl = props.default_message_time_to_live
    if message.time_to_live is not None:
        ttl = min(ttl, message.time_to_live)
    ttl_us = None if ttl >= TIMESPAN_MAX else to_micros(ttl)
    later = scheduled_us is not None and scheduled_us > now_us
    enqueued = scheduled_us if later and scheduled_us is not None else now_us
    # positional, in the model's order (a field moved in StoredMessage: mypy --strict refuses the call where the
    # types differ, tests/core/test_properties.py where the values do): from compiled code a call with 20
    # keywords costs about 0.85 us more a record than this one (docs/performance-log.md)
    return StoredMessage(
        props.name.lower(),  # path
        seq,  # sequence_number
        message_id,
        bytes(message.body),
        enqueued,  # enqueued_time_us
        add_us(enqueued, ttl_us),  # expires_at_us (None: never: no time to live, or past year 9999)
        MessageState.SCHEDULED if later else MessageState.ACTIVE,  # state
        0,  # delivery_count
        message.session_id,
        message.partition_key,
        message.correlation_id,
        message.subject,
        message.content_type,
        message.reply_to,
        message.reply_to_session_id,
        message.to,
        dict(message.application_properties),
        ttl_us,  # time_to_live_us
        scheduled_us,  # scheduled_enqueue_time_us
        None,  # dead_letter_reason
        None,  # dead_letter_error_description
        None,  # dead_letter_source
        message.wire,
        _NOT_REWRITTEN,  # rewritten
        0,  # hops
        message.sections,
    )


def subscription_copy(record: StoredMessage, path: str, props: SubscriptionProperties) -> StoredMessage:
    """A topic message's copy for one subscription: the shorter of its time to live and the subscription's."""
    copy = record.copy_for(path)
    ttl = props.default_message_time_to_live
    if ttl < TIMESPAN_MAX and (copy.time_to_live_us is None or to_micros(ttl) < copy.time_to_live_us):
        copy.time_to_live_us = to_micros(ttl)
        copy.expires_at_us = add_us(copy.enqueued_time_us, copy.time_to_live_us)
    return copy
