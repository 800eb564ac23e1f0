"""Thread mode: ``oncebus.server.run`` on an event loop of its own, in a thread of the test process.

Fastest to start (no interpreter, no imports), but the broker shares the test
process: a crash of the broker is a crash of the tests. The serve process tunes
the garbage collector for a long-running broker; here the test process's own
settings are put back once the broker is ready.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import threading
import traceback
from typing import Any

from oncebus.core.errors import OncebusError
from oncebus.server import ServeError, ServeOptions, run
from oncebus.server import loop as event_loop
from oncebus.server.settings import Settings
from oncebus.testing._launch import _OUTPUT_LINES, BrokerStartError, Launch


class ThreadBroker:
    def __init__(self, launch: Launch) -> None:
        self.options = ServeOptions(
            data_dir=launch.data_dir,
            host=launch.host,
            port=0,
            keys=dict(launch.keys) or None,
            config=None if launch.config is None else str(launch.config),
            clock_file=None if launch.clock_file is None else str(launch.clock_file),
            tune_gc=False,  # the test process's collector is the test's: a broker in a thread leaves it alone
        )
        self._lines: collections.deque[str] = collections.deque(maxlen=_OUTPUT_LINES)
        self._ready = threading.Event()
        self._info: dict[str, Any] | None = None
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    def start(self, timeout: float) -> dict[str, Any]:
        self._thread = threading.Thread(target=self._main, name="oncebus-serve", daemon=True)
        self._thread.start()
        ready = self._ready.wait(timeout)
        if not ready or self._info is None:
            why = f"failed: {self._error}" if self._error is not None else f"was not ready after {timeout:g} s"
            self.stop(5.0)
            raise BrokerStartError(f"oncebus serve (thread) {why}\n{self.output()}")
        return self._info

    def _main(self) -> None:
        try:
            if self.options.settings is None:  # read once: the loop is chosen from them, and run() takes them
                self.options = dataclasses.replace(self.options, settings=Settings.from_environ())
            assert self.options.settings is not None
            event_loop.run(self._serve(), self.options.settings.event_loop)
        except BaseException as exc:  # reported through output() and the start error, not lost in a thread
            self._error = exc
            if isinstance(exc, OncebusError | ServeError):
                self._lines.append(f"oncebus: error: {exc}")
            else:
                self._lines.extend(traceback.format_exception(exc))
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        await run(self.options, stop=self._stop, ready=self._on_ready, say=self._lines.append)

    def _on_ready(self, info: dict[str, Any]) -> None:
        self._info = info
        self._ready.set()

    def crash(self, timeout: float) -> dict[str, Any]:
        raise RuntimeError("a thread broker cannot be killed on its own: use mode='subprocess' to crash it")

    def alive(self, wait: float = 0.0) -> bool:
        if self._thread is None:
            return False
        self._thread.join(wait)
        return self._thread.is_alive()

    def output(self) -> str:
        status = "" if self.alive() or self._thread is None else "\n(the oncebus serve thread has ended)"
        return "\n".join(self._lines) + status

    def stop(self, timeout: float) -> None:
        if self._thread is None or not self._thread.is_alive():
            return
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(stop.set)
        self._thread.join(timeout)
