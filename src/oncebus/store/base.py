"""The store interface: durable entities, messages and dedup history, written in atomic units.

A *unit* is a list of operations that commit together (one send: its messages
and their dedup keys). ``submit`` returns a future resolved once the unit is
durable; implementations may commit several queued units in one transaction
(group commit) but never split one.

A *settlement* (complete, abandon, defer, dead-letter: a unit that stores no new
message and no dedup key) may be submitted with ``durable=False``: its future
resolves once it is committed where a crash of the process cannot lose it, and it
becomes power-safe with the store's next sync (any durable unit's commit, or a
periodic one, see ``SETTLEMENT_SYNC_SECONDS``). Losing one in a power failure only
means its message is delivered again, which peek-lock (at least once) allows.
Transactions are a log: a unit is never durable unless every unit committed before
it is too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from oncebus.core.messages import StoredMessage
from oncebus.store.dedup_images import DedupImage, Dumpable

DLQ_SUFFIX = "/$deadletterqueue"
SETTLEMENT_SYNC_SECONDS = 0.1  # a settlement confirmed before its sync is synced within this (while the store runs)
SUBSCRIPTIONS = "/subscriptions/"


DedupIndexes = Iterable[tuple[str, Dumpable]]  # (receivable path, its dedup index) for a checkpoint


@dataclass(slots=True)
class PutEntity:
    path: str  # lower case: "orders", "events", "events/subscriptions/audit"
    kind: str  # "queue" | "topic" | "subscription"
    properties: dict[str, Any]


@dataclass(slots=True)
class DeleteEntity:
    path: str  # deletes the entity, its messages, sessions, dedup history and sub-entities (see ``owned_by``)


def owned_by(path: str, entity: str) -> bool:
    """Whether ``path`` (an entity, a receivable or a dead-letter queue) belongs to the queue or topic ``entity``.

    What belongs to ``orders`` is ``orders`` itself, ``orders/$deadletterqueue`` and, for a topic, its
    subscriptions ``orders/subscriptions/<name>`` and their dead-letter queues. ``orders/eu`` is another
    entity (entity names may hold '/'; no name segment may be ``$…`` or ``subscriptions``).
    """
    return path == entity or path == entity + DLQ_SUFFIX or path.startswith(entity + SUBSCRIPTIONS)


def owned_ranges(entity: str) -> tuple[tuple[str, ...], tuple[str, str]]:
    """``owned_by`` as SQL can use an index for it: exact paths, and a half-open range [low, high) of paths."""
    prefix = entity + SUBSCRIPTIONS
    return (entity, entity + DLQ_SUFFIX), (prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1))


@dataclass(slots=True)
class PutMessage:
    message: StoredMessage
    # the send's dedup key, written in the same unit: (entity, key text, first accepted us)
    dedup_key: tuple[str, str, int] | None = None


@dataclass(slots=True)
class DeleteMessage:
    path: str
    sequence_number: int


@dataclass(slots=True)
class UpdateMessage:
    """A held message's state and delivery count changed (abandon, defer); its content stays."""

    path: str
    sequence_number: int
    state: int
    delivery_count: int
    application_properties: dict[str, Any] | None = None  # properties to merge in (abandon's modifications)


@dataclass(slots=True)
class MoveMessage:
    """A message moved to its receivable's dead-letter queue (content kept, not copied)."""

    path: str
    sequence_number: int
    to_path: str
    state: int
    dead_letter_reason: str | None
    dead_letter_error_description: str | None
    dead_letter_source: str | None = None


@dataclass(slots=True)
class PutDedupKey:
    entity: str
    key: str
    first_accepted_us: int


@dataclass(slots=True)
class PruneDedupKeys:
    entity: str
    accepted_before_us: int  # delete keys with first_accepted_us < this


@dataclass(slots=True)
class PutSessionState:
    path: str
    session_id: str
    state: bytes | None  # None deletes
    # when the state was set (us; what ``get-message-sessions`` with a last-updated time compares); None: not known
    # (a state an older release stored, read back), or a delete
    updated_us: int | None = None


@dataclass(slots=True)
class PutRules:
    """A subscription's whole rule list, replacing what was stored (``RuleProperties.to_dict()`` of each, in order).

    An empty list is a subscription without rules (it receives nothing); a subscription with no stored list at
    all (only possible in a store written before rules were stored) has the ``$Default`` rule.
    """

    path: str  # the subscription: "events/subscriptions/audit"
    rules: list[dict[str, Any]]


@dataclass(slots=True)
class AddCounters:
    """Counts committed with this unit: each counter grows by its delta; the next sequence number never shrinks.

    Deltas, not totals, so a unit that fails takes its counts with it and no later unit writes them back.
    """

    entity: str
    next_sequence_number: int
    counters: dict[str, int]


Op = (
    PutEntity
    | DeleteEntity
    | PutMessage
    | DeleteMessage
    | UpdateMessage
    | MoveMessage
    | PutDedupKey
    | PruneDedupKeys
    | PutSessionState
    | AddCounters
    | PutRules
)

# What start-up needs of a stored message (never its content):
# (path, sequence_number, state, delivery_count, enqueued_time_us, expires_at_us, size, session_id)
MessageRow = tuple[str, int, int, int, int, int | None, int, str | None]


@dataclass
class Snapshot:
    """Everything needed to rebuild the broker at start."""

    entities: list[PutEntity] = field(default_factory=list)
    messages: Iterable[MessageRow] = ()  # by path, then sequence number; read once (may be a cursor)
    # the keys of each queue or topic with duplicate detection and no image, each entity's by first_accepted_us
    # (read once: may be a cursor); a key with several rows (accepted again after it left the window) may come
    # once per row, the latest last
    dedup_keys: Iterable[PutDedupKey] = field(default_factory=list)
    session_states: list[PutSessionState] = field(default_factory=list)
    counters: dict[str, AddCounters] = field(default_factory=dict)  # totals
    rules: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # subscription path -> its rules
    # entity -> an image of its dedup index to load in bulk (its keys are then not in dedup_keys); see
    # store/dedup_images.py. An entity whose image fails to load rebuilds from ``keys_of(entity)``.
    dedup_images: dict[str, DedupImage] = field(default_factory=dict)
    newest_key_us: int = 0  # the newest first_accepted_us of any key held, or dedup checkpoint mark if later
    keys_of: Callable[[str], Iterable[PutDedupKey]] = lambda entity: ()


class Store(Protocol):
    # told each commit's seconds and units, on the thread that committed (the observer's store counters);
    # a store that does not time its commits leaves it unused
    commit_observer: Callable[[float, int], None] | None

    def load(self) -> Snapshot: ...

    def read_messages(self, path: str, sequence_numbers: Sequence[int]) -> dict[int, StoredMessage]:
        """The content of committed messages of one receivable (those found), read on the caller's thread."""
        ...

    def submit(self, unit: Sequence[Op], *, durable: bool = True) -> Future[None]:
        """Queue a unit for commit; the future resolves once it is durable (or fails).

        ``durable=False`` (settlements only, see the module): once committed, process-crash safe; power-safe
        within ``SETTLEMENT_SYNC_SECONDS``.
        """
        ...

    def commit_now(self, unit: Sequence[Op]) -> bool:
        """Store a settlement unit on the caller's thread, as safely as ``submit(unit, durable=False)`` would,
        if the store can without reordering it; False: nothing was done, ``submit`` it. Raises
        ``StoreWriteError`` if it failed (nothing of it stored). Never waits for a disk or another thread."""
        ...

    def checkpoint_dedup(self, indexes: DedupIndexes, since_us: int) -> bool:
        """Start a checkpoint of the dedup ``indexes`` (each key first accepted at or before ``since_us``), from
        the thread that judges and submits, between two of its steps; False: none started (a store without
        images never starts one: a restart reads its key rows)."""
        ...

    def keep_dedup_images(self, indexes: Callable[[], DedupIndexes], since_us: int) -> None:
        """At ``close``, once every unit is committed, store images of ``indexes()`` for the next start
        (a store without images ignores it)."""
        ...

    def close(self) -> None: ...
