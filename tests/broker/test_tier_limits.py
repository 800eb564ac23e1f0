"""Issue 19, item 5: the namespace's tier and Azure's quotas on it, enforced by the broker (in process).

Counts are namespace parameters (``TierQuotas``): these tests prove each mechanism with a small figure;
``tests/core/test_tiers.py`` asserts Azure's figures are the defaults.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from oncebus.broker import ManualClock, Message, Namespace
from oncebus.core.errors import ArgumentOutOfRangeError, MessageSizeExceededError, QuotaExceededError, ServerBusyError
from oncebus.core.rules import CorrelationRuleFilter, RuleProperties, SqlRuleFilter
from oncebus.core.tiers import STANDARD, Tier, TierQuotas
from tests.broker.conftest import StoreFactory, run

KB = 1024
PREMIUM = TierQuotas.of(Tier.PREMIUM)


def _with(stores: StoreFactory, quotas: TierQuotas, body: Callable[[Namespace], Awaitable[None]]) -> None:
    async def go() -> None:
        ns = await Namespace.open(stores.open(), ManualClock(), quotas=quotas)
        try:
            await body(ns)
        finally:
            await ns.close()

    run(go())


def test_the_namespace_is_standard_unless_told(stores: StoreFactory) -> None:
    async def body(ns: Namespace) -> None:
        assert ns.quotas == STANDARD
        assert (await ns.create_queue("q")).max_message_size_in_kilobytes == 256

    _with(stores, STANDARD, body)


def test_a_5_mib_message_is_refused_on_standard_and_stores_nothing(stores: StoreFactory) -> None:
    async def body(ns: Namespace) -> None:
        await ns.create_queue("q", requires_duplicate_detection=True)
        await ns.send("q", Message(b"x" * 256 * KB, message_id="at"))
        with pytest.raises(MessageSizeExceededError, match="over the limit of 262144 bytes"):
            await ns.send("q", Message(b"x" * 5 * KB * KB, message_id="big"))
        with pytest.raises(MessageSizeExceededError, match="over the limit of 262144 bytes"):
            await ns.send("q", Message(b"x" * (256 * KB + 1), message_id="over"))
        with pytest.raises(MessageSizeExceededError, match="the batch is 262145 bytes"):
            await ns.send("q", [Message(b"a" * 128 * KB, message_id="b1"), Message(b"b" * (128 * KB + 1))])
        assert ns.stats("q").accepted == 1 and ns.stats("q").keys_held == 1
        with pytest.raises(ArgumentOutOfRangeError, match="'Premium' tier"):
            await ns.create_queue("bigger", max_message_size_in_kilobytes=257)
        with pytest.raises(ArgumentOutOfRangeError, match="'Premium' tier"):
            await ns.update_queue("q", max_message_size_in_kilobytes=1024)
        assert ns.get_queue("q").max_message_size_in_kilobytes == 256
        assert ns.entity_names() == ["q"]

    _with(stores, STANDARD, body)


def test_premium_takes_the_entitys_size_1_mb_by_default(stores: StoreFactory) -> None:
    async def body(ns: Namespace) -> None:
        queue = await ns.create_queue("q")
        topic = await ns.create_topic("t")
        assert queue.max_message_size_in_kilobytes == topic.max_message_size_in_kilobytes == 1024
        await ns.send("q", Message(b"x" * 1024 * KB))
        with pytest.raises(MessageSizeExceededError, match="over the limit of 1048576 bytes"):
            await ns.send("q", Message(b"x" * (1024 * KB + 1)))
        await ns.update_queue("q", max_message_size_in_kilobytes=6 * 1024)
        await ns.send("q", Message(b"x" * 5 * KB * KB))  # the 5 MiB message Standard refuses
        assert ns.stats("q").accepted == 2
        await ns.create_queue("huge", max_size_in_megabytes=81_920)

    _with(stores, PREMIUM, body)


def test_entity_size_setting_is_bounded_by_tier(stores: StoreFactory) -> None:
    async def body(ns: Namespace) -> None:
        await ns.create_queue("q5", max_size_in_megabytes=5120)
        with pytest.raises(ArgumentOutOfRangeError, match="at most 5120 MB"):
            await ns.create_queue("q6", max_size_in_megabytes=5121)
        with pytest.raises(ArgumentOutOfRangeError, match="at most 5120 MB"):
            await ns.update_queue("q5", max_size_in_megabytes=5121)
        await ns.create_topic("p80", max_size_in_megabytes=81_920, enable_partitioning=True)
        assert sorted(ns.entity_names()) == ["p80", "q5"]

    _with(stores, STANDARD, body)


def test_queues_and_topics_per_namespace(stores: StoreFactory) -> None:
    async def body(ns: Namespace) -> None:
        await ns.create_queue("q1")
        await ns.create_topic("t1")
        await ns.create_subscription("t1", "s1")  # subscriptions do not count
        await ns.create_queue("q2")  # the third: at the limit
        with pytest.raises(QuotaExceededError, match=r"queues and topics in a 'Standard' tier namespace \(3\)"):
            await ns.create_topic("t2")
        with pytest.raises(QuotaExceededError, match=r"\(3\)"):
            await ns.create_queue("q3")
        await ns.delete_queue("q2")  # room again
        await ns.create_queue("q3")
        assert sorted(ns.entity_names()) == ["q1", "q3", "t1"]

    _with(stores, TierQuotas.of(max_entities=3), body)


def test_partitioned_entities_per_standard_namespace(stores: StoreFactory) -> None:
    async def body(ns: Namespace) -> None:
        await ns.create_queue("p1", enable_partitioning=True)
        await ns.create_topic("p2", enable_partitioning=True)
        with pytest.raises(QuotaExceededError, match=r"partitioned queues and topics .* \(2\)"):
            await ns.create_queue("p3", enable_partitioning=True)
        await ns.create_queue("plain")
        assert sorted(ns.entity_names()) == ["p1", "p2", "plain"]

    _with(stores, TierQuotas.of(max_partitioned_entities=2), body)


def test_premium_entities_per_messaging_unit(stores: StoreFactory) -> None:
    async def body(ns: Namespace) -> None:
        for i in range(4):
            await ns.create_queue(f"q{i}", enable_partitioning=True)  # no separate partitioned count
        with pytest.raises(QuotaExceededError, match=r"'Premium' tier namespace \(4 \(1000 per messaging unit\)\)"):
            await ns.create_queue("q4")

    _with(stores, TierQuotas.of(Tier.PREMIUM, max_entities=4), body)


def test_subscriptions_per_topic(stores: StoreFactory) -> None:
    async def body(ns: Namespace) -> None:
        await ns.create_topic("t")
        await ns.create_topic("u")
        await ns.create_subscription("t", "a")
        await ns.create_subscription("t", "b")
        with pytest.raises(QuotaExceededError, match=r"subscriptions of topic 't' \(2\)"):
            await ns.create_subscription("t", "c")
        await ns.create_subscription("u", "c")  # per topic
        assert [s.name for s in ns.list_subscriptions("t")] == ["a", "b"]

    _with(stores, TierQuotas.of(max_subscriptions_per_topic=2), body)


def test_sql_and_correlation_filters_per_topic(stores: StoreFactory) -> None:
    async def body(ns: Namespace) -> None:
        await ns.create_topic("t")
        await ns.create_subscription("t", "a")  # $Default (a true filter, SQL): 1 SQL filter
        await ns.create_rule("t", "a", RuleProperties("r2", SqlRuleFilter("x = 1")))
        await ns.create_subscription("t", "b", rules=[RuleProperties("r3", SqlRuleFilter("x = 2"))])  # 3: the limit
        with pytest.raises(QuotaExceededError, match=r"4 SQL filters.*at most 3"):
            await ns.create_rule("t", "b", RuleProperties("r4", SqlRuleFilter("x = 3")))
        with pytest.raises(QuotaExceededError, match="4 SQL filters"):
            await ns.create_subscription("t", "c")  # its $Default would be the fourth
        for i in range(2):
            await ns.create_rule("t", "b", RuleProperties(f"c{i}", CorrelationRuleFilter(subject=f"s{i}")))
        with pytest.raises(QuotaExceededError, match=r"3 correlation filters.*at most 2"):
            await ns.create_rule("t", "a", RuleProperties("c2", CorrelationRuleFilter(subject="s2")))
        await ns.delete_rule("t", "a", "r2")  # room for one SQL filter again
        await ns.create_rule("t", "b", RuleProperties("r4", SqlRuleFilter("x = 3")))
        assert [r.name for r in ns.list_rules("t", "b")] == ["r3", "c0", "c1", "r4"]
        assert [s.name for s in ns.list_subscriptions("t")] == ["a", "b"]

    _with(stores, TierQuotas.of(max_sql_filters_per_topic=3, max_correlation_filters_per_topic=2), body)


def test_concurrent_receivers_per_queue_or_topic(stores: StoreFactory) -> None:
    async def body(ns: Namespace) -> None:
        await ns.create_queue("q")
        await ns.create_topic("t")
        for sub in ("a", "b"):
            await ns.create_subscription("t", sub)
        on_queue = [ns.open_receiver("q"), ns.open_receiver("q/$DeadLetterQueue")]  # the limit: 2
        with pytest.raises(ServerBusyError, match=r"receive requests on queue 'q' has reached its limit \(2\)"):
            ns.open_receiver("q")
        on_topic = [ns.open_receiver("t/Subscriptions/a"), ns.open_receiver("T/subscriptions/B")]
        with pytest.raises(ServerBusyError, match=r"topic 't' has reached its limit \(2, across its subscriptions\)"):
            ns.open_receiver("t/Subscriptions/b")
        on_queue[0]()
        on_queue[0]()  # ending one twice frees one place only
        on_queue.append(ns.open_receiver("q"))
        with pytest.raises(ServerBusyError):
            ns.open_receiver("q")
        for release in on_topic:
            release()
        ns.open_receiver("t/Subscriptions/a")

    _with(stores, TierQuotas.of(max_concurrent_receives=2), body)


def test_a_namespace_past_a_count_may_shrink_but_not_grow(stores: StoreFactory) -> None:
    """Entities and rules stored under larger counts (another tier, a release before the tiers) load as they
    are; removing some is allowed, adding is refused until the namespace is back under the count."""

    async def fill(ns: Namespace) -> None:
        await ns.create_topic("t")
        for sub in ("a", "b", "c"):
            await ns.create_subscription("t", sub)  # three $Default rules: three SQL filters

    async def shrink(ns: Namespace) -> None:
        assert [s.name for s in ns.list_subscriptions("t")] == ["a", "b", "c"]
        with pytest.raises(QuotaExceededError, match="4 SQL filters"):
            await ns.create_rule("t", "a", RuleProperties("more", SqlRuleFilter("x = 1")))
        await ns.delete_rule("t", "a", "$Default")  # 2 left: at the count
        await ns.delete_subscription("t", "b")  # 1 left
        await ns.create_rule("t", "c", RuleProperties("more", SqlRuleFilter("x = 1")))  # 2 again

    _with(stores, STANDARD, fill)
    _with(stores, TierQuotas.of(max_sql_filters_per_topic=2), shrink)
