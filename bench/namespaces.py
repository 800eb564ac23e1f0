"""What a namespace of its own costs on a shared broker (oncebus.server.namespaces). One run, medians printed
against the budget: creating a namespace at most 10 ms.

1. In process: ``Namespaces.create()`` on the serve process's registry (a MemoryStore, its own clock, keys).
2. Over HTTP: ``PUT /$namespaces/<name>`` with a Manage key (a SharedAccessSignature) on a running
   ``oncebus serve`` (subprocess), one kept-alive connection; and ``DELETE``.
3. From Python: ``OncebusServer.create_namespace()`` (the control socket, as the pytest plugin's
   ``oncebus_isolated_namespace`` does).
4. The README's lost-ack example (a sender whose 3rd send's ack is lost, the SDK's retry, a receiver that
   completes; every order exactly once) run in a fresh namespace: create, declare the queue, run, delete;
   and, for comparison, on the default namespace reset between runs (the ``oncebus_namespace`` fixture's way).

    python bench/namespaces.py            # 200 creations per door, the example 5 times
    python bench/namespaces.py --quick    # 50 and 2
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import requests

from oncebus.auth import DEFAULT_KEY, DEFAULT_KEY_NAME, KeyRing, make_token
from oncebus.broker import Namespace
from oncebus.server.namespaces import Namespaces
from oncebus.store.memory import MemoryStore
from oncebus.testing import IsolatedNamespace, OncebusServer, serve

BUDGET_MS = 10.0


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def line(what: str, times_s: list[float], budget_ms: float | None = BUDGET_MS) -> None:
    median = statistics.median(times_s) * 1000
    p90 = sorted(times_s)[int(len(times_s) * 0.9) - 1] * 1000
    verdict = (
        "" if budget_ms is None else f"  ({'within' if median <= budget_ms else 'OVER'} the {budget_ms:g} ms budget)"
    )
    print(f"{what:<58} median {median:8.2f} ms  p90 {p90:8.2f} ms  n={len(times_s)}{verdict}")


async def in_process(count: int) -> list[float]:
    registry = Namespaces(await Namespace.open(MemoryStore()), KeyRing.of({DEFAULT_KEY_NAME: DEFAULT_KEY}))
    times = []
    for i in range(count):
        started = time.perf_counter()
        await registry.create(f"p{i}")
        times.append(time.perf_counter() - started)
    await registry.close()
    return times


def over_http(server: OncebusServer, count: int) -> tuple[list[float], list[float]]:
    base = f"http://127.0.0.1:{server.http_port}"
    token = make_token(f"{base}/", DEFAULT_KEY_NAME, DEFAULT_KEY, int(time.time()) + 3600)
    made, deleted = [], []
    with requests.Session() as http:
        http.headers["Authorization"] = token
        http.get(f"{base}/$namespaces").raise_for_status()  # the connection is open before the clock starts
        for i in range(count):
            started = time.perf_counter()
            http.put(f"{base}/$namespaces/h{i}").raise_for_status()
            made.append(time.perf_counter() - started)
        for i in range(count):
            started = time.perf_counter()
            http.delete(f"{base}/$namespaces/h{i}").raise_for_status()
            deleted.append(time.perf_counter() - started)
    return made, deleted


def from_python(server: OncebusServer, count: int) -> list[float]:
    times, made = [], []
    for _ in range(count):
        started = time.perf_counter()
        made.append(server.create_namespace())
        times.append(time.perf_counter() - started)
    for ns in made:
        ns.delete()
    return times


def _load_example() -> Callable[[IsolatedNamespace | OncebusServer], None]:
    """The README's recipe as written (examples/test_lost_ack.py: its test takes the namespace it runs on)."""
    path = Path(__file__).resolve().parent.parent / "examples" / "test_lost_ack.py"
    spec = importlib.util.spec_from_file_location("lost_ack_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    test: Callable[[IsolatedNamespace | OncebusServer], None] = (
        module.test_every_order_arrives_once_though_an_ack_is_lost
    )
    return test


def readme_example(ns: IsolatedNamespace | OncebusServer) -> None:
    """The README's recipe (examples/test_lost_ack.py, run as written), on ``ns``."""
    _load_example()(ns)
    assert ns.stats("orders")["duplicates_dropped"] == 1


def example_runs(server: OncebusServer, count: int) -> list[float]:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        ns = server.create_namespace()
        ns.create_queue("orders", requires_duplicate_detection=True)
        readme_example(ns)
        ns.delete()
        times.append(time.perf_counter() - started)
    return times


def default_runs(server: OncebusServer, count: int) -> list[float]:
    """The same on the broker's default namespace, reset before each run (the ``oncebus_namespace`` fixture)."""
    times = []
    for _ in range(count):
        started = time.perf_counter()
        server.reset()
        server.create_queue("orders", requires_duplicate_detection=True)
        readme_example(server)
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="50 creations per door, the example twice")
    args = parser.parse_args()
    count, runs = (50, 2) if args.quick else (200, 5)
    print(f"oncebus namespaces bench ({load()})")
    line("create, in process (Namespaces.create)", asyncio.run(in_process(count)))
    with serve() as server:
        made, deleted = over_http(server, count)
        line("create over HTTP (PUT /$namespaces/<name>)", made)
        line("delete over HTTP (DELETE /$namespaces/<name>)", deleted, None)
        line("create from Python (OncebusServer.create_namespace)", from_python(server, count))
        line("README lost-ack example in a fresh namespace (end to end)", example_runs(server, runs), None)
        line("the same in the default namespace, reset (for comparison)", default_runs(server, runs), None)
    print(f"done ({load()})")


if __name__ == "__main__":
    main()
