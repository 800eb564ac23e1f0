"""Run the serve process: ``await run(ServeOptions(...), stop=event, ready=callback)``.

No signal handlers are installed here unless ``install_signal_handlers`` is set
(the CLI sets it when it runs ``oncebus serve`` as the main program); a program
embedding the server in a thread stops it by setting ``stop``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oncebus import __version__
from oncebus.broker.clock import FileClock, SystemClock
from oncebus.broker.control import ControlServer
from oncebus.broker.datadir import DataDir
from oncebus.broker.namespace import Namespace
from oncebus.broker.runtime import tune_gc
from oncebus.core.errors import OncebusError
from oncebus.store.sendlog import SendLogWriter
from oncebus.store.sqlite import SqliteStore


class ServeError(Exception):
    """The serve process could not start; ``busy`` when the data directory is in use."""

    def __init__(self, message: str, *, busy: bool = False) -> None:
        super().__init__(message)
        self.busy = busy


@dataclass(frozen=True)
class ServeOptions:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 5672
    keys: Mapping[str, str] | None = None
    config: str | None = None
    send_log: str | None = None
    clock_file: str | None = None  # tests only: time read from a file (ONCEBUS_CLOCK_FILE)


def _default_print(line: str) -> None:
    print(line, flush=True)


async def run(
    options: ServeOptions,
    *,
    stop: asyncio.Event | None = None,
    ready: Callable[[dict[str, Any]], None] | None = None,
    say: Callable[[str], None] = _default_print,
    install_signal_handlers: bool = False,
) -> int:
    """Serve ``options.data_dir`` until ``stop`` is set (or SIGINT/SIGTERM when installed); returns 0.

    ``ready`` gets the server info (ports, connection string, ...) once every
    listener is up; ``say`` prints the start-up lines.
    """
    datadir = DataDir(options.data_dir)
    if not datadir.try_lock():
        pid = (datadir.read_server_info() or {}).get("pid") or datadir.owner_pid()
        raise ServeError(
            f"the data directory {datadir.path} is already in use by oncebus (pid {pid})"
            "; stop it or choose another directory with --data-dir",
            busy=True,
        )
    started = time.monotonic()
    store = SqliteStore(datadir.store_path)
    send_log = SendLogWriter(options.send_log) if options.send_log else None
    clock = FileClock(options.clock_file) if options.clock_file else SystemClock()
    namespace = await Namespace.open(store, clock, send_log=send_log)
    if options.config:
        from oncebus.broker.topology import apply_topology, load_topology

        await apply_topology(namespace, load_topology(options.config))
    tune_gc()
    control = ControlServer(namespace)
    await control.start()
    info: dict[str, Any] = {
        "pid": os.getpid(),
        "control_port": control.port,
        "control_token": control.token,
        "data_dir": str(datadir.path),
    }
    amqp_server = await _start_amqp(namespace, options, info)
    timers = asyncio.create_task(namespace.run_timers(0.05 if options.clock_file else 0.5))
    datadir.write_server_info(info)
    stop = stop if stop is not None else asyncio.Event()
    loop = asyncio.get_running_loop()
    if install_signal_handlers:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
    say(f"oncebus {__version__} serving {datadir.path} (started in {time.monotonic() - started:.2f} s)")
    if "connection_string" in info:
        say(f"AMQP on {info['amqp_host']}:{info['amqp_port']}")
        say(f"connection string: {info['connection_string']}")
    if ready is not None:
        ready(dict(info))
    say("ready")
    try:
        await stop.wait()
    finally:
        timers.cancel()
        if install_signal_handlers:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
        if amqp_server is not None:
            await amqp_server.close()
        await control.close()
        with contextlib.suppress(OncebusError):
            await namespace.close()
        store.close()
        if send_log is not None:
            send_log.close()
        datadir.unlock()
    return 0


async def _start_amqp(namespace: Namespace, options: ServeOptions, info: dict[str, Any]) -> Any:
    try:
        from oncebus.amqp import serve_amqp
    except ImportError:
        return None
    server = await serve_amqp(namespace, host=options.host, port=options.port, keys=options.keys)
    info.update(
        amqp_host=options.host,
        amqp_port=server.port,
        connection_string=server.connection_string,
    )
    return server
