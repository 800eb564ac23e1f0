"""Test-only: ``oncebus serve`` with a clock the test sets, for scenarios written at time offsets.

Usage: ``python clocked_server.py DATA_DIR CLOCK_FILE [TOPOLOGY_FILE]``. It serves
like ``oncebus serve --port 0`` (same Namespace, SQLite store, AMQP front end,
control socket, so the CLI works against it), but the broker's clock reads
CLOCK_FILE: an integer of microseconds since the epoch, which only ever moves
forward. Prints ``connection string: ...`` and ``ready`` like the real command.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from pathlib import Path

from oncebus.amqp import serve_amqp
from oncebus.broker.control import ControlServer
from oncebus.broker.datadir import DataDir
from oncebus.broker.namespace import Namespace
from oncebus.broker.topology import apply_topology, load_topology
from oncebus.store.sqlite import SqliteStore


class FileClock:
    """Reads the time from a file the test writes; never runs backwards."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp = -1
        self._value = 0

    def now_us(self) -> int:
        try:
            stamp = os.stat(self.path).st_mtime_ns
        except FileNotFoundError:
            return max(self._value, time.time_ns() // 1000)
        if stamp != self._stamp:
            text = self.path.read_text().strip()
            if text:
                self._stamp = stamp
                self._value = max(self._value, int(text))
        return self._value


async def main(data_dir: Path, clock_file: Path, topology: str | None) -> None:
    datadir = DataDir(data_dir)
    if not datadir.try_lock():
        raise SystemExit(f"{data_dir} is in use")
    store = SqliteStore(datadir.store_path)
    namespace = await Namespace.open(store, FileClock(clock_file))
    if topology:
        await apply_topology(namespace, load_topology(topology))
    control = ControlServer(namespace)
    await control.start()
    amqp = await serve_amqp(namespace, port=0)
    timers = asyncio.create_task(namespace.run_timers(0.05))
    datadir.write_server_info(
        {
            "pid": os.getpid(),
            "control_port": control.port,
            "control_token": control.token,
            "data_dir": str(datadir.path),
            "amqp_port": amqp.port,
            "connection_string": amqp.connection_string,
        }
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"connection string: {amqp.connection_string}", flush=True)
    print("ready", flush=True)
    try:
        await stop.wait()
    finally:
        timers.cancel()
        await amqp.close()
        await control.close()
        with contextlib.suppress(Exception):
            await namespace.close()
        store.close()
        datadir.unlock()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None))
