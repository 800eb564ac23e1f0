"""An in-process broker (Namespace on a ManualClock) with the observe app served by uvicorn on a free port.

The namespace and the HTTP server share one event loop on a background thread, as in
``oncebus serve``; tests drive the broker with ``call`` and read over real HTTP.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import urllib.request
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import uvicorn

from oncebus.amqp import serve_amqp
from oncebus.broker import ManualClock, Namespace
from oncebus.http.observe import make_observe_app
from oncebus.store.sqlite import SqliteStore

T = TypeVar("T")


class ObservedBroker:
    def __init__(self, tmp_path: Path, *, amqp: bool = False) -> None:
        self.amqp = amqp  # also serve AMQP on a free port, with its connection and link gauges
        self.amqp_server: Any = None
        self.connection_string = ""
        self.clock = ManualClock()
        self.store = SqliteStore(tmp_path / "oncebus.db")
        self.loop = asyncio.new_event_loop()
        self.namespace: Namespace | None = None
        self._server: uvicorn.Server | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, name="observed-broker", daemon=True)
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.port = int(self._sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ObservedBroker:
        self._thread.start()
        self.call(self._start)
        return self

    async def _start(self) -> None:
        self.namespace = await Namespace.open(self.store, self.clock)
        if self.amqp:
            self.amqp_server = await serve_amqp(self.namespace, port=0)
            self.connection_string = self.amqp_server.connection_string
        app = make_observe_app(self.namespace)  # the AMQP server reports its gauges to the namespace
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self._serving = asyncio.create_task(self._server.serve(sockets=[self._sock]))
        while not self._server.started:
            await asyncio.sleep(0.01)

    async def _stop(self) -> None:
        assert self._server is not None
        self._server.should_exit = True
        await self._serving
        if self.amqp_server is not None:
            await self.amqp_server.close()

    def __exit__(self, *exc: object) -> None:
        try:
            self.call(self._stop)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.store.close()
            self.loop.close()

    @property
    def ns(self) -> Namespace:
        assert self.namespace is not None
        return self.namespace

    def call(self, work: Callable[[], Awaitable[T]], timeout: float = 30.0) -> T:
        """Run a coroutine function on the broker's loop and wait for its result."""

        async def run() -> T:
            return await work()

        future: Future[T] = asyncio.run_coroutine_threadsafe(run(), self.loop)
        return future.result(timeout)

    def sync(self, work: Callable[[], T]) -> T:
        """Run a plain function on the broker's loop (the broker's structures are the loop's alone)."""

        async def run() -> T:
            return work()

        return self.call(run)

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        request = urllib.request.Request(self.url + path, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
        except urllib.error.HTTPError as error:
            return error.code, {k.lower(): v for k, v in error.headers.items()}, error.read()


def samples(families: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of parsed metric families, keyed by (sample name, sorted labels)."""
    out = {}
    for family in families:
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out
