"""What a subscription rule costs per message, measured side by side in one run.

1. One filter against one message view: a compiled SQL filter (and a
   correlation filter) against the true filter of ``$Default``.
2. Fan-out of one message to 10 subscriptions, view building included: each
   subscription with one SQL filter against each with ``$Default``.

Prints nanoseconds per evaluation and the ratios. Parsing happens once, when a
rule is built; the "compile" line shows that cost for comparison.

    python bench/rules_eval.py            # about 15 s
    python bench/rules_eval.py --quick
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from oncebus.core.messages import Message
from oncebus.core.rules import (
    CorrelationRuleFilter,
    MessageView,
    RuleProperties,
    RuleSet,
    SqlRuleFilter,
    TrueRuleFilter,
    default_rule,
)

SQL = "color = 'red' AND quantity > 5 AND sys.Label LIKE 'order%'"


def messages(count: int) -> list[Message]:
    colors = ["red", "blue", "green", "yellow"]
    return [
        Message(
            body=b"x" * 64,
            message_id=f"m{i}",
            subject=f"order-{i % 7}" if i % 3 else "invoice",
            correlation_id="high" if i % 5 == 0 else "low",
            application_properties={"color": colors[i % 4], "quantity": i % 12, "region": "eu"},
        )
        for i in range(count)
    ]


def per_call_ns(fn: Callable[[], object], calls: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - start) / calls)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n = 20_000 if args.quick else 100_000
    repeats = 3 if args.quick else 7

    batch = messages(n)
    views = [MessageView.of(m) for m in batch]
    filters = {
        "true filter ($Default)": TrueRuleFilter(),
        "correlation filter (correlation_id, label, color)": CorrelationRuleFilter(
            correlation_id="high", label="order-1", properties={"color": "red"}
        ),
        f"SQL filter ({SQL})": SqlRuleFilter(SQL),
    }
    matched = {name: sum(f.matches(v) for v in views) for name, f in filters.items()}
    results = {}
    for name, rule_filter in filters.items():
        matches = rule_filter.matches

        def run(matches: Callable[[MessageView], bool] = matches) -> None:
            for v in views:
                matches(v)

        results[name] = per_call_ns(run, n, repeats)

    print(f"{n} messages, median of {repeats} runs (Python {'.'.join(map(str, __import__('sys').version_info[:3]))})")
    print("\n1. one filter, per message view")
    base = results["true filter ($Default)"]
    for name, ns in results.items():
        print(f"   {name:<75} {ns:8.0f} ns  x{ns / base:5.1f}  ({matched[name]} matched)")

    compile_ns = per_call_ns(lambda: [SqlRuleFilter(SQL) for _ in range(200)], 200, 3)
    print(f"   compile the SQL filter once (parse + check + closures): {compile_ns / 1000:.0f} us")

    print("\n2. fan-out of one message to 10 subscriptions (one view per message, then each subscription's rules)")
    defaults = [RuleSet([default_rule()]) for _ in range(10)]
    colors = ["red", "blue", "green", "yellow"]
    sql_sets = [
        RuleSet([RuleProperties(f"r{i}", SqlRuleFilter(f"color = '{colors[i % 4]}' AND quantity > {i % 6}"))])
        for i in range(10)
    ]

    def fan_out(rule_sets: list[RuleSet]) -> Callable[[], None]:
        def run() -> None:
            for m in batch:
                view = MessageView.of(m)
                for r in rule_sets:
                    r.evaluate(view)

        return run

    def views_only() -> None:
        for m in batch:
            MessageView.of(m)

    view_ns = per_call_ns(views_only, n, repeats)
    default_ns = per_call_ns(fan_out(defaults), n, repeats)
    sql_ns = per_call_ns(fan_out(sql_sets), n, repeats)
    print(f"   {'building the view alone':<75} {view_ns:8.0f} ns")
    print(f"   {'10 x $Default':<75} {default_ns:8.0f} ns  x 1.00")
    print(
        f"   {'10 x one SQL filter (color = ... AND quantity > ...)':<75} {sql_ns:8.0f} ns  x{sql_ns / default_ns:5.2f}"
    )
    print(
        f"\n   SQL filter / true filter, one evaluation: {results[f'SQL filter ({SQL})'] / base:.0f}x "
        f"({results[f'SQL filter ({SQL})']:.0f} ns against {base:.0f} ns)"
    )
    print(
        f"   fan-out to 10 subscriptions, SQL filters / $Default: {sql_ns / default_ns:.2f}x; "
        f"{sql_ns / 1000:.1f} us of rule work per message (a topic whose subscriptions all have only $Default "
        "can skip it: RuleSet.delivers_everything_unchanged)"
    )


if __name__ == "__main__":
    main()
