"""The AMQP door's decode of one message, before and after, in one run (``timeit``, best of ``--repeat``).

Issue 34 item 1: the message applications send, decoded once and fast. Each shape is what the Python SDK puts on
the wire for one message of a batch (1 KiB body, the same as ``bench/amqp_send.py``'s):

- ``bare``: the body and a message id;
- ``realistic``: what applications send (``bench/amqp_send.py``'s realistic message): a subject, a content type, a
  correlation id and four application properties (str, int, bool, float);
- ``annotated``: the realistic message with a partition key and a time to live (a header and message
  annotations: the two sections the SDK adds for them).

Each is decoded (the rows timed in turn, on the process's CPU clock) by ``oncebus.amqp.codec.decode_message`` as
it is in this tree (``after``) and as it was at ``--baseline`` (``before``: that revision's
``src/oncebus/amqp/codec.py``, read with ``git show`` and loaded beside this one, on this tree's other modules),
and by the general path alone (``decode_message_general``: proton decodes and re-encodes the header, annotations
and application properties; the path left for rare shapes). The two decodes must agree, field for field.
Prints microseconds per message and the ratio before / after for each shape.

Usage: ``python bench/amqp_decode.py [--baseline 29ce338] [--number 2000] [--repeat 7]``
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import timeit
import types
from datetime import timedelta
from pathlib import Path
from typing import Any

from azure.servicebus import ServiceBusMessage
from azure.servicebus._pyamqp._encode import encode_payload
from azure.servicebus._transport._pyamqp_transport import PyamqpTransport

sys.path.insert(0, str(Path(__file__).resolve().parent))
import amqp_send as bench

from oncebus.amqp import codec

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "29ce338"  # the commit before the codec read its sections itself


def wire(message: ServiceBusMessage) -> bytes:
    """The bytes the SDK puts on the wire for ``message`` (one inner message of a batch)."""
    out = bytearray()
    encode_payload(out, PyamqpTransport.to_outgoing_amqp_message(message.raw_amqp_message))
    return bytes(out)


def shapes() -> dict[str, bytes]:
    annotated = bench.bench_message("realistic", "order-1")
    annotated.partition_key = "tenant-7"
    annotated.time_to_live = timedelta(minutes=5)
    return {
        "bare": wire(bench.bench_message("bare", "order-1")),
        "realistic": wire(bench.bench_message("realistic", "order-1")),
        "annotated": wire(annotated),
    }


def baseline_codec(revision: str) -> Any:
    """``src/oncebus/amqp/codec.py`` as it was at ``revision``, loaded as a module of its own (None: no git)."""
    try:
        source = subprocess.run(
            ["git", "show", f"{revision}:src/oncebus/amqp/codec.py"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"no baseline ({revision}): {exc}")
        return None
    module = types.ModuleType("baseline_codec")
    exec(compile(source, f"{revision}:codec.py", "exec"), module.__dict__)
    return module


def per_message(works: list[Any], number: int, repeat: int) -> list[float]:
    """Microseconds a call of each of ``works``: the best of ``repeat`` timings of ``number`` calls, the works
    timed in turn within each repeat (so all see the same load), on the process's CPU clock (time the machine
    gave to others is not counted)."""
    best = [float("inf")] * len(works)
    for _ in range(repeat):
        for i, work in enumerate(works):
            best[i] = min(best[i], timeit.timeit(work, number=number, timer=time.process_time))
    return [b / number * 1e6 for b in best]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=BASELINE, help="the git revision whose codec is 'before'")
    parser.add_argument("--number", type=int, default=2000, help="decodes a timing")
    parser.add_argument("--repeat", type=int, default=7, help="timings a row (the best is shown)")
    args = parser.parse_args()
    before = baseline_codec(args.baseline)
    print(f"decode of one SDK-encoded message (1 KiB body), us, best of {args.repeat} x {args.number}")
    print(f"  {'shape':<11} {'before':>8} {'after':>8} {'general':>8}   before / after")
    for name, encoded in shapes().items():
        after = codec.decode_message(encoded)
        if before is not None:
            old = before.decode_message(encoded)
            assert repr(old) == repr(after), f"{name}: the baseline decodes {old!r}, this tree {after!r}"
        works = [lambda e=encoded: codec.decode_message(e), lambda e=encoded: codec.decode_message_general(e)]
        if before is None:
            now, general = per_message(works, args.number, args.repeat)
            print(f"  {name:<11} {'-':>8} {now:8.2f} {general:8.2f}")
            continue
        now, general, then = per_message([*works, lambda e=encoded: before.decode_message(e)], args.number, args.repeat)
        print(f"  {name:<11} {then:8.2f} {now:8.2f} {general:8.2f}   {then / now:6.1f}")


if __name__ == "__main__":
    main()
