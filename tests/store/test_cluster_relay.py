"""A standby's forwarding door (``oncebus.server.cluster.Relay``) against real sockets: bytes both ways, its bounds
(connections over the cap closed at once, a connection with no leader to go to closed after the wait), and a
leader that goes away ends its clients' connections. The leader here is a plain TCP echo server; the cluster
tests (``test_cluster.py``) run the relay in front of real nodes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from oncebus.server import cluster
from oncebus.server.cluster import Leader, LeaderWatch, Relay


async def _echo_server() -> tuple[asyncio.Server, int, list[asyncio.StreamWriter]]:
    writers: list[asyncio.StreamWriter] = []

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    return server, int(server.sockets[0].getsockname()[1]), writers


class _Where:
    """Where the leader is, as the database would say: set by the test."""

    def __init__(self) -> None:
        self.leader: Leader | None = None

    def read(self) -> Leader | None:
        return self.leader


@contextlib.asynccontextmanager
async def _relay_with_echo() -> AsyncIterator[tuple[Relay, _Where, int]]:
    server, port, _ = await _echo_server()
    where = _Where()
    watch = LeaderWatch(where.read)
    watch.start()
    relay = Relay("127.0.0.1", watch)
    await relay.start({"amqp": 0, "tls": -1, "http": 0})
    try:
        yield relay, where, port
    finally:
        await relay.close()
        await watch.close()
        server.close()


async def _connect(port: int | None) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    assert port is not None
    return await asyncio.open_connection("127.0.0.1", port)


def test_bytes_go_both_ways_to_the_leaders_port_of_the_same_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster, "WATCH_SECONDS", 0.05)
    asyncio.run(_both_ways())


async def _both_ways() -> None:
    async with _relay_with_echo() as (relay, where, port):
        assert relay.ports["tls"] is None and relay.ports["amqp"] and relay.ports["http"]
        where.leader = Leader("n1", "127.0.0.1", {"amqp": port, "tls": None, "http": None})
        reader, writer = await _connect(relay.ports["amqp"])
        payload = bytes(range(256)) * 1024  # more than one chunk each way
        writer.write(payload)
        await writer.drain()
        got = await asyncio.wait_for(reader.readexactly(len(payload)), 10)
        assert got == payload and relay.forwarded == 1
        writer.close()
        # the leader has no HTTP port: a connection to the standby's HTTP port is closed, not left hanging
        reader, writer = await _connect(relay.ports["http"])
        assert await asyncio.wait_for(reader.read(), 10) == b""
        assert relay.refused == 1
        writer.close()


def test_a_connection_waits_for_a_leader_then_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster, "WATCH_SECONDS", 0.05)
    monkeypatch.setattr(cluster, "LEADER_WAIT_SECONDS", 0.5)
    asyncio.run(_waits(monkeypatch))


async def _waits(monkeypatch: pytest.MonkeyPatch) -> None:
    async with _relay_with_echo() as (relay, where, port):
        reader, writer = await _connect(relay.ports["amqp"])
        writer.write(b"AMQP\x00\x01\x00\x00")
        assert await asyncio.wait_for(reader.read(), 10) == b""  # no leader in time: closed
        assert relay.refused == 1 and relay.forwarded == 0
        writer.close()
        # a leader that appears while the connection waits: it is forwarded (what was sent meanwhile too)
        monkeypatch.setattr(cluster, "LEADER_WAIT_SECONDS", 10.0)
        reader, writer = await _connect(relay.ports["amqp"])
        writer.write(b"early")
        await asyncio.sleep(0.2)
        where.leader = Leader("n2", "127.0.0.1", {"amqp": port, "tls": None, "http": None})
        assert await asyncio.wait_for(reader.readexactly(5), 10) == b"early"
        writer.close()


def test_connections_over_the_cap_are_closed_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster, "WATCH_SECONDS", 0.05)
    monkeypatch.setattr(cluster, "MAX_RELAYED", 3)
    asyncio.run(_cap())


async def _cap() -> None:
    async with _relay_with_echo() as (relay, where, port):
        where.leader = Leader("n1", "127.0.0.1", {"amqp": port, "tls": None, "http": None})
        held = [await _connect(relay.ports["amqp"]) for _ in range(3)]
        for reader, writer in held:  # forwarded: each echoes
            writer.write(b"x")
            assert await asyncio.wait_for(reader.readexactly(1), 10) == b"x"
        reader, writer = await _connect(relay.ports["amqp"])
        assert await asyncio.wait_for(reader.read(), 10) == b""
        assert relay.refused == 1
        writer.close()
        for _, w in held:
            w.close()


def test_the_leader_going_away_closes_its_forwarded_connections() -> None:
    asyncio.run(_leader_away())


async def _leader_away() -> None:
    server, port, writers = await _echo_server()
    where = _Where()
    where.leader = Leader("n1", "127.0.0.1", {"amqp": port, "tls": None, "http": None})
    watch = LeaderWatch(where.read)
    watch.start()
    relay = Relay("127.0.0.1", watch)
    await relay.start({"amqp": 0})
    try:
        reader, writer = await _connect(relay.ports["amqp"])
        writer.write(b"hello")
        assert await asyncio.wait_for(reader.readexactly(5), 10) == b"hello"
        for upstream in writers:  # the leader dies: its side of every connection closes
            upstream.transport.abort()
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()
    finally:
        await relay.close()
        await watch.close()
        server.close()
