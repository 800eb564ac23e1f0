"""GET /metrics over real HTTP after a known sequence of sends, resends, receives and dead-letters (time injected)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from oncebus.broker import Message, ServiceBusReceiveMode
from oncebus.broker.entries import HeldMessages
from oncebus.core.messages import MessageState
from oncebus.core.timeutil import us_to_datetime
from tests.http.observe_server import ObservedBroker, samples

S = 1_000_000
RAD = ServiceBusReceiveMode.RECEIVE_AND_DELETE
RESEND_BUCKETS = [
    1, 5, 10, 20, 30, 45, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400, 172800, 345600, 604800, 1209600
]  # fmt: skip


def _known_sequence(broker: ObservedBroker) -> None:
    """orders: queue, window 60 s; events: topic, window 20 s, subscriptions audit and billing; plain: no dedup."""
    ns, clock = broker.ns, broker.clock
    t0 = clock.now_us()

    def at(seconds: float) -> None:
        clock.set(t0 + round(seconds * S))

    async def go() -> None:
        await ns.create_queue(
            "orders", requires_duplicate_detection=True, duplicate_detection_history_time_window="PT1M"
        )
        await ns.create_topic(
            "events", requires_duplicate_detection=True, duplicate_detection_history_time_window="PT20S"
        )
        await ns.create_subscription("events", "audit")
        await ns.create_subscription("events", "Billing")
        await ns.create_queue("plain")
        await ns.send(
            "orders", [Message(b"a", message_id="a"), Message(b"b", message_id="b"), Message(b"c", message_id="c")]
        )
        await ns.send("events", Message(b"e", message_id="e1"))
        await ns.send("plain", [Message(b"p"), Message(b"q")])
        at(5)
        assert (await ns.send("events", Message(b"e", message_id="e1")))[0].duplicate  # resend after 5 s
        at(10)
        assert (await ns.send("orders", Message(b"a", message_id="a")))[0].duplicate  # 10 s
        at(30)
        assert (await ns.send("orders", Message(b"b", message_id="b")))[0].duplicate  # 30 s
        at(59)
        assert (await ns.send("orders", Message(b"a", message_id="a")))[0].duplicate  # 59 s: the last one caught
        at(70)
        late = await ns.send("orders", [Message(b"c", message_id="c"), Message(b"d", message_id="d")])
        assert late[0].late_resend_delay_us == 70 * S  # outside the window by 10 s: accepted again
        at(200)
        fresh = await ns.send("orders", Message(b"a", message_id="a"))  # left the window long ago: a new key
        assert not fresh[0].duplicate and fresh[0].late_resend_delay_us is None
        await ns.send("orders", Message(b"t", message_id="ttl", time_to_live=timedelta(seconds=5)))
        await ns.schedule_messages("orders", Message(b"s", message_id="s"), us_to_datetime(t0 + 1000 * S))
        at(201)
        a, b, c = await ns.receive("orders", 3)
        assert [a.message_id, b.message_id, c.message_id] == ["a", "b", "c"]
        await ns.complete("orders", a.lock_token)  # type: ignore[arg-type]
        await ns.abandon("orders", b.lock_token)  # type: ignore[arg-type]
        await ns.dead_letter("orders", c.lock_token, reason="test")  # type: ignore[arg-type]
        assert [m.message_id for m in await ns.receive("orders", 1, receive_mode=RAD)] == ["b"]
        (again,) = await ns.receive("orders", 1)
        assert again.message_id == "c"  # the late resend
        await ns.defer("orders", again.lock_token)  # type: ignore[arg-type]
        (dead,) = await ns.receive("orders/$deadletterqueue", 1)
        await ns.abandon("orders/$deadletterqueue", dead.lock_token)  # type: ignore[arg-type]
        (audit,) = await ns.receive("events/subscriptions/audit", 1)
        await ns.complete("events/subscriptions/audit", audit.lock_token)  # type: ignore[arg-type]
        at(230)
        ns.tick()  # the ttl message expires (dropped: no dead-lettering on expiration)
        await ns._journal.barrier(ns._journal.failed_writes)  # the tick's write is durable

    broker.call(go)


def _buckets(got: dict, name: str, labels: dict[str, str]) -> dict[float, float]:
    out = {}
    for (sample, sample_labels), value in got.items():
        as_dict = dict(sample_labels)
        le = as_dict.pop("le", None)
        if sample == name + "_bucket" and as_dict == labels:
            out[float(le)] = value  # type: ignore[arg-type]
    return out


def test_metrics_after_a_known_sequence(tmp_path: Path) -> None:
    with ObservedBroker(tmp_path) as broker:
        _known_sequence(broker)
        status, headers, body = broker.get("/metrics")
        assert status == 200 and headers["content-type"].startswith("text/plain; version=")
        families = list(text_string_to_metric_families(body.decode()))
        stats = {name: broker.sync(lambda name=name: broker.ns.stats(name).to_dict()) for name in ("orders", "events")}
        store_commits, store_units = broker.store.commits, broker.store.units

    types = {f.name: f.type for f in families}
    got = samples(families)
    orders, events, plain = (("entity", "orders"),), (("entity", "events"),), (("entity", "plain"),)

    def receivable(entity: str, subscription: str = "") -> tuple[tuple[str, str], ...]:
        return (("entity", entity), ("subscription", subscription))

    expected: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {
        # per entity: accepted, duplicates, late resends
        ("oncebus_messages_accepted_total", orders): 8,  # a b c, c again (late) d, a again (new), ttl, s
        ("oncebus_messages_accepted_total", events): 1,
        ("oncebus_messages_accepted_total", plain): 2,
        ("oncebus_duplicates_dropped_total", orders): 3,
        ("oncebus_duplicates_dropped_total", events): 1,
        ("oncebus_duplicates_dropped_total", plain): 0,
        ("oncebus_late_resends_total", orders): 1,
        ("oncebus_late_resends_total", events): 0,
        ("oncebus_late_resends_total", plain): 0,
        # dedup gauges (entities with duplicate detection only) at t = 230 s
        ("oncebus_dedup_keys_held", orders): 3,  # a, ttl and s, first accepted at 200 s
        ("oncebus_dedup_keys_held", events): 0,
        ("oncebus_dedup_oldest_key_age_seconds", orders): 30,
        ("oncebus_dedup_oldest_key_age_seconds", events): 0,
        ("oncebus_dedup_window_seconds", orders): 60,
        ("oncebus_dedup_window_seconds", events): 20,
        ("oncebus_dedup_index_bytes", orders): stats["orders"]["index_bytes"],
        ("oncebus_dedup_index_bytes", events): stats["events"]["index_bytes"],
        ("oncebus_resend_delay_seconds_count", orders): 4,
        ("oncebus_resend_delay_seconds_sum", orders): 10 + 30 + 59 + 70,
        ("oncebus_resend_delay_seconds_count", events): 1,
        ("oncebus_resend_delay_seconds_sum", events): 5,
        # queues and subscriptions: messages by state
        ("oncebus_active_messages", receivable("orders")): 2,  # d and the second a
        ("oncebus_scheduled_messages", receivable("orders")): 1,
        ("oncebus_deferred_messages", receivable("orders")): 1,
        ("oncebus_dead_lettered_messages", receivable("orders")): 1,
        ("oncebus_active_messages", receivable("events", "audit")): 0,
        ("oncebus_active_messages", receivable("events", "billing")): 1,
        ("oncebus_active_messages", receivable("plain")): 2,
        # settlements (a queue's dead-letter sub-queue counts with it)
        ("oncebus_messages_received_total", receivable("orders")): 6,
        ("oncebus_messages_completed_total", receivable("orders")): 1,
        ("oncebus_messages_abandoned_total", receivable("orders")): 2,
        ("oncebus_messages_deferred_total", receivable("orders")): 1,
        ("oncebus_messages_dead_lettered_total", receivable("orders")): 1,
        ("oncebus_messages_expired_total", receivable("orders")): 1,
        ("oncebus_messages_received_total", receivable("events", "audit")): 1,
        ("oncebus_messages_completed_total", receivable("events", "audit")): 1,
    }
    for delay_family, entity, delays in (
        ("oncebus_resend_delay_seconds", orders, [10, 30, 59, 70]),
        ("oncebus_resend_delay_seconds", events, [5]),
    ):
        for le in RESEND_BUCKETS:
            expected[(delay_family + "_bucket", (*entity, ("le", str(float(le)))))] = sum(d <= le for d in delays)
        expected[(delay_family + "_bucket", (*entity, ("le", "+Inf")))] = len(delays)
    for name in ("scheduled", "deferred", "dead_lettered"):
        for where in (receivable("events", "audit"), receivable("events", "billing"), receivable("plain")):
            expected[(f"oncebus_{name}_messages", where)] = 0
    for name in ("received", "completed", "abandoned", "deferred", "dead_lettered", "expired"):
        for where in (receivable("events", "audit"), receivable("events", "billing"), receivable("plain")):
            expected.setdefault((f"oncebus_messages_{name}_total", where), 0)

    broker_samples = {
        key: value
        for key, value in got.items()
        if not key[0].startswith("oncebus_store_") and not key[0].startswith("oncebus_resend_delay_seconds_bucket")
    }
    expected_plain = {k: v for k, v in expected.items() if not k[0].startswith("oncebus_resend_delay_seconds_bucket")}
    assert broker_samples == expected_plain
    for entity in (orders, events):
        got_buckets = _buckets(got, "oncebus_resend_delay_seconds", dict(entity))
        want = {
            float(dict(labels)["le"]): value
            for (name, labels), value in expected.items()
            if name == "oncebus_resend_delay_seconds_bucket" and dict(labels)["entity"] == dict(entity)["entity"]
        }
        assert got_buckets == want
    # buckets resolve 20 s .. 7 days
    assert {20.0, 60.0, 3600.0, 86400.0, 604800.0} <= set(_buckets(got, "oncebus_resend_delay_seconds", dict(orders)))

    # the store: one histogram sample per commit, and every unit of those commits in the batch sizes
    assert got[("oncebus_store_commit_seconds_count", ())] == store_commits > 0
    assert got[("oncebus_store_commit_batch_size_count", ())] == store_commits
    assert store_commits <= got[("oncebus_store_commit_batch_size_sum", ())] <= store_units
    assert got[("oncebus_store_commit_seconds_bucket", (("le", "+Inf"),))] == store_commits
    assert 0 < got[("oncebus_store_commit_seconds_sum", ())] < 60

    assert types == {
        "oncebus_messages_accepted": "counter",
        "oncebus_duplicates_dropped": "counter",
        "oncebus_late_resends": "counter",
        "oncebus_resend_delay_seconds": "histogram",
        "oncebus_dedup_keys_held": "gauge",
        "oncebus_dedup_oldest_key_age_seconds": "gauge",
        "oncebus_dedup_window_seconds": "gauge",
        "oncebus_dedup_index_bytes": "gauge",
        "oncebus_active_messages": "gauge",
        "oncebus_scheduled_messages": "gauge",
        "oncebus_deferred_messages": "gauge",
        "oncebus_dead_lettered_messages": "gauge",
        "oncebus_messages_received": "counter",
        "oncebus_messages_completed": "counter",
        "oncebus_messages_abandoned": "counter",
        "oncebus_messages_deferred": "counter",
        "oncebus_messages_dead_lettered": "counter",
        "oncebus_messages_expired": "counter",
        "oncebus_store_commit_seconds": "histogram",
        "oncebus_store_commit_batch_size": "histogram",
        "oncebus_faults_fired": "counter",  # none fired here: the families are there, empty
        "oncebus_faults_armed": "gauge",
    }


def test_scrape_never_walks_the_messages(tmp_path: Path) -> None:
    """O(entities): a scrape with thousands of messages held reads none of them: with the messages taken out of
    sight (an empty table in their place, the counters left as they are) it still reports all of them, which a
    count from a walk would not. (A seam that holds compiled too: a compiled HeldMessages takes no subclass.)"""

    with ObservedBroker(tmp_path) as broker:

        async def fill() -> None:
            await broker.ns.create_queue("big", requires_duplicate_detection=True)
            for start in range(0, 3000, 500):
                await broker.ns.send("big", [Message(b"x", message_id=str(i)) for i in range(start, start + 500)])

        broker.call(fill)
        receivable = broker.sync(lambda: broker.ns.receivable("big"))
        held = receivable.messages
        receivable.messages = HeldMessages(MessageState.ACTIVE)  # a walk would find none of the 3000
        try:
            status, _, body = broker.get("/metrics")
            assert status == 200, body
            got = samples(text_string_to_metric_families(body.decode()))
            assert got[("oncebus_active_messages", (("entity", "big"), ("subscription", "")))] == 3000
            assert got[("oncebus_dedup_keys_held", (("entity", "big"),))] == 3000
            status, _, body = broker.get("/api/dashboard")
            assert status == 200, body
            assert b"3000" in body or b"3,000" in body, body
        finally:
            receivable.messages = held


@pytest.mark.parametrize(
    ("path", "method", "status"),
    [("/metrics", "POST", 405), ("/nope", "GET", 404), ("/api/dashboard?since=soon", "GET", 400)],
)
def test_bad_requests_are_refused_clearly(tmp_path: Path, path: str, method: str, status: int) -> None:
    import urllib.error
    import urllib.request

    with ObservedBroker(tmp_path) as broker:
        request = urllib.request.Request(broker.url + path, method=method, data=b"" if method == "POST" else None)
        with pytest.raises(urllib.error.HTTPError) as error:
            urllib.request.urlopen(request, timeout=10)
        assert error.value.code == status
        text = error.value.read().decode()
        assert {405: "only GET and HEAD", 404: "not found: /nope", 400: "since must be an integer"}[status] in text


def test_openmetrics_when_asked(tmp_path: Path) -> None:
    with ObservedBroker(tmp_path) as broker:
        broker.call(lambda: broker.ns.create_queue("q"))
        status, headers, body = broker.get("/metrics", {"Accept": "application/openmetrics-text; version=1.0.0"})
        assert status == 200 and headers["content-type"].startswith("application/openmetrics-text")
        assert body.decode().rstrip().endswith("# EOF")
        assert 'oncebus_messages_accepted_total{entity="q"} 0.0' in body.decode()


def test_gzip_when_accepted(tmp_path: Path) -> None:
    import gzip

    with ObservedBroker(tmp_path) as broker:
        broker.call(lambda: broker.ns.create_queue("q"))
        status, headers, body = broker.get("/metrics", {"Accept-Encoding": "gzip"})
        assert status == 200 and headers["content-encoding"] == "gzip"
        got = samples(text_string_to_metric_families(gzip.decompress(body).decode()))
        assert got[("oncebus_messages_accepted_total", (("entity", "q"),))] == 0
