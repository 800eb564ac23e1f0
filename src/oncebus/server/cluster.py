"""Several ``oncebus serve --cluster`` nodes on one PostgreSQL database: one leads, the others forward to it.

The leader is the node whose store holds the schema's node lock (a session-level advisory lock: see
``oncebus.store.postgres``); it serves as a single node does, deciding duplicates, locks, sequence numbers and
schedules in its memory, and writes everything through that one session. Every other node is a *standby*: it
listens on its own ports and forwards each client connection, byte for byte, to the leader's matching port (so a
client may connect to any node and gets the leader's answers: one dedup decision, one lock table, one sequence),
while it waits for the lock. When the leader dies, its session ends, the lock is free, and the first standby
to take it loads the store and serves on its own ports (its forwarded clients are disconnected and reconnect).
A leader whose session ends (the database restarted, the connection cut) stops serving at once and waits
again: another node may have taken the lock and written meanwhile.

This module holds what a standby runs: ``LeaderWatch`` (where the leader serves, read from the database every
``WATCH_SECONDS``) and ``Relay`` (the forwarding listeners).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from oncebus.server.listener import bind

_LOG = logging.getLogger("oncebus.server")
WATCH_SECONDS = 0.5  # a standby reads where the leader serves this often
LEADER_WAIT_SECONDS = 15.0  # a connection that comes while no node leads waits this long for one, then closes
CONNECT_SECONDS = 5.0  # to open the connection to the leader
MAX_RELAYED = 5000  # connections a standby forwards at once (as the AMQP door's own cap); more are closed
CHUNK = 65536  # bytes read at a time from either side; a side is read again only once the other took them
KINDS = ("amqp", "tls", "http")  # the ports a node has, each forwarded to the leader's port of the same kind


@dataclass(frozen=True)
class Leader:
    """Where the cluster's leader serves: its node name, the host to reach it on and its ports by kind."""

    node: str
    host: str
    ports: dict[str, int | None]

    @classmethod
    def of(cls, node: str, address: dict[str, Any]) -> Leader:
        return cls(node, str(address["host"]), {kind: address.get(kind) for kind in KINDS})

    def where(self) -> str:
        return f"{self.node} at {self.host}:{self.ports['amqp']}"


class LeaderWatch:
    """Where the leader serves, as the database says, read on a thread every ``WATCH_SECONDS``."""

    def __init__(self, read: Callable[[], Leader | None]) -> None:
        self._read = read
        self.leader: Leader | None = None
        self.changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failure: str | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            try:
                leader = await asyncio.to_thread(self._read)
                self._failure = None
            except Exception as exc:  # the database away: no leader known until it answers
                reason = str(exc) or type(exc).__name__
                if reason != self._failure:
                    _LOG.warning("cannot read the cluster's leader: %s", reason)
                    self._failure = reason
                leader = None
            if leader != self.leader:
                self.leader = leader
                self.changed.set()
                self.changed = asyncio.Event()
                if leader is not None:
                    _LOG.info("the cluster's leader is %s", leader.where())
            await asyncio.sleep(WATCH_SECONDS)

    async def wait_leader(self, timeout: float) -> Leader | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.leader is None:
            left = deadline - loop.time()
            if left <= 0:
                return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)
        return self.leader

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


class Relay:
    """A standby's listeners: each connection is forwarded to the leader's port of the same kind, both ways, with
    at most ``CHUNK`` bytes in hand per direction (TCP's flow control does the rest)."""

    def __init__(self, host: str, watch: LeaderWatch) -> None:
        self.host = host
        self.watch = watch
        self.ports: dict[str, int | None] = {}
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.forwarded = 0  # connections forwarded so far
        self.refused = 0  # connections closed: over MAX_RELAYED, no leader in time, the leader unreachable

    async def start(self, ports: dict[str, int]) -> dict[str, int | None]:
        """Listen on ``ports`` (kind -> port; 0 picks one, -1 none); returns the bound ports (all or none)."""
        opened: list[list[socket.socket]] = []
        bound: dict[str, int | None] = {}
        try:
            for kind in KINDS:
                port = ports.get(kind, -1)
                if port < 0:
                    bound[kind] = None
                    continue
                sockets = bind(self.host, port)
                opened.append(sockets)
                bound[kind] = int(sockets[0].getsockname()[1])
                for sock in sockets:
                    self._servers.append(await asyncio.start_server(self._handler(kind), sock=sock))
        except BaseException:
            for sockets in opened:
                for sock in sockets:
                    sock.close()
            raise
        self.ports = bound
        return bound

    def _handler(self, kind: str) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Any]:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            if len(self._tasks) >= MAX_RELAYED:
                self.refused += 1
                writer.close()
                return
            self._tasks.add(task)
            try:
                await self._forward(kind, reader, writer)
            finally:
                self._tasks.discard(task)

        return handle

    async def _forward(self, kind: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: asyncio.StreamWriter | None = None
        try:
            leader = await self.watch.wait_leader(LEADER_WAIT_SECONDS)
            port = None if leader is None else leader.ports.get(kind)
            if leader is None or port is None:
                self.refused += 1
                return
            try:
                up_reader, up_writer = await asyncio.wait_for(
                    asyncio.open_connection(leader.host, port), CONNECT_SECONDS
                )
            except (OSError, TimeoutError) as exc:
                self.refused += 1
                _LOG.info("cannot reach the cluster's leader %s: %s", leader.where(), exc)
                return
            upstream = up_writer
            self.forwarded += 1
            down = asyncio.ensure_future(_pump(reader, up_writer))
            up = asyncio.ensure_future(_pump(up_reader, writer))
            try:
                await asyncio.wait({down, up}, return_when=asyncio.FIRST_COMPLETED)
            finally:  # either side gone: both closed (a half-closed AMQP or TLS peer is of no use)
                down.cancel()
                up.cancel()
                await asyncio.gather(down, up, return_exceptions=True)
        finally:
            for w in (writer, upstream):
                if w is not None:
                    w.close()

    async def close(self) -> None:
        """Stop listening and close every forwarded connection (their clients reconnect)."""
        for server in self._servers:
            server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)
        self._servers.clear()


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, ConnectionError):
        while True:
            data = await source.read(CHUNK)
            if not data:
                return
            sink.write(data)
            await sink.drain()


def run_in_thread(stop: threading.Event, target: Callable[[threading.Event], Any]) -> asyncio.Future[Any]:
    """``target(stop)`` on a thread of its own (not the default pool, which a long wait would hold)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def call() -> None:
        try:
            result = target(stop)
        except BaseException as exc:  # handed to the waiting coroutine
            loop.call_soon_threadsafe(_settle, future, None, exc)
        else:
            loop.call_soon_threadsafe(_settle, future, result, None)

    threading.Thread(target=call, name="oncebus-cluster-wait", daemon=True).start()
    return future


def _settle(future: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)
