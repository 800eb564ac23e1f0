"""The AMQP listener in this process (its own thread and loop), for tests that inject its wall clock or limits."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from oncebus.amqp.limits import AmqpLimits
from oncebus.amqp.sas import DEFAULT_KEYS
from oncebus.amqp.server import AmqpServer
from oncebus.broker import Namespace
from oncebus.broker.clock import ManualClock
from oncebus.store.memory import MemoryStore


class InProcessServer:
    """A Namespace on a memory store and an AmqpServer whose wall clock (token expiry) the test moves."""

    def __init__(self, limits: AmqpLimits, queues: list[str]) -> None:
        self.limits = limits
        self.queues = queues
        self.wall = time.time()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.server: AmqpServer | None = None
        self.namespace: Namespace | None = None

    def wall_time(self) -> float:
        return self.wall

    def run(self, work: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
        return asyncio.run_coroutine_threadsafe(work(), self.loop).result(30)

    def start(self) -> InProcessServer:
        self.thread.start()

        async def start() -> None:
            self.namespace = await Namespace.open(MemoryStore(), ManualClock(int(self.wall * 1_000_000)))
            for name in self.queues:
                await self.namespace.create_queue(name)
            self.server = AmqpServer(self.namespace, DEFAULT_KEYS, wall_time=self.wall_time, limits=self.limits)
            await self.server.start("127.0.0.1", 0)

        self.run(start)
        return self

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.port

    def stop(self) -> None:
        async def stop() -> None:
            if self.server is not None:
                await self.server.close()
            if self.namespace is not None:
                await self.namespace.close()

        self.run(stop)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
