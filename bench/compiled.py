"""The mypyc-compiled per-message modules against the same sources as pure Python, in one run.

Issue 34 item 5. The install compiles ``oncebus._compiled.COMPILED`` when a C compiler is there; with
``ONCEBUS_PURE_PYTHON=1`` a process loads their Python sources instead. Each row is measured both ways, the two
forms taking turns within every round (so both see the same load), the best round shown:

- decode: ``codec.decode_message`` of one SDK-encoded message (``bench/amqp_decode.py``'s shapes: bare,
  realistic, annotated), timed with ``timeit`` on the CPU clock in a child process of each form;
- send: ``bench/amqp_send.py``'s SDK senders (batches of 100, 1 KiB bodies) against two ``oncebus serve``, one
  of each form, to a queue with duplicate detection on, bare and realistic messages: msg/s and the server's CPU
  per message (``/proc``);
- receive + complete: the realistic messages received (PEEK_LOCK) and completed from each server.

Prints the figures and the ratios pure / compiled (server CPU a message, decode time) and compiled / pure (rate).

Usage: ``python bench/compiled.py [--messages 10000] [--senders 2] [--receivers 4] [--rounds 3] [--number 2000]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import amqp_send as bench

from oncebus import _compiled

FORMS = {"compiled": {}, "pure": {_compiled.PURE_PYTHON: "1"}}


def _env(form: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != _compiled.PURE_PYTHON}
    return {**env, **FORMS[form]}


def decode_child(number: int) -> None:
    """In a child: the decode timings of this process's form, as JSON (with the form actually loaded)."""
    import amqp_decode

    from oncebus.amqp import codec

    timings = {}
    for name, encoded in amqp_decode.shapes().items():
        (timings[name],) = amqp_decode.per_message([lambda e=encoded: codec.decode_message(e)], number, 1)
    used = _compiled.in_use()
    print(json.dumps({"timings": timings, "compiled": sorted(set(used.values()))}))


def decode_rows(rounds: int, number: int) -> dict[str, dict[str, float]]:
    best: dict[str, dict[str, float]] = defaultdict(dict)
    for r in range(rounds):
        for form in FORMS if r % 2 == 0 else reversed(FORMS):
            done = subprocess.run(
                [sys.executable, __file__, "--decode-child", str(number)],
                env=_env(form),
                capture_output=True,
                text=True,
                check=True,
            )
            got = json.loads(done.stdout.strip().splitlines()[-1])
            assert got["compiled"] == [form == "compiled"], f"the {form} child loaded {got['compiled']}"
            for shape, us in got["timings"].items():
                best[shape][form] = min(best[shape].get(form, float("inf")), us)
    return best


def start_server(form: str, workdir: Path) -> tuple[subprocess.Popen[str], str]:
    """``oncebus serve`` (bench/amqp_send.py's queues) in ``form``: the environment it inherits says which."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(_env(form))
    try:
        directory = workdir / form
        directory.mkdir()
        return bench.start_oncebus(directory)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10_000, help="messages a send or receive row")
    parser.add_argument("--senders", type=int, default=2, help="SDK sender processes")
    parser.add_argument("--receivers", type=int, default=4, help="SDK receiver processes")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each row of each form once a round")
    parser.add_argument("--number", type=int, default=2000, help="decodes a timing")
    parser.add_argument("--decode-child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.decode_child:
        decode_child(args.decode_child)
        return
    built = _compiled.manifest()
    if built is None or not built.get("compiled"):
        reason = "no manifest" if built is None else built.get("reason")
        print(f"this install is pure Python ({reason}): nothing compiled to compare; see CONTRIBUTING.md")
        return
    print(f"before: {bench.load()}; python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    print(f"compiled with mypyc: {', '.join(_compiled.COMPILED)}")
    decode = decode_rows(args.rounds, args.number)
    print(f"decode of one SDK-encoded message (1 KiB body), us, best of {args.rounds} rounds x {args.number}")
    print(f"  {'shape':<11} {'compiled':>9} {'pure':>9}   pure / compiled")
    for shape, by_form in decode.items():
        compiled, pure = by_form["compiled"], by_form["pure"]
        print(f"  {shape:<11} {compiled:9.2f} {pure:9.2f}   {pure / compiled:6.2f}")

    workdir = Path(tempfile.mkdtemp(prefix="oncebus-bench-compiled-"))
    servers: dict[str, tuple[subprocess.Popen[str], str]] = {}
    rows: dict[tuple[str, str], list[bench.Measured]] = defaultdict(list)
    per_receiver = (args.messages + args.receivers - 1) // args.receivers
    try:
        for form in FORMS:
            servers[form] = start_server(form, workdir)
        for r in range(args.rounds):
            order = list(FORMS) if r % 2 == 0 else list(reversed(FORMS))
            for shape in bench.SHAPES:
                for form in order:
                    process, connection = servers[form]
                    prefix = f"r{r}-{shape}"
                    jobs = [
                        (connection, "dedup-on", prefix, shape, share)
                        for share in bench._shares(args.messages, args.senders)
                    ]
                    rows[(f"send {shape}", form)].append(bench.run_workers(bench.sdk_sender, jobs, process.pid))
            for form in order:
                process, connection = servers[form]
                bench.sdk_fill(connection, "receive", f"r{r}-receive", args.messages, "realistic")
                jobs: list[tuple[Any, ...]] = [(connection, "receive", per_receiver)] * args.receivers
                rows[("receive + complete realistic", form)].append(
                    bench.run_workers(bench.sdk_receiver, jobs, process.pid)
                )
    finally:
        for process, _ in servers.values():
            process.send_signal(signal.SIGINT)
        for process, _ in servers.values():
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
        shutil.rmtree(workdir, ignore_errors=True)
    print(
        f"oncebus serve, dedup on, {args.messages:,} messages a row ({args.senders} senders, {args.receivers} "
        f"receivers), best of {args.rounds} rounds"
    )
    for row in dict.fromkeys(name for name, _ in rows):
        got = {form: bench.best(rows[(row, form)]) for form in FORMS}
        for form in FORMS:
            print(f"  {row:<29} {form:<9} {bench.describe(got[form])}")
        compiled, pure = got["compiled"], got["pure"]
        cpu = (
            "n/a"
            if compiled.server_cpu_us is None or pure.server_cpu_us is None or not compiled.server_cpu_us
            else f"{pure.server_cpu_us / compiled.server_cpu_us:.2f}"
        )
        print(
            f"  {'':<29} ratio server CPU a message pure / compiled {cpu}; rate compiled / pure "
            f"{compiled.rate / pure.rate:.2f}"
        )
    print(f"after: {bench.load()}")


if __name__ == "__main__":
    main()
