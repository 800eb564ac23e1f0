"""The dashboard's JSON: entities with their dedup settings, counters, resend-delay histogram and history."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from oncebus.broker import HISTORY_KEPT_US, HISTORY_SAMPLE_US, EntityView, Histogram, suggest_window

if TYPE_CHECKING:
    from oncebus.broker import Observation


def _histogram(histogram: Histogram) -> dict[str, Any]:
    """Per-bucket (not cumulative) counts; the last bucket's ``le`` is null (+Inf)."""
    counts = list(histogram.counts)
    edges: list[float | None] = [*histogram.bounds, None]
    buckets = [[le, n] for le, n in zip(edges, counts, strict=True)]
    return {"buckets": buckets, "count": sum(counts), "sum": histogram.sum}


def _quantile(histogram: Histogram, q: float) -> float | None:
    """Upper bucket edge below which ``q`` of the observations fall (None with none, or past the last edge)."""
    cumulative = histogram.cumulative()
    total = cumulative[-1][1]
    if total == 0:
        return None
    le = next(le for le, n in cumulative if n >= q * total)
    return None if math.isinf(le) else le


def _entity(view: EntityView, history: list[tuple[int, int, int, int]]) -> dict[str, Any]:
    return {
        "name": view.name,
        "path": view.path,
        "kind": view.kind,
        "requires_duplicate_detection": view.requires_duplicate_detection,
        "duplicate_detection_history_time_window": view.window,
        "window_seconds": view.window_seconds,
        "enable_partitioning": view.enable_partitioning,
        "accepted": view.accepted,
        "duplicates_dropped": view.duplicates_dropped,
        "late_resends": view.late_resends,
        "keys_held": view.keys_held,
        "oldest_key_age_seconds": view.oldest_key_age_seconds,
        "index_bytes": view.index_bytes,
        "resend_delay": _histogram(view.resend_delays),
        "suggestion": suggest_window(view.resend_delays),
        "receivables": [
            {
                "subscription": r.subscription,
                "active": r.active,
                "scheduled": r.scheduled,
                "deferred": r.deferred,
                "dead_lettered": r.dead_lettered,
                "received_total": r.counters.received,
                "completed_total": r.counters.completed,
                "abandoned_total": r.counters.abandoned,
                "deferred_total": r.counters.deferred,
                "dead_lettered_total": r.counters.dead_lettered,
                "expired_total": r.counters.expired,
            }
            for r in view.receivables
        ],
        "history": [list(point) for point in history],
    }


def dashboard_state(namespace: Observation, *, since_us: int | None = None) -> dict[str, Any]:
    """Everything the page shows; ``history`` holds only samples newer than ``since_us`` when given."""
    views = namespace.entity_views()
    observer = namespace.observer
    transport = observer.transport  # reported by the AMQP server serving this namespace
    store = observer.store
    return {
        "now_us": namespace.clock.now_us(),
        "sample_us": HISTORY_SAMPLE_US,
        "history_kept_us": HISTORY_KEPT_US,
        "entities": [_entity(v, observer.history.points(v.path, since_us)) for v in views],
        "store": {
            "commits": store.commit_seconds.count,
            "commit_seconds_p50": _quantile(store.commit_seconds, 0.5),
            "commit_seconds_p99": _quantile(store.commit_seconds, 0.99),
            "commit_batch_size_mean": store.commit_batch_size.sum / store.commit_batch_size.count
            if store.commit_batch_size.count
            else None,
        },
        "transport": None
        if transport is None
        else {"connections_open": transport.connections_open(), "links_open": transport.links_open()},
    }
