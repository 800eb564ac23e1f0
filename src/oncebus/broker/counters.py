"""What the broker counts for metrics, the dashboard and the per-minute log: read in O(entities), never O(messages).

Everything here is updated incrementally where the event happens (a send judged, a
message received, settled, dead-lettered or expired, a commit written) and read on
the broker's loop by ``observation.view_entities``; nothing scans messages or touches the store.

- ``Histogram``: fixed buckets, cumulative at read time (Prometheus ``le`` semantics).
- ``ReceivableCounters``: per queue or subscription (its dead-letter sub-queue
  shares them): received, completed, abandoned, deferred, dead-lettered, expired.
- ``EntityCounters``: per queue or topic: the resend-delay histogram (the delay
  between a key's first acceptance and each resend, duplicates and late resends
  alike). Accepted / duplicates / late-resend totals are the entity's persisted
  counters, kept by the namespace.
- ``StoreCounters``: commit latency and commit batch size, fed by the store's
  writer thread through ``SqliteStore.commit_observer``.
- ``ActivityHistory``: accepted / duplicates / late resends over time per entity
  (cumulative samples, one per second while they change, for a quarter of an hour).
- ``EntityView`` / ``ReceivableView``: what one entity shows (built by ``oncebus.broker.observation``).
- ``suggest_window``: the smallest bucket edge covering a share of resends (99%),
  clamped to what Service Bus allows: a simple stand-in for the Spark window
  advisor, computed from the histogram alone.
"""

from __future__ import annotations

import collections
import logging
import math
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

_LOG = logging.getLogger("oncebus.duplicates")

MINUTE = 60.0
HOUR = 3600.0
DAY = 86400.0
# resolve 20 s .. 7 days (Service Bus windows), with a few edges below and one above for resends the window caught
RESEND_DELAY_BUCKETS_SECONDS: tuple[float, ...] = (
    1.0, 5.0, 10.0, 20.0, 30.0, 45.0, MINUTE, 2 * MINUTE, 5 * MINUTE, 10 * MINUTE, 15 * MINUTE, 30 * MINUTE, HOUR,
    2 * HOUR, 6 * HOUR, 12 * HOUR, DAY, 2 * DAY, 4 * DAY, 7 * DAY, 14 * DAY,
)  # fmt: skip
COMMIT_SECONDS_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
)  # fmt: skip
COMMIT_BATCH_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
WINDOW_MIN_SECONDS = 20.0
WINDOW_MAX_SECONDS = 7 * DAY
SUGGESTION_SHARE = 0.99

HISTORY_SAMPLE_US = 1_000_000
HISTORY_KEPT_US = 15 * 60 * 1_000_000
LOG_EVERY_US = 60 * 1_000_000


class Histogram:
    """Counts per fixed bucket; ``observe`` is a bisect and two additions."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        if list(self.bounds) != sorted(set(self.bounds)):
            raise ValueError(f"histogram bounds must increase strictly: {bounds!r}")
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def cumulative(self) -> list[tuple[float, int]]:
        """``(le, count of values <= le)`` per bound, ending with ``(inf, count)``."""
        counts = list(self.counts)  # one copy: a writer thread may be adding meanwhile
        out, total = [], 0
        for bound, n in zip((*self.bounds, math.inf), counts, strict=True):
            total += n
            out.append((bound, total))
        return out

    @property
    def count(self) -> int:
        return sum(self.counts)


def suggest_window(histogram: Histogram, share: float = SUGGESTION_SHARE) -> dict[str, Any]:
    """The smallest bucket edge at or above which ``share`` of the observed resends fall, clamped to PT20S..P7D.

    Resends seen here are those of keys still held (duplicates) or that left the
    window less than one window ago (late resends): resends later than that are
    not counted, so the suggestion can only be an underestimate when they exist.
    """
    cumulative = histogram.cumulative()
    total = cumulative[-1][1]
    if total == 0:
        return {"window_seconds": None, "share": share, "resends": 0, "covered": 0, "beyond_range": False}
    need = share * total
    edge = next(le for le, n in cumulative if n >= need)
    beyond = edge > WINDOW_MAX_SECONDS
    window = min(max(edge, WINDOW_MIN_SECONDS), WINDOW_MAX_SECONDS)
    return {
        "window_seconds": window,
        "share": share,
        "resends": total,
        "covered": next(n for le, n in cumulative if le >= window),  # resends a window this long would catch
        "beyond_range": beyond,  # 99% needs more than P7D: no Service Bus window catches them
    }


class ReceivableCounters:
    """Settlement counters of one queue or subscription (and its dead-letter sub-queue)."""

    __slots__ = ("abandoned", "completed", "dead_lettered", "deferred", "expired", "received")

    def __init__(self) -> None:
        self.received = 0
        self.completed = 0
        self.abandoned = 0
        self.deferred = 0
        self.dead_lettered = 0  # moved to the dead-letter sub-queue, for any reason
        self.expired = 0  # time to live ran out (dropped, or dead-lettered when the entity says so)


class EntityCounters:
    """Per queue or topic, beyond the persisted accepted / duplicates / late-resend totals."""

    __slots__ = ("resend_delays",)

    def __init__(self) -> None:
        self.resend_delays = Histogram(RESEND_DELAY_BUCKETS_SECONDS)

    def resends(self, delays_us: Iterable[int]) -> None:
        """Committed sends of keys first accepted ``delay_us`` earlier: duplicates and late resends."""
        for delay_us in delays_us:
            self.resend_delays.observe(delay_us / 1e6)


class StoreCounters:
    """Commit latency and units per commit; ``observe_commit`` runs on the store's writer thread."""

    __slots__ = ("commit_batch_size", "commit_seconds")

    def __init__(self) -> None:
        self.commit_seconds = Histogram(COMMIT_SECONDS_BUCKETS)
        self.commit_batch_size = Histogram(COMMIT_BATCH_BUCKETS)

    def observe_commit(self, seconds: float, units: int) -> None:
        self.commit_seconds.observe(seconds)
        self.commit_batch_size.observe(units)


# ---------------------------------------------------------------------------------- reading


@dataclass(slots=True)
class ReceivableView:
    """One queue, or one subscription of a topic (``subscription`` is "" for a queue)."""

    subscription: str
    active: int
    scheduled: int
    deferred: int
    dead_lettered: int
    counters: ReceivableCounters


@dataclass(slots=True)
class EntityView:
    name: str
    path: str
    kind: str  # "queue" | "topic"
    requires_duplicate_detection: bool
    window_seconds: float
    window: str  # ISO-8601, as configured
    enable_partitioning: bool
    accepted: int
    duplicates_dropped: int
    late_resends: int
    keys_held: int
    oldest_key_age_seconds: float | None
    index_bytes: int
    resend_delays: Histogram
    receivables: list[ReceivableView] = field(default_factory=list)


# ---------------------------------------------------------------------------------- over time


class ActivityHistory:
    """Cumulative (time, accepted, duplicates, late resends) per entity path, for charts.

    A step function: a sample is kept only when the totals differ from the last kept
    one, so the totals at any time are those of the last sample at or before it
    (exact to one sampling interval) and idle entities cost nothing. Samples older
    than ``kept_us`` are dropped, except the newest one (the level before the window).
    """

    def __init__(self, kept_us: int = HISTORY_KEPT_US) -> None:
        self.kept_us = kept_us
        self._points: dict[str, collections.deque[tuple[int, int, int, int]]] = {}

    def sample(self, now_us: int, totals: Iterable[tuple[str, int, int, int]]) -> None:
        seen = set()
        for path, accepted, duplicates, late in totals:
            seen.add(path)
            points = self._points.setdefault(path, collections.deque())
            if not points or points[-1][1:] != (accepted, duplicates, late):
                points.append((now_us, accepted, duplicates, late))
            while len(points) > 1 and points[1][0] <= now_us - self.kept_us:
                points.popleft()
        for gone in set(self._points) - seen:
            del self._points[gone]

    def points(self, path: str, since_us: int | None = None) -> list[tuple[int, int, int, int]]:
        points = self._points.get(path, ())
        return [p for p in points if since_us is None or p[0] > since_us]
