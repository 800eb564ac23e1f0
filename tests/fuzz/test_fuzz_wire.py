"""Mutated and generated AMQP frames thrown at a running ``oncebus serve``, starting from real SDK sessions.

The starting points are recordings of the azure-servicebus SDK talking to the server (open, SASL, CBS
put-token, attaches, single sends, lists, batches, value bodies, scheduling, receives with every
settlement, renewals, deferred receives, peeks, sessions and their state, a partitioned topic).
hypothesis mutates them (flipped, cut, dropped, repeated, swapped, resized and re-offset frames; fields
replaced by generated AMQP values or deep nesting; inflated payloads; whole generated performatives)
and each example is replayed on a fresh connection. After every example: the server is alive, it
logged no traceback, another client's acknowledged send and a send-and-receive succeed, and its
memory stays bounded. At the end every acknowledged send is still there, also after a restart.

``ONCEBUS_FUZZ_EXAMPLES`` sets the number of examples (default sized for CI); ``ONCEBUS_FUZZ_RANDOM=1``
explores new examples instead of the fixed (derandomized) CI set.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.amqp.conftest import ServerProcess
from tests.amqp.raw import vmrss_kib
from tests.fuzz.mutations import apply, mutations
from tests.fuzz.sessions import Checker, Recording, drain_ids, replay, writes_of

EXAMPLES = int(os.environ.get("ONCEBUS_FUZZ_EXAMPLES", "250"))
MEMORY_HEADROOM_KIB = 96 * 1024  # over the server's size once the recordings ran


def _settings() -> Any:
    return settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=os.environ.get("ONCEBUS_FUZZ_RANDOM") != "1",
        database=None,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )


def test_mutated_sdk_sessions_never_hurt_the_server_or_other_clients(
    fuzz_server: ServerProcess, recordings: list[Recording]
) -> None:
    checker = Checker(fuzz_server.connection_string)
    checker.check()
    baseline = vmrss_kib(fuzz_server.pid)
    seen_output = len(fuzz_server.output)
    stats = {"examples": 0, "closed_by_server": 0}

    @_settings()
    @given(
        recording=st.sampled_from(recordings),
        ops=st.lists(mutations, min_size=1, max_size=4),
    )
    def example(recording: Recording, ops: list[tuple[Any, ...]]) -> None:
        nonlocal seen_output
        result = replay(fuzz_server.port, apply(writes_of(recording), ops))
        stats["examples"] += 1
        stats["closed_by_server"] += int(result.closed_by_server)
        assert fuzz_server.alive(), "the server died:\n" + "\n".join(fuzz_server.output[-40:])
        checker.check()
        new_output = fuzz_server.output[seen_output:]
        seen_output = len(fuzz_server.output)
        tracebacks = [line for line in new_output if "Traceback" in line]
        assert not tracebacks, "the server logged a failure:\n" + "\n".join(new_output[-60:])
        grown = vmrss_kib(fuzz_server.pid) - baseline
        assert grown < MEMORY_HEADROOM_KIB, f"server memory grew by {grown // 1024} MiB"

    try:
        example()
        # the unmutated recordings replay too (the server answers them as it answered the SDK)
        for recording in recordings:
            replay(fuzz_server.port, writes_of(recording))
            checker.check()
    finally:
        checker.close()
    print(f"fuzz: {stats}")
    assert stats["examples"] >= min(EXAMPLES, 50)
    assert stats["closed_by_server"] > 0  # some mutations are protocol errors the server closed on
    # nothing acknowledged was lost, also across a restart
    fuzz_server.restart()
    assert sorted(drain_ids(fuzz_server.connection_string, "ledger")) == sorted(checker.acknowledged)
