"""One run: ``oncebus serve`` on SQLite, on PostgreSQL (one node each) and two ``--cluster`` nodes on PostgreSQL
(a leader and a standby that forwards to it, the clients split between them), the azure-servicebus SDK sending
and receiving, side by side.

Prints (never asserts) msg/s per row, the oncebus process's CPU microseconds per message (all threads) and, on
PostgreSQL, the database server's too (every process of the cluster: its backends, WAL writer, checkpointer),
then the ratios PostgreSQL / SQLite:

- send, duplicate detection off and on (batches of 100 messages with 1 KiB bodies and unique ids, ``--senders``
  processes, one connection each): each acknowledged once committed durably (SQLite ``synchronous=FULL``;
  PostgreSQL ``synchronous_commit=on``, fsync on);
- receive + complete (``--receivers`` processes, PEEK_LOCK, prefetch 200).

The two-node rows add the standby's CPU per message (what forwarding costs), and the last lines the cost of a
cross-node dedup check: the median time of one resend (a duplicate, judged and dropped) sent through the standby
against through the leader itself, ``--resends`` each, one after the other.

PostgreSQL: a throwaway cluster (``initdb`` + ``pg_ctl``, as the tests start one: tests/postgres_cluster.py) on
the same machine, default settings but ``shared_buffers=32MB``; or ``--postgres URL`` for a server of your own
(its CPU is then not measured). Rounds (``--repeat``) interleave the rows; the best round of each is shown.

Usage: ``python bench/store_send.py [--messages 20000] [--senders 2] [--receivers 4] [--repeat 3] [--resends 300]
[--postgres URL --postgres-cluster URL]``
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT)]

from amqp_send import (  # noqa: E402  (bench/ is not a package)
    BATCH,
    Measured,
    _shares,
    _stat_cpu,
    describe,
    load,
    process_cpu,
    run_workers,
    sdk_fill,
    sdk_receiver,
    sdk_sender,
    start_oncebus,
)


def cluster_cpu(postmaster: int) -> float | None:
    """CPU seconds of a PostgreSQL cluster: its postmaster and every child process (backends, writers)."""
    total = _stat_cpu(Path(f"/proc/{postmaster}/stat"))
    if total is None:
        return None
    try:
        children = Path(f"/proc/{postmaster}/task/{postmaster}/children").read_text().split()
    except OSError:
        return None
    for child in children:
        total += _stat_cpu(Path(f"/proc/{child}/stat")) or 0.0
    return total


def measured_with_database(
    row: Callable[[], Measured], postmaster: int | None, messages: int, standby: int | None = None
) -> tuple[Measured, float | None, float | None]:
    """The row, the database's CPU per message and (two nodes) the standby's."""
    before = None if postmaster is None else cluster_cpu(postmaster)
    standby_before = None if standby is None else process_cpu(standby)
    measured = row()
    after = None if postmaster is None else cluster_cpu(postmaster)
    standby_after = None if standby is None else process_cpu(standby)
    database = None if before is None or after is None else (after - before) / messages * 1e6
    forwarding = (
        None if standby_before is None or standby_after is None else (standby_after - standby_before) / messages * 1e6
    )
    return measured, database, forwarding


def resend_seconds(connection_string: str, message_id: str, count: int) -> float:
    """The median time of one send of ``message_id`` (sent once before: each is a duplicate) to 'dedup-on'."""
    import statistics
    import time

    from azure.servicebus import ServiceBusClient, ServiceBusMessage

    times = []
    with ServiceBusClient.from_connection_string(connection_string) as client:
        with client.get_queue_sender("dedup-on") as sender:
            sender.send_messages(ServiceBusMessage(b"x", message_id=message_id))
            for _ in range(count):
                started = time.perf_counter()
                sender.send_messages(ServiceBusMessage(b"x", message_id=message_id))
                times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000, help="messages per measurement (default 20000)")
    parser.add_argument("--senders", type=int, default=2, help="concurrent sender processes (default 2)")
    parser.add_argument("--receivers", type=int, default=4, help="concurrent receiver processes (default 4)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of each measurement; the best is shown")
    parser.add_argument("--resends", type=int, default=300, help="resends timed through each node (default 300)")
    parser.add_argument("--postgres", help="a PostgreSQL URL to use instead of a throwaway local cluster")
    parser.add_argument("--postgres-cluster", help="with --postgres: another database (or schema) for the two nodes")
    args = parser.parse_args()
    if args.postgres and not args.postgres_cluster:
        parser.error("--postgres needs --postgres-cluster too (the two nodes need a schema of their own)")
    count, senders, receivers, repeat = args.messages, args.senders, args.receivers, args.repeat
    print(f"before: {load()}; python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    workdir = Path(tempfile.mkdtemp(prefix="oncebus-bench-"))
    cluster: Any = None
    servers: list[subprocess.Popen[Any]] = []
    rows: dict[str, list[tuple[Measured, float | None, float | None]]] = collections.defaultdict(list)
    resends: dict[str, float] = {}
    try:
        postmaster = None
        url = args.postgres
        if url is None:
            from tests.postgres_cluster import PostgresCluster

            cluster = PostgresCluster()
            cluster.start()
            url = cluster.fresh_url()
            postmaster = int((cluster.data / "postmaster.pid").read_text().split()[0])
        (workdir / "sqlite").mkdir()
        (workdir / "postgres").mkdir()
        sqlite, sqlite_string = start_oncebus(workdir / "sqlite")
        servers.append(sqlite)
        os.environ["ONCEBUS_STORE"] = url  # start_oncebus's serve inherits the environment
        try:
            postgres, postgres_string = start_oncebus(workdir / "postgres")
        finally:
            del os.environ["ONCEBUS_STORE"]
        servers.append(postgres)
        # two nodes on one database (another schema: the one-node server holds the first one's node lock)
        os.environ["ONCEBUS_STORE"] = args.postgres_cluster if cluster is None else cluster.fresh_url()
        try:
            (workdir / "leader").mkdir()
            (workdir / "standby").mkdir()
            leader, leader_string = start_oncebus(workdir / "leader", serve_args=("--cluster",))
            servers.append(leader)
            standby, standby_string = start_oncebus(workdir / "standby", serve_args=("--cluster",))
            servers.append(standby)
        finally:
            del os.environ["ONCEBUS_STORE"]
        nodes = {
            "sqlite": (sqlite, [sqlite_string], None, None),
            "postgres": (postgres, [postgres_string], postmaster, None),
            "2 nodes": (leader, [leader_string, standby_string], postmaster, standby.pid),
        }
        per_receiver = (count + receivers - 1) // receivers
        for r in range(repeat):
            for store, (process, strings, database, forwarder) in nodes.items():
                for queue in ("dedup-off", "dedup-on"):
                    jobs = [
                        (strings[i % len(strings)], queue, f"r{r}", "realistic", share)
                        for i, share in enumerate(_shares(count, senders))
                    ]
                    send = functools.partial(run_workers, sdk_sender, jobs, process.pid)
                    rows[f"{store} {queue}"].append(measured_with_database(send, database, count, forwarder))
                sdk_fill(strings[0], "receive", f"r{r}", count)
                jobs = [(strings[i % len(strings)], "receive", per_receiver) for i in range(receivers)]
                receive = functools.partial(run_workers, sdk_receiver, jobs, process.pid)
                rows[f"{store} receive"].append(measured_with_database(receive, database, count, forwarder))
        resends["through the leader"] = resend_seconds(leader_string, "resent-leader", args.resends)
        resends["through the standby"] = resend_seconds(standby_string, "resent-standby", args.resends)
    finally:
        for server in servers:
            server.send_signal(signal.SIGINT)
        for server in servers:
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
        if cluster is not None:
            cluster.remove()
        shutil.rmtree(workdir, ignore_errors=True)
    got = {name: max(measured, key=lambda m: m[0].rate) for name, measured in rows.items()}
    print(
        f"one node each; {count:,} x 1 KiB realistic messages per row (subject, content type, correlation id, "
        f"4 properties), batches of {BATCH}, {senders} senders, {receivers} receivers;"
    )
    print(f"best of {repeat} rounds; after: {load()}")
    print("  (2 nodes: the leader's CPU as server, the standby's as forwarding; clients split between the two)")
    for name, (measured, database, forwarding) in got.items():
        extra = "" if database is None else f"  + PostgreSQL {database:.1f} us/msg"
        extra += "" if forwarding is None else f"  + forwarding {forwarding:.1f} us/msg"
        print(f"  {name:<20} {describe(measured)}{extra}")
    for what in ("dedup-off", "dedup-on", "receive"):
        ratio = got[f"postgres {what}"][0].rate / got[f"sqlite {what}"][0].rate
        print(f"  ratio PostgreSQL / SQLite, {what + ':':<10} {ratio:6.2f}")
    for what in ("dedup-off", "dedup-on", "receive"):
        ratio = got[f"2 nodes {what}"][0].rate / got[f"postgres {what}"][0].rate
        print(f"  ratio 2 nodes / 1 node on PostgreSQL, {what + ':':<10} {ratio:6.2f}")
    leader_ms, standby_ms = resends["through the leader"] * 1e3, resends["through the standby"] * 1e3
    print(f"  a resend judged a duplicate (median of {args.resends}): {leader_ms:.2f} ms through the leader,")
    cost = standby_ms - leader_ms
    print(f"    {standby_ms:.2f} ms through the standby: a cross-node dedup check costs {cost:+.2f} ms")


if __name__ == "__main__":
    main()
