"""One run: ``oncebus serve`` on SQLite and on PostgreSQL (one node each), the azure-servicebus SDK sending and
receiving, side by side.

Prints (never asserts) msg/s per row, the oncebus process's CPU microseconds per message (all threads) and, on
PostgreSQL, the database server's too (every process of the cluster: its backends, WAL writer, checkpointer),
then the ratios PostgreSQL / SQLite:

- send, duplicate detection off and on (batches of 100 messages with 1 KiB bodies and unique ids, ``--senders``
  processes, one connection each): each acknowledged once committed durably (SQLite ``synchronous=FULL``;
  PostgreSQL ``synchronous_commit=on``, fsync on);
- receive + complete (``--receivers`` processes, PEEK_LOCK, prefetch 200).

PostgreSQL: a throwaway cluster (``initdb`` + ``pg_ctl``, as the tests start one: tests/postgres_cluster.py) on
the same machine, default settings but ``shared_buffers=32MB``; or ``--postgres URL`` for a server of your own
(its CPU is then not measured). Rounds (``--repeat``) interleave the rows; the best round of each is shown.

Usage: ``python bench/store_send.py [--messages 20000] [--senders 2] [--receivers 4] [--repeat 3] [--postgres URL]``
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
    row: Callable[[], Measured], postmaster: int | None, messages: int
) -> tuple[Measured, float | None]:
    before = None if postmaster is None else cluster_cpu(postmaster)
    measured = row()
    after = None if postmaster is None else cluster_cpu(postmaster)
    database = None if before is None or after is None else (after - before) / messages * 1e6
    return measured, database


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000, help="messages per measurement (default 20000)")
    parser.add_argument("--senders", type=int, default=2, help="concurrent sender processes (default 2)")
    parser.add_argument("--receivers", type=int, default=4, help="concurrent receiver processes (default 4)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of each measurement; the best is shown")
    parser.add_argument("--postgres", help="a PostgreSQL URL to use instead of a throwaway local cluster")
    args = parser.parse_args()
    count, senders, receivers, repeat = args.messages, args.senders, args.receivers, args.repeat
    print(f"before: {load()}; python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    workdir = Path(tempfile.mkdtemp(prefix="oncebus-bench-"))
    cluster: Any = None
    servers: list[subprocess.Popen[Any]] = []
    rows: dict[str, list[tuple[Measured, float | None]]] = collections.defaultdict(list)
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
        nodes = {"sqlite": (sqlite, sqlite_string, None), "postgres": (postgres, postgres_string, postmaster)}
        per_receiver = (count + receivers - 1) // receivers
        for r in range(repeat):
            for store, (process, connection_string, database) in nodes.items():
                for queue in ("dedup-off", "dedup-on"):
                    jobs = [(connection_string, queue, f"r{r}", share) for share in _shares(count, senders)]
                    send = functools.partial(run_workers, sdk_sender, jobs, process.pid)
                    rows[f"{store} {queue}"].append(measured_with_database(send, database, count))
                sdk_fill(connection_string, "receive", f"r{r}", count)
                jobs = [(connection_string, "receive", per_receiver)] * receivers
                receive = functools.partial(run_workers, sdk_receiver, jobs, process.pid)
                rows[f"{store} receive"].append(measured_with_database(receive, database, count))
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
    print(f"one node each; {count:,} x 1 KiB per row, batches of {BATCH}, {senders} senders, {receivers} receivers;")
    print(f"best of {repeat} rounds; after: {load()}")
    for name, (measured, database) in got.items():
        extra = "" if database is None else f"  + PostgreSQL {database:.1f} us/msg"
        print(f"  {name:<20} {describe(measured)}{extra}")
    for what in ("dedup-off", "dedup-on", "receive"):
        ratio = got[f"postgres {what}"][0].rate / got[f"sqlite {what}"][0].rate
        print(f"  ratio PostgreSQL / SQLite, {what + ':':<10} {ratio:6.2f}")


if __name__ == "__main__":
    main()
