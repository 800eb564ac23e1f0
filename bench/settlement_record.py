"""Encode and append one settlement-log record (a completion: its counters and its delete), the binary format
(``settlement_log.encode``) against the JSON one the release before wrote (``encode_json``), in one run:
``python bench/settlement_record.py``. Prints microseconds a record and the ratio."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from oncebus.store.base import AddCounters, DeleteMessage, Op
from oncebus.store.settlement_log import SettlementLog, encode, encode_json

STORE_ID = "0123456789abcdef0123456789abcdef"
ROUND = 2_000


def unit(seq: int) -> list[Op]:
    return [AddCounters("orders", 0, {"completed": 1}), DeleteMessage("orders", seq)]


def main() -> None:
    """The two formats alternated, 40 rounds of 2,000 records each (``--rounds``, ``--records``), the least time of
    each kept (others share the machine: alternating gives both the same load)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40, help="rounds of each format (default 40)")
    parser.add_argument("--records", type=int, default=ROUND, help=f"records a round (default {ROUND})")
    args = parser.parse_args()
    per_round = args.records
    with tempfile.TemporaryDirectory() as tmp:
        formats = {"json": encode_json, "binary": encode}
        logs = {name: SettlementLog(Path(tmp) / f"{name}-settled") for name in formats}
        best = {(name, what): float("inf") for name in formats for what in ("encode", "append")}
        count = 0
        for _ in range(args.rounds):
            for name, make in formats.items():
                started = time.perf_counter()
                for seq in range(count, count + per_round):
                    make(STORE_ID, seq, unit(seq))
                middle = time.perf_counter()
                log = logs[name]
                for seq in range(count, count + per_round):
                    log.append(make(STORE_ID, seq, unit(seq)))
                ended = time.perf_counter()
                best[name, "encode"] = min(best[name, "encode"], (middle - started) / per_round * 1e6)
                best[name, "append"] = min(best[name, "append"], (ended - middle) / per_round * 1e6)
            count += per_round
        for name, make in formats.items():
            logs[name].close()
            size = len(make(STORE_ID, 5, unit(5)))
            print(
                f"{name:7s} encode {best[name, 'encode']:5.2f} us  encode+append {best[name, 'append']:5.2f} us  "
                f"record {size} bytes"
            )
        print(
            f"binary/json: encode {best['binary', 'encode'] / best['json', 'encode']:.2f}, "
            f"encode+append {best['binary', 'append'] / best['json', 'append']:.2f}"
        )


if __name__ == "__main__":
    main()
