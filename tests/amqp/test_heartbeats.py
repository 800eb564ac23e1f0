"""The server keeps a client's idle timeout over a real socket: an empty frame whenever nothing else went out for
half of it, before and after other traffic (the connection keeps one heartbeat timer, re-armed as it fires, not
one per pump: docs/performance-log.md)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

import pytest
from azure.servicebus._pyamqp.performatives import BeginFrame, OpenFrame, SASLInit

from tests.amqp.conftest import ServerProcess, topology
from tests.amqp.raw import AMQP_HEADER, BEGIN, OPEN, SASL_HEADER, SASL_MECHANISMS, SASL_OUTCOME, RawClient, frame

IDLE_MS = 600  # the client's idle-time-out: the server must send something at least this often


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(tmp_path_factory.mktemp("heartbeats") / "data", topology({"beats": {}}, {})).start()
    yield process
    process.stop()


def open_with_idle_timeout(client: RawClient, idle_ms: int) -> None:
    client.send(SASL_HEADER)
    client.expect(SASL_MECHANISMS)
    client.send(frame(SASLInit(b"ANONYMOUS", None, None), frame_type=b"\x01"))
    assert client.expect(SASL_OUTCOME).fields[0] == 0
    client.send(AMQP_HEADER + frame(OpenFrame("beats", None, 65536, 255, idle_ms, None, None, None, None, None)))
    client.expect(OPEN)


def arrivals(client: RawClient, seconds: float) -> list[tuple[float, bool]]:
    """(when, empty) of every frame the server sends within ``seconds``."""
    got = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        received = client.read_frame(left)
        if received is None:
            assert not client.eof, "the server closed the connection"
            break
        got.append((time.monotonic(), received.code is None))
    return got


def test_an_idle_client_gets_an_empty_frame_within_its_idle_timeout(server: ServerProcess) -> None:
    with RawClient(server.port) as client:
        open_with_idle_timeout(client, IDLE_MS)
        opened = time.monotonic()
        beats = arrivals(client, 2.5)
        assert len([empty for _, empty in beats if empty]) >= 3, beats
        moments = [opened] + [at for at, _ in beats]
        gaps = [b - a for a, b in itertools.pairwise(moments)]
        assert max(gaps) < IDLE_MS / 1000, gaps  # (every half idle timeout: about 0.3 s apart)


def test_heartbeats_go_on_after_other_traffic(server: ServerProcess) -> None:
    """Traffic moves the next heartbeat later (the timer set earlier fires first, and sets the next one)."""
    with RawClient(server.port) as client:
        open_with_idle_timeout(client, IDLE_MS)
        client.send(frame(BeginFrame(None, 0, 65536, 65536, 1023, None, None, None)))
        client.expect(BEGIN)
        for i in range(3):  # requests that get answers, each pushing the heartbeat's deadline on
            assert client.put_token("beats", handles=(10 + 2 * i, 11 + 2 * i)) == 202
        traffic_done = time.monotonic()
        beats = arrivals(client, 2.0)
        empties = [at for at, empty in beats if empty]
        assert len(empties) >= 2, beats
        moments = [traffic_done] + [at for at, _ in beats]
        gaps = [b - a for a, b in itertools.pairwise(moments)]
        assert max(gaps) < IDLE_MS / 1000, gaps
