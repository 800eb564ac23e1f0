"""One run: 100 sends in one AMQP transaction (python-qpid-proton's client, each send waiting for its answer) and its
commit (one durable store unit, fsynced), against 100 plain sends each acknowledged once durable; ``oncebus serve``
on SQLite. Prints (never asserts) milliseconds per round.

    python bench/amqp_transactions.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import proton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.amqp.conftest import ServerProcess, topology
from tests.amqp.txn_client import TxnClient


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = topology({"q": {"RequiresDuplicateDetection": True}}, {})
        server = ServerProcess(Path(tmp) / "data", config).start()
        client = TxnClient(server.port)
        try:
            for rnd in range(args.rounds):
                start = time.perf_counter()
                txn = client.declare()
                for n in range(100):
                    client.send("q", proton.Message(body="x" * 1000, id=f"t{rnd}-{n}"), txn)
                sent = time.perf_counter()
                client.discharge(txn)
                committed = time.perf_counter()
                for n in range(100):
                    client.send("q", proton.Message(body="x" * 1000, id=f"p{rnd}-{n}"))
                plain = time.perf_counter()
                print(
                    f"round {rnd}: 100 sends in a transaction {1000 * (sent - start):.1f} ms + commit "
                    f"{1000 * (committed - sent):.1f} ms; 100 plain sends {1000 * (plain - committed):.1f} ms"
                )
        finally:
            client.close()
            server.stop()


if __name__ == "__main__":
    main()
