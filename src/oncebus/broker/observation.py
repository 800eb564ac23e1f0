"""The observation port's engine side: views of the entities for metrics and the dashboard, and the
clocked observer (history samples, the per-minute duplicate log).

- ``view_entities``: every entity's settings, counters and gauges, O(entities + subscriptions).
- ``NamespaceObserver``: owns the namespace-wide parts; ``tick`` (from ``Namespace.tick``) samples
  the history and logs, once a minute, one INFO line per entity that dropped duplicates or saw late
  resends (counts, never ids).

The counters themselves (``oncebus.broker.counters``) know nothing of entities or the namespace.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Protocol

from oncebus.broker.counters import (
    HISTORY_SAMPLE_US,
    LOG_EVERY_US,
    ActivityHistory,
    EntityView,
    ReceivableView,
    StoreCounters,
)
from oncebus.broker.receivable import Receivable
from oncebus.broker.registry import Entity
from oncebus.store.base import Store

_LOG = logging.getLogger("oncebus.duplicates")


def view_entities(entities: Iterable[Entity], now: int) -> list[EntityView]:
    """Every entity's settings, counters and gauges, in O(entities + subscriptions) (keys due expire first)."""
    views = []
    for entity in list(entities):
        detector = entity.detector
        dedup = detector.stats(now)  # keys due expire first
        props = entity.properties
        view = EntityView(
            name=props.name,
            path=entity.path,
            kind=entity.kind,
            requires_duplicate_detection=detector.enabled,
            window_seconds=detector.window.total_seconds(),
            window=props.to_dict()["duplicate_detection_history_time_window"],
            enable_partitioning=props.enable_partitioning,
            accepted=entity.counters.get("accepted", 0),
            duplicates_dropped=entity.counters.get("duplicates", 0),
            late_resends=entity.counters.get("late_resends", 0),
            keys_held=dedup.keys_held,
            oldest_key_age_seconds=dedup.oldest_key_age_seconds,
            index_bytes=dedup.index_bytes,
            resend_delays=entity.observed.resend_delays,
        )
        if entity.receivable is not None:
            view.receivables.append(_receivable_view("", entity.receivable))
        for subscription in entity.subscriptions.values():
            view.receivables.append(_receivable_view(subscription.properties.name, subscription.receivable))
        views.append(view)
    return views


def _receivable_view(subscription: str, receivable: Receivable) -> ReceivableView:
    counts = receivable.counts()
    return ReceivableView(
        subscription=subscription,
        active=counts["active"],
        scheduled=counts["scheduled"],
        deferred=counts["deferred"],
        dead_lettered=counts["dead_lettered"],
        counters=receivable.counters,
    )


class TransportGauges(Protocol):
    """What a front end reports about its open connections and links, through the observation port: the AMQP
    server sets itself as ``observer.transport`` when it starts (``/metrics`` and the dashboard read it)."""

    def connections_open(self) -> int: ...

    def links_open(self) -> int: ...


class NamespaceObserver:
    """The namespace-wide counters and the clocked work: history samples and the per-minute duplicate log."""

    def __init__(self) -> None:
        self.store = StoreCounters()
        self.history = ActivityHistory()
        self.transport: TransportGauges | None = None  # set by the AMQP server serving this namespace
        self._next_sample_us = 0
        self._next_log_us = 0
        self._logged: dict[str, tuple[int, int, int]] = {}

    def attach_store(self, store: Store) -> None:
        """Have the store report its commits here (the SQLite and PostgreSQL stores do; the memory one does not)."""
        store.commit_observer = self.store.observe_commit

    def tick(self, entities: Mapping[str, Entity], now_us: int) -> None:
        """Called by ``Namespace.tick``: O(entities) at most once a second."""
        if now_us < self._next_sample_us:
            return
        self._next_sample_us = now_us + HISTORY_SAMPLE_US
        totals = [
            (e.path, e.counters.get("accepted", 0), e.counters.get("duplicates", 0), e.counters.get("late_resends", 0))
            for e in entities.values()
        ]
        self.history.sample(now_us, totals)
        if self._next_log_us == 0:
            self._next_log_us = now_us + LOG_EVERY_US
            self._logged = {path: (a, d, late) for path, a, d, late in totals}
        elif now_us >= self._next_log_us:
            self._next_log_us = now_us + LOG_EVERY_US
            self._log(entities, totals)

    def _log(self, entities: Mapping[str, Entity], totals: list[tuple[str, int, int, int]]) -> None:
        logged = {}
        for path, accepted, duplicates, late in totals:
            before = self._logged.get(path, (0, 0, 0))
            logged[path] = (accepted, duplicates, late)
            d_accepted, d_duplicates, d_late = accepted - before[0], duplicates - before[1], late - before[2]
            if d_duplicates <= 0 and d_late <= 0:
                continue
            entity = entities.get(path)
            if entity is None:
                continue
            window = entity.detector.window.total_seconds()
            _LOG.info(
                "%s: %d accepted, %d duplicates dropped, %d late resends in the last minute (window %s)",
                path,
                d_accepted,
                d_duplicates,
                d_late,
                entity.properties.to_dict()["duplicate_detection_history_time_window"],
                extra={
                    "entity": path,
                    "accepted": d_accepted,
                    "duplicates_dropped": d_duplicates,
                    "late_resends": d_late,
                    "window_seconds": window,
                },
            )
        self._logged = logged
