"""``serve()``: an ``oncebus serve`` of the test's own, on a free port and a temporary data directory."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Protocol

from oncebus.auth import KEYS_ENV
from oncebus.core.timeutil import us_to_datetime
from oncebus.testing._calls import ControlCalls
from oncebus.testing._client import BrokerGoneError, ControlClient
from oncebus.testing._entities import (
    Config,
    config_file_text,
)
from oncebus.testing._launch import _OUTPUT_LINES, BrokerStartError, Launch

if TYPE_CHECKING:
    from oncebus.testing._namespaces import IsolatedNamespace

Mode = Literal["subprocess", "thread"]
MODES: tuple[Mode, ...] = ("subprocess", "thread")
CLOCK_FILE = "clock"
WORK_DIR_ENV = "ONCEBUS_TESTING_WORK_DIR"  # the child removes it if this process dies first (see _child)


class _Broker(Protocol):
    def start(self, timeout: float) -> dict[str, Any]: ...
    def crash(self, timeout: float) -> dict[str, Any]: ...
    def alive(self, wait: float = 0.0) -> bool: ...
    def output(self) -> str: ...
    def stop(self, timeout: float) -> None: ...


class _SubprocessBroker:
    """``oncebus serve`` in a child process: a crash in the broker cannot take the tests down, and the broker
    stops when this process ends, however it ends."""

    def __init__(self, launch: Launch) -> None:
        self.argv = [sys.executable, "-m", "oncebus.testing._child", "--data-dir", str(launch.data_dir), "serve"]
        self.argv += ["--host", launch.host, "--port", "0"]
        if launch.config is not None:
            self.argv += ["--config", str(launch.config)]
        self.data_dir = launch.data_dir
        self.env = dict(os.environ, PYTHONUNBUFFERED="1")
        # keys go through the environment, not the command line (which any local user reads in /proc)
        self.env.pop(KEYS_ENV, None)
        if launch.keys:
            self.env[KEYS_ENV] = ";".join(f"{name}={key}" for name, key in launch.keys.items())
        self.env.pop("ONCEBUS_DATA_DIR", None)
        self.env.pop("ONCEBUS_CLOCK_FILE", None)
        if launch.clock_file is not None:
            self.env["ONCEBUS_CLOCK_FILE"] = str(launch.clock_file)
        self.env[WORK_DIR_ENV] = str(launch.work_dir)
        self.process: subprocess.Popen[str] | None = None
        self._lines: collections.deque[str] = collections.deque(maxlen=_OUTPUT_LINES)
        self._ready = threading.Event()
        self._info: dict[str, Any] | None = None

    def start(self, timeout: float) -> dict[str, Any]:
        self.process = subprocess.Popen(
            self.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.PIPE,  # held open for the child's life: at end of file it stops (see _child)
            text=True,
            env=self.env,
        )
        threading.Thread(target=self._drain, name="oncebus-serve-output", daemon=True).start()
        if not self._ready.wait(timeout) or self._info is None:
            why = "exited" if self.process.poll() is not None else f"was not ready after {timeout:g} s"
            self.stop(5.0)
            raise BrokerStartError(f"oncebus serve {why}:\n{self.output()}")
        return self._info

    def crash(self, timeout: float) -> dict[str, Any]:
        """Kill the broker (SIGKILL: no shutdown of any kind) and start it again on the same data directory and
        the same ports, so clients reconnect with the same connection string."""
        assert self.process is not None and self._info is not None
        info = self._info
        self.process.kill()
        self.process.wait()
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        ports = {"--port": info["amqp_port"], "--tls-port": info.get("tls_port"), "--http-port": info.get("http_port")}
        argv = self.argv[: self.argv.index("--port")] + self.argv[self.argv.index("--port") + 2 :]
        for option, port in ports.items():
            argv += [option, str(port if port is not None else -1)]
        self.argv = argv
        self._lines.append("(killed with SIGKILL by OncebusServer.crash(); starting again)")
        self._ready = threading.Event()
        self._info = None
        return self.start(timeout)

    def _drain(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        ready = self._ready
        for line in self.process.stdout:  # drained for the broker's whole life, so it never blocks on a full pipe
            self._lines.append(line.rstrip("\n"))
            if line.strip() == "ready" and not ready.is_set():
                from oncebus.server.datadir import DataDir

                self._info = DataDir(self.data_dir).read_server_info()
                ready.set()
        ready.set()

    def alive(self, wait: float = 0.0) -> bool:
        """Running (after waiting up to ``wait`` seconds for it to end: a killed process closes its sockets
        before its exit status is there)."""
        if self.process is None:
            return False
        try:
            self.process.wait(wait)
        except subprocess.TimeoutExpired:
            return True
        return False

    def output(self) -> str:
        code = None if self.process is None else self.process.poll()
        status = "" if code is None else f"\n(oncebus serve exited with code {code})"
        return "\n".join(self._lines) + status

    def stop(self, timeout: float) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()


class OncebusServer(ControlCalls):
    """A running broker under test: where to connect, entity helpers, statistics and the test clock."""

    def __init__(
        self, *, mode: Mode, info: dict[str, Any], data_dir: Path, clock_file: Path | None, broker: _Broker
    ) -> None:
        self.mode: Mode = mode
        self.data_dir = data_dir
        self.connection_string: str = info["connection_string"]
        self.host: str = info.get("amqp_host", "127.0.0.1")
        self.port: int = int(info["amqp_port"])
        ca_file = info.get("ca_file")
        self.ca_file: Path | None = Path(ca_file) if ca_file else None  # the CA to trust for TLS
        self.tls_port: int | None = info.get("tls_port")  # TLS only (AMQP over TLS, HTTPS)
        self.http_port: int | None = info.get("http_port")  # plain HTTP (administration API)
        self.info = info
        self._broker = broker
        self._clock_file = clock_file
        self._offset_us = 0
        self._stamp_ns = 0
        self._client = ControlClient(
            int(info["control_port"]), str(info["control_token"]), describe_failure=self._failure_text
        )
        if clock_file is not None:
            self._write_clock()

    def __repr__(self) -> str:
        return f"<OncebusServer {self.mode} {self.host}:{self.port} data_dir={self.data_dir}>"

    # ------------------------------------------------------------------------------ control
    def control(self, op: str, **args: Any) -> Any:
        """One operation of the control protocol (``oncebus.server.control``), e.g. ``control("queue.list")``."""
        return self._client.call(op, args)

    def _failure_text(self) -> str:
        if self._broker.alive(wait=1.0):
            return ""
        return f"\nthe broker is not running; its last output:\n{self._broker.output()}"

    @property
    def alive(self) -> bool:
        return self._broker.alive()

    def output(self) -> str:
        """The broker's recent output (subprocess mode: its stdout and stderr)."""
        return self._broker.output()

    # ------------------------------------------------------------------------------ faults
    def arm_fault(
        self,
        kind: str,
        entity: str | None = None,
        *,
        count: int | None = None,
        duration: float | timedelta | None = None,
        after: int = 0,
        delay: float | timedelta | None = None,
        seconds: float | timedelta | None = None,
        how: str | None = None,
    ) -> str:
        """Arm a fault (see ``oncebus.broker.faults`` for the kinds): on ``entity`` (None: every entity), for the
        next ``count`` operations (default 1) after letting ``after`` through, or for ``duration``, live ``delay``
        from now (the broker's clock: ``advance()`` moves it); ``seconds``:
        the delay of ``slow-ack``/``slow-delivery``; ``how``: ``lost-ack``'s ``drop``, ``close`` or ``detach``.
        Returns the fault's id (for :meth:`clear_faults`)."""
        spec: dict[str, Any] = {"kind": kind, "entity": entity, "count": count, "after": after, "how": how}
        spec["duration"] = duration.total_seconds() if isinstance(duration, timedelta) else duration
        spec["seconds"] = seconds.total_seconds() if isinstance(seconds, timedelta) else seconds
        spec["delay"] = delay.total_seconds() if isinstance(delay, timedelta) else delay
        return str(self.control("fault.arm", fault={k: v for k, v in spec.items() if v is not None})["id"])

    def faults(self) -> list[dict[str, Any]]:
        """The faults armed now (a counted one leaves the list once it has fired its count)."""
        return list(self.control("fault.list"))

    def crash(self) -> None:
        """Kill the broker process (SIGKILL) and start it again on the same data directory and ports (subprocess
        mode only): what was acknowledged is there again, what was not is not; armed faults are gone."""
        if self.mode != "subprocess":
            raise RuntimeError("crash() needs mode='subprocess': a thread broker cannot be killed on its own")
        info = self._broker.crash(60.0)
        self.info = info
        self._client.close()
        self._client = ControlClient(
            int(info["control_port"]), str(info["control_token"]), describe_failure=self._failure_text
        )

    # ------------------------------------------------------------------------------ entities
    def delete_queue(self, name: str) -> None:
        self.control("queue.delete", name=name)

    def delete_topic(self, name: str) -> None:
        self.control("topic.delete", name=name)

    def delete_subscription(self, topic: str, name: str) -> None:
        self.control("subscription.delete", topic=topic, name=name)

    # ------------------------------------------------------------------------------ reading
    # ------------------------------------------------------------------------------ namespaces of their own
    def create_namespace(self, name: str | None = None) -> IsolatedNamespace:
        """A new namespace on this broker (in memory), isolated from the others: its own entities, messages, dedup
        history, faults and clock; ``name``: lower-case letters, digits and '-' (default: a fresh unique one).
        Its ``connection_string`` is this broker's with ``@<name>`` appended to ``SharedAccessKeyName``."""
        from oncebus.testing._namespaces import IsolatedNamespace

        chosen = name if name is not None else f"t-{uuid.uuid4().hex[:16]}"
        return IsolatedNamespace(self, dict(self.control("namespaces.create", name=chosen)))

    def namespaces(self) -> list[dict[str, Any]]:
        """The namespaces created on this broker (name, connection string, time, entity count)."""
        return list(self.control("namespaces.list"))

    # ------------------------------------------------------------------------------ a fresh namespace
    def reset(self) -> None:
        """Delete every entity with its messages and dedup history and bring the clock back to the real time."""
        if self._clock_file is not None:
            self._offset_us = 0
            self._write_clock()
        self.control("namespace.reset")

    # ------------------------------------------------------------------------------ the test clock
    def advance(self, delta: timedelta | float) -> datetime:
        """Move the broker's time forward (a ``timedelta`` or seconds) without sleeping, and apply at once what
        falls due: duplicate-detection windows, locks, TTLs, scheduled messages. The time keeps running after."""
        if self._clock_file is None:
            raise RuntimeError("this broker was started with test_clock=False: its time cannot be advanced")
        step = delta if isinstance(delta, timedelta) else timedelta(seconds=delta)
        if step < timedelta(0):
            raise ValueError(f"advance({delta!r}): the broker's time only moves forward")
        self._offset_us += step // timedelta(microseconds=1)
        self._write_clock()
        return us_to_datetime(self.control("clock.tick")["now_us"])

    def _write_clock(self) -> None:
        """``+offset`` microseconds (broker/clock.py FileClock); a new file with a new mtime, so it is re-read."""
        assert self._clock_file is not None
        self._stamp_ns = max(time.time_ns(), self._stamp_ns + 1_000_000)
        temporary = self._clock_file.with_name(self._clock_file.name + ".tmp")
        temporary.write_text(f"+{self._offset_us}\n")
        os.utime(temporary, ns=(self._stamp_ns, self._stamp_ns))
        os.replace(temporary, self._clock_file)

    def close(self) -> None:
        self._client.close()


class serve:  # used like a function: ``with serve() as server`` / ``async with serve() as server``
    """Start ``oncebus serve`` on a free port for a test and stop it afterwards.

    ``mode="subprocess"`` (default: a crash in the broker cannot take the tests down) or ``"thread"``
    (fastest: an event loop in a thread of this process). ``data_dir``: where to keep the data (default:
    a temporary directory, removed at exit; a directory given is kept). ``config``: entities to create at
    start, an emulator-format config.json as a dict or a path. ``keys``: SAS keys ``{name: key}`` instead
    of the default one. ``test_clock``: let ``advance()`` move the broker's time.
    """

    def __init__(
        self,
        *,
        mode: Mode = "subprocess",
        data_dir: str | os.PathLike[str] | None = None,
        config: Config | None = None,
        host: str = "127.0.0.1",
        keys: Mapping[str, str] | None = None,
        test_clock: bool = True,
        start_timeout: float = 30.0,
        stop_timeout: float = 15.0,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: use one of {', '.join(MODES)}")
        self.mode: Mode = mode
        self.data_dir = None if data_dir is None else Path(data_dir)
        self.config = config
        self.host = host
        self.keys = dict(keys or {})
        self.test_clock = test_clock
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._work: Path | None = None
        self._broker: _Broker | None = None
        self.server: OncebusServer | None = None

    def start(self) -> OncebusServer:
        if self.server is not None:
            raise RuntimeError("this serve() is already running")
        self._work = Path(tempfile.mkdtemp(prefix="oncebus-test-"))
        try:
            data_dir = (self.data_dir or self._work / "data").resolve()
            clock_file = self._work / CLOCK_FILE if self.test_clock else None
            if clock_file is not None:
                clock_file.write_text("+0\n")
            config: Path | None = None
            if isinstance(self.config, Mapping):
                config = self._work / "config.json"
                config.write_text(config_file_text(self.config))
            elif self.config is not None:
                config = Path(self.config).resolve()
            launch = Launch(data_dir, self.host, config, self.keys, clock_file, self._work)
            self._broker = self._new_broker(launch)
            info = self._broker.start(self.start_timeout)
            self.server = OncebusServer(
                mode=self.mode, info=info, data_dir=data_dir, clock_file=clock_file, broker=self._broker
            )
            return self.server
        except BaseException:
            self.stop()
            raise

    def _new_broker(self, launch: Launch) -> _Broker:
        if self.mode == "thread":
            from oncebus.testing._thread import ThreadBroker

            return ThreadBroker(launch)
        return _SubprocessBroker(launch)

    def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        if self._broker is not None:
            self._broker.stop(self.stop_timeout)
            self._broker = None
        if self._work is not None:
            shutil.rmtree(self._work, ignore_errors=True)
            self._work = None

    def __enter__(self) -> OncebusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> OncebusServer:
        return await asyncio.to_thread(self.start)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.to_thread(self.stop)


__all__ = ["BrokerGoneError", "BrokerStartError", "Mode", "OncebusServer", "serve"]
