"""What a broker per test costs with oncebus.testing. One run, printing medians and ratios measured side by side.

1. A process-isolated broker (``serve()``, subprocess mode): from the call to a broker
   that answers (``oncebus serve --port 0`` started, its connection string read), and
   the time to stop it and remove its directory. Goal: ready in under 1 s.
2. The same in thread mode (an event loop in a thread of this process).
3. A fresh namespace on the running broker, as the ``oncebus_namespace`` fixture makes
   it: reset (every entity, message and dedup key of the previous test deleted, the
   test clock back) and the test's entities created (3 queues, a topic with 2
   subscriptions); before each, the previous "test" left 100 messages and their keys.
   Goal: at most 50 ms.

    python bench/testing_startup.py               # 10 brokers per mode, 100 namespaces
    python bench/testing_startup.py --quick       # 3 brokers, 20 namespaces
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

from oncebus.testing import serve
from oncebus.testing._entities import declared_topology, merged

QUEUES = {
    "orders": {"requires_duplicate_detection": True, "duplicate_detection_history_time_window": "PT10M"},
    "payments": {"requires_duplicate_detection": True, "enable_partitioning": True},
    "work": {"lock_duration": "PT30S"},
}
TOPICS = {"events": {"requires_duplicate_detection": True, "subscriptions": ["audit", "billing"]}}
LEFT_BEHIND = 100


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def brokers(mode: str, runs: int) -> tuple[list[float], list[float]]:
    ready, stop = [], []
    for _ in range(runs):
        context = serve(mode=mode)  # type: ignore[arg-type]
        ready.append(timed(context.start))
        stop.append(timed(context.stop))
    return ready, stop


def namespaces(runs: int) -> tuple[list[float], list[float]]:
    topology = merged(declared_topology(QUEUES, TOPICS))
    fresh, bare = [], []
    with serve() as server:
        for i in range(runs):
            server.reset()
            server.create_topology(topology)
            messages = [{"body": "x", "message_id": f"m-{i}-{j}"} for j in range(LEFT_BEHIND)]
            server.control("send", entity="orders", messages=messages)  # what the previous test left

            def fixture() -> None:
                server.reset()
                server.create_topology(topology)

            fresh.append(timed(fixture))
            bare.append(timed(server.reset))  # nothing to delete but the entities just created
    return fresh, bare


def ms(values: list[float]) -> str:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    return f"median {statistics.median(values) * 1e3:7.1f} ms, p95 {p95 * 1e3:7.1f} ms, max {ordered[-1] * 1e3:7.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    runs, fresh_runs = (3, 20) if args.quick else (10, 100)
    print(f"before: {load()}; python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    sub_ready, sub_stop = brokers("subprocess", runs)
    print(f"fresh broker, subprocess: ready   {ms(sub_ready)}  ({runs} runs; goal < 1000 ms)")
    print(f"                          stopped {ms(sub_stop)}")
    try:
        thread_ready, thread_stop = brokers("thread", runs)
    except (ImportError, NotImplementedError) as exc:
        thread_ready = []
        print(f"fresh broker, thread: not measured ({exc})")
    else:
        print(f"fresh broker, thread:     ready   {ms(thread_ready)}")
        print(f"                          stopped {ms(thread_stop)}")
    fresh, bare = namespaces(fresh_runs)
    print(
        f"fresh namespace (reset + {len(QUEUES)} queues, 1 topic, 2 subscriptions): "
        f"{ms(fresh)}  ({fresh_runs} runs; goal <= 50 ms)"
    )
    print(f"  reset alone:                                      {ms(bare)}")
    namespace = statistics.median(fresh)
    process = statistics.median(sub_ready) + statistics.median(sub_stop)
    print(f"  ratio fresh subprocess broker (start + stop) / fresh namespace: {process / namespace:6.1f}")
    if thread_ready:
        thread = statistics.median(thread_ready) + statistics.median(thread_stop)
        print(f"  ratio fresh thread broker (start + stop) / fresh namespace:     {thread / namespace:6.1f}")
    print(f"after: {load()}")


if __name__ == "__main__":
    main()
