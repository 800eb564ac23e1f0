"""Recovery: rebuild the namespace's memory from what the store holds (at start, and after a failed write)."""

from __future__ import annotations

import itertools
import logging
import operator
from collections.abc import Callable, Iterable, Iterator

from oncebus.broker.registry import Registry
from oncebus.core.dedup import DuplicateDetector, ImageError
from oncebus.core.entities import QueueProperties, SubscriptionProperties, TopicProperties
from oncebus.core.rules import RuleProperties
from oncebus.store.base import MessageRow, PutDedupKey, Snapshot
from oncebus.store.dedup_images import DedupImage

_LOG = logging.getLogger("oncebus.broker")
RESTORE_STEP = 5_000  # stored messages restored between two turns of the loop (about 10 ms)


def newest_time_us(snapshot: Snapshot) -> int:
    """The latest time the store has seen (the broker's clock never goes back before it)."""
    return snapshot.newest_key_us


def restore(registry: Registry, snapshot: Snapshot, now_us: int, *, messages: bool = True) -> None:
    """Fill an empty registry from ``snapshot``: entities, counters, dedup keys still in their window,
    messages (unless ``messages`` is false: then ``restore_messages_in_steps`` does it) and session states."""
    subscriptions = []
    for record in snapshot.entities:
        if record.kind == "queue":
            registry.install("queue", QueueProperties.from_dict(record.properties))
        elif record.kind == "topic":
            registry.install("topic", TopicProperties.from_dict(record.properties))
        else:
            subscriptions.append(record)
    for record in subscriptions:
        topic = record.path.rsplit("/subscriptions/", 1)[0]
        if topic in registry.entities:
            stored = snapshot.rules.get(record.path)  # None: written before rules were stored ($Default)
            rules = None if stored is None else [RuleProperties.from_dict(r) for r in stored]
            registry.install_subscription(topic, SubscriptionProperties.from_dict(record.properties), rules)
    for path, counters in snapshot.counters.items():
        entity = registry.entities.get(path)
        if entity is not None:
            entity.next_sequence_number = counters.next_sequence_number
            entity.counters.update(counters.counters)
    for path, image in snapshot.dedup_images.items():
        entity = registry.entities.get(path)
        if entity is not None and entity.detector.enabled:
            _load_image(entity.detector, image, snapshot.keys_of, path, now_us)
    for key in snapshot.dedup_keys:
        entity = registry.entities.get(key.entity)
        if entity is not None:
            entity.detector.restore(key.key, key.first_accepted_us, now_us)
    if messages:
        _restore_messages(registry, snapshot, now_us)
    for state in snapshot.session_states:
        receivable = registry.receivable_by_path(state.path)
        if receivable is not None and state.state is not None:
            receivable.session_states[state.session_id] = state.state


def _load_image(
    detector: DuplicateDetector,
    image: DedupImage,
    keys_of: Callable[[str], Iterable[PutDedupKey]],
    path: str,
    now_us: int,
) -> None:
    """An entity's index read in bulk from its image, or rebuilt from its rows when the image does not check out
    (keys that left the window since go at the index's next check)."""
    try:
        with image.open() as file:
            detector.load_image(file, image.length, image.crc)
    except (OSError, ImageError) as exc:
        _LOG.warning("the dedup index image in %s could not be used (%s): reading the keys instead", image.path, exc)
        for key in keys_of(path):
            detector.restore(key.key, key.first_accepted_us, now_us)


def _restore_messages(registry: Registry, snapshot: Snapshot, now_us: int) -> None:
    """An ``Entry`` per stored message (never its content), receivable by receivable."""
    for path, rows in itertools.groupby(snapshot.messages, key=operator.itemgetter(0)):
        receivable = registry.receivable_by_path(path)
        if receivable is not None:
            receivable.restore(rows, now_us)


def restore_messages_in_steps(
    registry: Registry, rows: Iterable[MessageRow], now_us: Callable[[], int]
) -> Iterator[None]:
    """``restore``'s messages a step of rows at a time (yielding between steps), while the broker serves.

    ``rows`` must be a consistent snapshot of the store taken when the registry was filled (a read
    transaction of its own): messages committed since are in memory already and not in it. Each
    receivable's rows go in between ``begin_restore`` and ``end_restore`` (see ``Receivable``)."""
    for path, group in itertools.groupby(rows, key=operator.itemgetter(0)):
        receivable = registry.receivable_by_path(path)
        if receivable is None:
            for _ in group:
                pass
            yield
            continue
        receivable.begin_restore()
        try:
            while chunk := list(itertools.islice(group, RESTORE_STEP)):
                receivable.restore(chunk, now_us())
                yield
        finally:
            receivable.end_restore()
