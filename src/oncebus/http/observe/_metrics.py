"""The Prometheus collector: metric families built from the broker's counters, O(entities) per scrape."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from oncebus.broker import EntityView, Histogram

if TYPE_CHECKING:
    from oncebus.broker import Observation

ENTITY = ["entity"]
RECEIVABLE = ["entity", "subscription"]  # subscription is "" for a queue


def _buckets(histogram: Histogram) -> list[tuple[str, float]]:
    return [(str(floatToGoString(le)), float(n)) for le, n in histogram.cumulative()]  # type: ignore[no-untyped-call]


class NamespaceCollector(Collector):
    """Yields the oncebus metric families for one namespace (and the gauges its AMQP server reports to it)."""

    def __init__(self, namespace: Observation) -> None:
        self.namespace = namespace

    def collect(self) -> Iterator[Metric]:
        views = self.namespace.entity_views()
        yield from self._entity_families(views)
        yield from self._receivable_families(views)
        yield from self._store_families()
        yield from self._fault_families()
        transport = self.namespace.observer.transport  # reported by the AMQP server serving this namespace
        if transport is not None:
            yield GaugeMetricFamily(
                "oncebus_connections_open", "AMQP connections open", value=transport.connections_open()
            )
            yield GaugeMetricFamily(
                "oncebus_links_open", "AMQP links open (entity, $cbs and $management links)",
                value=transport.links_open(),
            )  # fmt: skip

    def _entity_families(self, views: list[EntityView]) -> Iterator[Metric]:
        accepted = CounterMetricFamily(
            "oncebus_messages_accepted", "Messages accepted and stored (duplicates not included)", labels=ENTITY
        )
        duplicates = CounterMetricFamily(
            "oncebus_duplicates_dropped",
            "Sends dropped as duplicates (reported to the sender as accepted, as Service Bus does)",
            labels=ENTITY,
        )
        late = CounterMetricFamily(
            "oncebus_late_resends",
            "Sends of a key that had left the history window less than one window ago (accepted again)",
            labels=ENTITY,
        )
        delays = HistogramMetricFamily(
            "oncebus_resend_delay_seconds",
            "Delay between a key's first acceptance and each resend, duplicates and late resends alike "
            "(since the broker started)",
            labels=ENTITY,
        )
        keys = GaugeMetricFamily("oncebus_dedup_keys_held", "Dedup keys inside the history window", labels=ENTITY)
        oldest = GaugeMetricFamily(
            "oncebus_dedup_oldest_key_age_seconds", "Age of the oldest dedup key held (0 when none)", labels=ENTITY
        )
        window = GaugeMetricFamily(
            "oncebus_dedup_window_seconds", "The duplicate detection history time window", labels=ENTITY
        )
        index_bytes = GaugeMetricFamily(
            "oncebus_dedup_index_bytes", "Memory of the dedup index's held keys", labels=ENTITY
        )
        for view in views:
            label = [view.path]
            accepted.add_metric(label, view.accepted)
            duplicates.add_metric(label, view.duplicates_dropped)
            late.add_metric(label, view.late_resends)
            if view.requires_duplicate_detection:
                delays.add_metric(label, _buckets(view.resend_delays), view.resend_delays.sum)
                keys.add_metric(label, view.keys_held)
                oldest.add_metric(label, view.oldest_key_age_seconds or 0.0)
                window.add_metric(label, view.window_seconds)
                index_bytes.add_metric(label, view.index_bytes)
        yield from (accepted, duplicates, late, delays, keys, oldest, window, index_bytes)

    def _receivable_families(self, views: list[EntityView]) -> Iterator[Metric]:
        gauges = {
            name: GaugeMetricFamily(f"oncebus_{name}_messages", doc, labels=RECEIVABLE)
            for name, doc in (
                ("active", "Active messages (locked ones included)"),
                ("scheduled", "Scheduled messages not yet enqueued"),
                ("deferred", "Deferred messages"),
                ("dead_lettered", "Messages in the dead-letter sub-queue"),
            )
        }
        counters = {
            name: CounterMetricFamily(f"oncebus_messages_{name}", doc, labels=RECEIVABLE)
            for name, doc in (
                ("received", "Messages delivered to receivers (dead-letter sub-queue included)"),
                ("completed", "Messages completed"),
                ("abandoned", "Messages abandoned"),
                ("deferred", "Messages deferred"),
                ("dead_lettered", "Messages moved to the dead-letter sub-queue, for any reason"),
                ("expired", "Messages whose time to live ran out"),
            )
        }
        for view in views:
            for receivable in view.receivables:
                label = [view.path, receivable.subscription.lower()]
                for name, family in gauges.items():
                    family.add_metric(label, getattr(receivable, name))
                for name, counter in counters.items():
                    counter.add_metric(label, getattr(receivable.counters, name))
        yield from gauges.values()
        yield from counters.values()

    def _store_families(self) -> Iterator[Metric]:
        store = self.namespace.observer.store
        latency = HistogramMetricFamily(
            "oncebus_store_commit_seconds", "Time to write and sync one store transaction (group commit)"
        )
        latency.add_metric([], _buckets(store.commit_seconds), store.commit_seconds.sum)
        batch = HistogramMetricFamily(
            "oncebus_store_commit_batch_size", "Units (sends, settlements, ...) written by one store transaction"
        )
        batch.add_metric([], _buckets(store.commit_batch_size), store.commit_batch_size.sum)
        yield latency
        yield batch

    def _fault_families(self) -> Iterator[Metric]:
        book = self.namespace.faults
        fired = CounterMetricFamily(
            "oncebus_faults_fired",
            "Faults armed by a test that fired (oncebus.broker.faults)",
            labels=["kind", "entity"],
        )
        for (kind, path), count in sorted(book.fired.items()):
            fired.add_metric([kind, path], count)
        armed = GaugeMetricFamily("oncebus_faults_armed", "Faults armed now, by kind", labels=["kind"])
        by_kind = Counter(fault.spec.kind for fault in book.list())
        for kind, count in sorted(by_kind.items()):
            armed.add_metric([kind], count)
        yield fired
        yield armed


def make_registry(namespace: Observation) -> CollectorRegistry:
    """A registry holding only this namespace's collector (not the process-wide default registry)."""
    registry = CollectorRegistry()
    registry.register(NamespaceCollector(namespace))
    return registry
