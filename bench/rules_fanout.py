"""What subscription rules cost at fan-out: send throughput to a topic with 10 subscriptions, measured in one run.

Through the broker API (``Namespace.send``, in process, on the SQLite store as
``oncebus serve`` uses it, ``synchronous=FULL``), not through the SDK: over
AMQP the client's own work and the network round trips dominate and bury the
difference (measure that with ``bench/amqp_send.py``). Three topics, each with
10 subscriptions:

- ``true``: every subscription has only ``$Default`` (a true filter: the
  broker skips evaluation, ``RuleSet.delivers_everything_unchanged``);
- ``sql``: every subscription has one SQL filter that every message matches
  (``quantity >= 0 AND sys.Label LIKE 'order%'``): the same 10 copies per
  message as ``true``, plus evaluating 10 filters;
- ``sql-selective``: subscription i has ``region = 'r<i>'``: each message
  matches one subscription (1 copy instead of 10), for comparison.

Sends are batches of ``--batch`` messages (one atomic send each); the rounds
alternate between the topics so that drift hits them alike; the median round
of each is printed with the ratios sql / true and selective / true.

    python bench/rules_fanout.py                 # about a minute
    python bench/rules_fanout.py --messages 2000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from oncebus.broker import Message, Namespace
from oncebus.core.messages import ServiceBusReceiveMode
from oncebus.core.rules import RuleProperties, SqlRuleFilter
from oncebus.store.sqlite import SqliteStore

SUBSCRIPTIONS = 10
MATCH_ALL = "quantity >= 0 AND sys.Label LIKE 'order%'"


def messages(count: int, offset: int) -> list[Message]:
    return [
        Message(
            body=b"x" * 256,
            message_id=f"m{offset + i}",
            subject=f"order-{i % 7}",
            application_properties={"quantity": i % 12, "region": f"r{i % SUBSCRIPTIONS}", "color": "red"},
        )
        for i in range(count)
    ]


async def setup(ns: Namespace) -> None:
    for topic in ("true", "sql", "sql-selective"):
        await ns.create_topic(topic, requires_duplicate_detection=True)
        for i in range(SUBSCRIPTIONS):
            await ns.create_subscription(topic, f"s{i}")
    for i in range(SUBSCRIPTIONS):
        await ns.set_rules("sql", f"s{i}", [RuleProperties("match-all", SqlRuleFilter(MATCH_ALL))])
        await ns.set_rules("sql-selective", f"s{i}", [RuleProperties("region", SqlRuleFilter(f"region = 'r{i}'"))])


async def send_round(ns: Namespace, topic: str, count: int, batch: int, offset: int) -> float:
    batches = [messages(min(batch, count - start), offset + start) for start in range(0, count, batch)]
    started = time.perf_counter()
    for chunk in batches:
        await ns.send(topic, chunk)
    return count / (time.perf_counter() - started)


async def drain(ns: Namespace, topic: str) -> None:
    """Empty the subscriptions between rounds so every round starts from the same state."""
    for i in range(SUBSCRIPTIONS):
        path = f"{topic}/Subscriptions/s{i}"
        while await ns.receive(path, 5000, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE):
            pass


async def main_async(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "oncebus.db")
        ns = await Namespace.open(store)
        await setup(ns)
        rates: dict[str, list[float]] = {"true": [], "sql": [], "sql-selective": []}
        offset = 0
        for topic in rates:  # warm up, and check that each topic makes the copies it should
            await send_round(ns, topic, args.batch, args.batch, offset)
            offset += args.batch
            copies = sum(ns.stats(topic).subscriptions[f"s{i}"].active_message_count for i in range(SUBSCRIPTIONS))
            assert copies == args.batch * (1 if topic == "sql-selective" else SUBSCRIPTIONS), (topic, copies)
            await drain(ns, topic)
        order = list(rates)
        for round_number in range(args.rounds):
            for topic in order[round_number % 3 :] + order[: round_number % 3]:  # each topic first in turn
                rates[topic].append(await send_round(ns, topic, args.messages, args.batch, offset))
                offset += args.messages
                await drain(ns, topic)
        await ns.close()
        store.close()
    median = {topic: statistics.median(values) for topic, values in rates.items()}
    print(
        f"fan-out to {SUBSCRIPTIONS} subscriptions, {args.messages} messages x {args.rounds} rounds, batches of "
        f"{args.batch}, SQLite store (synchronous=FULL), broker API in process"
    )
    for topic, rate in median.items():
        spread = f"{min(rates[topic]):,.0f}..{max(rates[topic]):,.0f}"
        print(f"  {topic:<14} {rate:>10,.0f} msg/s   (rounds {spread})")
    print(f"ratio sql / true:            {median['sql'] / median['true']:.2f}  (same 10 copies per message)")
    print(f"ratio sql-selective / true:  {median['sql-selective'] / median['true']:.2f}  (1 copy instead of 10)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=5000, help="messages per round and topic")
    parser.add_argument("--batch", type=int, default=100, help="messages per send")
    parser.add_argument("--rounds", type=int, default=5)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
