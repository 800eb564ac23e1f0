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
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.amqp.conftest import ServerProcess, topology
from tests.amqp.raw import vmrss_kib
from tests.fuzz.conftest import QUEUES, TOPICS
from tests.fuzz.mutations import apply, mutations
from tests.fuzz.sessions import Checker, Recording, drain_ids, replay, writes_of
from tests.postgres_cluster import PostgresCluster

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


def test_mutated_sdk_sessions_through_a_standby_never_hurt_the_cluster(
    recordings: list[Recording], tmp_path: Path, postgres_cluster: PostgresCluster
) -> None:
    """The same mutated sessions thrown at a cluster's standby (``serve --cluster``), which forwards them byte for
    byte to the leader: after every example both nodes are alive and logged no traceback, another client's send
    through the standby is acknowledged, the standby's memory stays bounded, and at the end every acknowledged send
    is there."""
    env = {"ONCEBUS_STORE": postgres_cluster.fresh_url(), "ONCEBUS_AMQP_HANDSHAKE_TIMEOUT": "2"}
    config = topology(QUEUES, TOPICS)
    leader = ServerProcess(tmp_path / "leader", config, env=env, args=("--cluster",)).start()
    standby = ServerProcess(tmp_path / "standby", env=env, args=("--cluster",)).start()
    checker = Checker(standby.connection_string)
    try:
        assert any("a standby of the cluster" in line for line in standby.output), standby.output
        checker.check()
        baseline = vmrss_kib(standby.pid)
        seen = {id(leader): len(leader.output), id(standby): len(standby.output)}
        stats = {"examples": 0}

        @settings(_settings(), max_examples=max(EXAMPLES // 5, 20))
        @given(recording=st.sampled_from(recordings), ops=st.lists(mutations, min_size=1, max_size=4))
        def example(recording: Recording, ops: list[tuple[Any, ...]]) -> None:
            replay(standby.port, apply(writes_of(recording), ops))
            stats["examples"] += 1
            for node in (leader, standby):
                assert node.alive(), "a node died:\n" + "\n".join(node.output[-40:])
                new_output = node.output[seen[id(node)] :]
                seen[id(node)] = len(node.output)
                assert not [line for line in new_output if "Traceback" in line], "\n".join(new_output[-60:])
            checker.check()
            grown = vmrss_kib(standby.pid) - baseline
            assert grown < MEMORY_HEADROOM_KIB, f"the standby's memory grew by {grown // 1024} MiB"

        example()
        assert stats["examples"] >= 20
        assert sorted(drain_ids(standby.connection_string, "ledger")) == sorted(checker.acknowledged)
    finally:
        checker.close()
        standby.stop()
        leader.stop()
