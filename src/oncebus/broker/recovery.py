"""Recovery: rebuild the namespace's memory from what the store holds (at start, and after a failed write), and
the dedup checkpoints that keep what a restart reads from the rows short.

At start, an entity's dedup index is loaded from the image of the store's last committed checkpoint, and only
the keys first accepted since that image's mark are read from the rows on top of it (every key, for an entity
without an image). While serving, ``DedupCheckpoints`` asks the store for a new checkpoint once enough keys were
accepted since the last one (see ``store/dedup_images.py``), so a restart after a crash replays at most about
``CHECKPOINT_KEYS`` keys plus those accepted while the checkpoint was written.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import operator
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from oncebus.broker.registry import Registry
from oncebus.core.dedup import DuplicateDetector, ImageError
from oncebus.core.entities import QueueProperties, SubscriptionProperties, TopicProperties
from oncebus.core.errors import StoreError
from oncebus.core.rules import RuleProperties
from oncebus.store.base import MessageRow, PutDedupKey, Snapshot, Store
from oncebus.store.dedup_images import DedupImage

_LOG = logging.getLogger("oncebus.broker")
RESTORE_STEP = 5_000  # stored messages restored between two turns of the loop (about 10 ms)
# a dedup checkpoint once this many keys were accepted (or read from the rows at start) since the last one, at
# most one per CHECKPOINT_MIN_SECONDS (``Namespace.open`` takes both; oncebus serve sets them from
# ONCEBUS_CHECKPOINT_KEYS and ONCEBUS_CHECKPOINT_SECONDS, read by its settings). Fewer keys are not worth an
# image of every held key: replaying 100,000 rows takes about half a second, writing the image of 10 million keys
# (380 MB) one to two seconds of disk.
CHECKPOINT_KEYS = 100_000
CHECKPOINT_MIN_SECONDS = 10.0


def newest_time_us(snapshot: Snapshot) -> int:
    """The latest time the store has seen (the broker's clock never goes back before it)."""
    return snapshot.newest_key_us


class KeyLoader:
    """The dedup index images of a start, loaded on a thread of their own while the broker opens its doors.

    Reading and checking an image is bulk work (``readinto`` and CRC-32, which let go of the GIL: 0.5 s for 380 MB
    here), so ``serve`` says ready while it runs; until it is done, any use of one of those indexes on another
    thread (a send judged, a window changed, a checkpoint) waits for it (``DuplicateDetector.index``): every send
    is still judged against every held key. Each image is followed by its entity's rows since the image's mark
    (read before ready, applied after the image); an image that does not check out is rebuilt from all its rows,
    on the thread."""

    def __init__(self) -> None:
        self.read = 0  # key rows read before ready
        self.read_later = 0  # key rows the thread read (an image that did not check out), once done
        self._jobs: list[tuple[DuplicateDetector, DedupImage, str, list[PutDedupKey]]] = []
        self._done = threading.Event()
        self._done.set()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def add(self, detector: DuplicateDetector, image: DedupImage, path: str) -> list[PutDedupKey]:
        """Load ``image`` into ``detector`` on the thread; returns the list for its rows since the mark."""
        rows: list[PutDedupKey] = []
        self._jobs.append((detector, image, path, rows))
        return rows

    def start(self, keys_of: Callable[[str], Iterable[PutDedupKey]], now_us: int) -> None:
        if not self._jobs:
            return
        self._done.clear()
        self._thread = threading.Thread(
            target=self._run, args=(keys_of, now_us), name="oncebus-dedup-images", daemon=True
        )
        for detector, *_ in self._jobs:
            detector.load_later(self)
        self._thread.start()

    def _run(self, keys_of: Callable[[str], Iterable[PutDedupKey]], now_us: int) -> None:
        try:
            for detector, image, path, rows in self._jobs:
                self.read_later += _load_image(detector, image, keys_of, path, now_us)
                for key in rows:  # on top of the image: the keys accepted since its mark
                    detector.restore(key.key, key.first_accepted_us, now_us)
            for detector, *_ in self._jobs:
                detector.load_later(None)
        except BaseException as exc:  # every use of these indexes says so (their keys are not all there)
            self._error = exc
            _LOG.error("the dedup keys could not be loaded: %s", exc)
        finally:
            self._jobs = []
            self._done.set()

    def wait_for_keys(self) -> None:
        if threading.current_thread() is self._thread:
            return
        self._done.wait()
        if self._error is not None:
            raise StoreError(f"the duplicate detection keys could not be loaded ({self._error}); restart oncebus")

    @property
    def done(self) -> bool:
        return self._done.is_set()

    async def loaded(self) -> None:
        """Wait (on the loop, without holding it) until the thread is done."""
        while not self._done.is_set():
            await asyncio.sleep(0.005)


def restore(registry: Registry, snapshot: Snapshot, now_us: int, *, messages: bool = True) -> KeyLoader:
    """Fill an empty registry from ``snapshot``: entities, counters, dedup keys still in their window (images,
    then the rows since their marks), messages and session states. With ``messages`` false (``serve``), the
    messages are left to ``restore_messages_in_steps`` and the images to a ``KeyLoader`` thread (returned; the
    rows are read here). Its ``read``: how many dedup key rows were read."""
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
    read = 0
    loader = KeyLoader()
    later: dict[str, list[PutDedupKey]] = {}
    for path, image in snapshot.dedup_images.items():
        entity = registry.entities.get(path)
        if entity is not None and entity.detector.enabled:
            if messages:
                read += _load_image(entity.detector, image, snapshot.keys_of, path, now_us)
            else:
                later[path] = loader.add(entity.detector, image, path)
    for key in snapshot.dedup_keys:  # on top of an image, the keys since its mark (read again: no change)
        read += 1
        rows = later.get(key.entity)
        if rows is not None:
            rows.append(key)  # applied after its image, on the loader's thread
            continue
        entity = registry.entities.get(key.entity)
        if entity is not None:
            entity.detector.restore(key.key, key.first_accepted_us, now_us)
    if messages:
        _restore_messages(registry, snapshot, now_us)
    for state in snapshot.session_states:
        receivable = registry.receivable_by_path(state.path)
        if receivable is not None and state.state is not None:
            # stored since store schema 7 (SQLite) / 2 (PostgreSQL); an older release's state: set at the latest now
            set_at = now_us if state.updated_us is None else state.updated_us
            receivable.set_session_state(state.session_id, state.state, set_at)
    loader.read = read
    loader.start(snapshot.keys_of, now_us)
    return loader


def _load_image(
    detector: DuplicateDetector,
    image: DedupImage,
    keys_of: Callable[[str], Iterable[PutDedupKey]],
    path: str,
    now_us: int,
) -> int:
    """An entity's index read in bulk from its image, or rebuilt from its rows when the image does not check out
    (keys that left the window since go at the index's next check); returns the rows read."""
    try:
        with image.open() as file:
            detector.load_image(file, image.length, image.crc)
    except (OSError, ImageError) as exc:
        _LOG.warning("the dedup index image in %s could not be used (%s): reading the keys instead", image.path, exc)
        read = 0
        for key in keys_of(path):
            read += 1
            detector.restore(key.key, key.first_accepted_us, now_us)
        return read
    return 0


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


class DedupCheckpoints:
    """When to ask the store for a dedup checkpoint (``Store.checkpoint_dedup``; a store without images never
    starts one): once ``CHECKPOINT_KEYS`` keys were accepted, or read from the rows at the last load, since the
    last checkpoint (at most one per ``CHECKPOINT_MIN_SECONDS``). Call ``tick`` from the loop between two of its
    steps (the namespace's timer)."""

    def __init__(
        self, store: Store, registry: Registry, *, keys: int | None = None, min_seconds: float | None = None
    ) -> None:
        self._start = store.checkpoint_dedup
        self._registry = registry
        self.keys = CHECKPOINT_KEYS if keys is None else keys
        self.min_seconds = CHECKPOINT_MIN_SECONDS if min_seconds is None else min_seconds
        self._accepted_then: int | None = None  # keys accepted (committed) at the last checkpoint or load
        self._replayed = 0  # rows read at the last load, not in any image
        self._later: KeyLoader | None = None  # the load's images, if loaded on a thread (rows it read count too)
        self._last = time.monotonic()

    def loaded(self, replayed: int, later: KeyLoader | None = None) -> None:
        """The namespace was (re)loaded, reading ``replayed`` key rows that no image holds (and those ``later``
        reads)."""
        self._accepted_then = None
        self._replayed = replayed
        self._later = later
        self._last = time.monotonic()

    def _accepted(self) -> int:
        return sum(e.counters.get("accepted", 0) for e in self._registry.entities.values() if e.detector.enabled)

    def tick(self, now_us: int) -> bool:
        """Start a checkpoint if one is due; True if one started."""
        accepted = self._accepted()
        if self._accepted_then is None:
            self._accepted_then = accepted
        replayed = self._replayed + (self._later.read_later if self._later is not None else 0)
        new = accepted - self._accepted_then + replayed
        elapsed = time.monotonic() - self._last
        if new < self.keys or elapsed < self.min_seconds:
            return False
        return self.start(now_us, accepted)

    def start(self, now_us: int, accepted: int | None = None) -> bool:
        """Start a checkpoint now (unless one is being written): the indexes as they are, marked ``now_us``."""
        entities = self._registry.entities
        indexes = [(path, e.detector) for path, e in entities.items() if e.detector.enabled]
        if self._later is not None and not self._later.done:  # a forked child must not wait for the loader
            self._later.wait_for_keys()
        if not self._start(indexes, now_us):
            return False
        self._accepted_then = self._accepted() if accepted is None else accepted
        self._replayed = 0
        self._later = None
        self._last = time.monotonic()
        return True
