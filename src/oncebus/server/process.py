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
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oncebus import __version__
from oncebus.auth import DEFAULT_KEYS, KEYS_ENV, KeyRing, is_loopback, uses_public_key
from oncebus.broker import FileClock, Namespace, SystemClock
from oncebus.core.errors import InvalidArgumentError, OncebusError, StoreError, StoreWriteError
from oncebus.core.tiers import Tier, TierQuotas
from oncebus.http.server import ASGIApp
from oncebus.server import loop as event_loop
from oncebus.server.certs import ensure_certificates
from oncebus.server.control import ControlServer
from oncebus.server.datadir import DataDir
from oncebus.server.front import Front, client_host, open_front
from oncebus.server.namespaces import Namespaces
from oncebus.server.runtime import freeze_again, tune_gc
from oncebus.server.settings import Settings
from oncebus.store.postgres_url import open_store
from oncebus.store.sendlog import SendLogWriter


class ServeError(OncebusError):
    """The serve process could not start; ``busy`` when the data directory is in use."""

    condition = "amqp:internal-error"
    status = 500

    def __init__(self, message: str, *, busy: bool = False) -> None:
        super().__init__(message)
        self.busy = busy


DEFAULT_PORT, DEFAULT_TLS_PORT, DEFAULT_HTTP_PORT = 5672, 5671, 5300


@dataclass(frozen=True)
class ServeOptions:
    """What ``oncebus serve`` runs. Ports: 0 picks a free one; ``http_port``/``tls_port`` None means
    5300/5671 when ``port`` is the default 5672, else 0 (so ``--port 0`` alone never takes fixed ports);
    -1 turns that listener off."""

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    http_port: int | None = None
    tls_port: int | None = None
    keys: Mapping[str, str] | None = None  # a KeyRing gives keys rights; a plain mapping: all rights
    allow_default_key: bool = False  # serve beyond loopback with the emulator's public key anyway
    allow_faults: bool = False  # let faults be armed (oncebus.broker.faults) beyond loopback too
    config: str | None = None
    send_log: str | None = None
    clock_file: str | None = None  # tests only: time read from a file (ONCEBUS_CLOCK_FILE)
    tier: str | None = None  # standard or premium (None: $ONCEBUS_TIER, else standard); see oncebus.core.tiers
    mount: ASGIApp | None = None  # an ASGI app for /metrics, / and /dashboard* (see oncebus.http.app)
    tune_gc: bool = True  # tune the collector for a long-lived broker (not when serving in a test's process)
    store: str | None = None  # a postgresql:// URL (store/postgres_url.py); None: oncebus.db in the data directory
    cluster: bool = False  # one node of several on the PostgreSQL store (server/cluster.py)
    advertise: str | None = None  # the host other nodes reach this one at (cluster; default: --host, or its name)
    settings: Settings | None = None  # the ONCEBUS_* variables (None: read from the environment when run starts)

    def resolved_port(self, given: int | None, default: int) -> int:
        if given is not None:
            return given
        return default if self.port == DEFAULT_PORT else 0


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
    keys = KeyRing.of(options.keys if options.keys is not None else DEFAULT_KEYS)
    if not is_loopback(options.host) and uses_public_key(keys) and not options.allow_default_key:
        raise ServeError(
            f"refusing to serve on {options.host} with the emulator's default key (SAS_KEY_VALUE), which is public: "
            f"anyone who reaches the port could use it; give your own key (--keys-file, ${KEYS_ENV} or --key) "
            "or pass --allow-default-key"
        )
    try:
        settings = options.settings if options.settings is not None else Settings.from_environ()
        quotas = settings.quotas(tier=options.tier)
    except InvalidArgumentError as exc:  # SettingsError: one line naming the variable and what it allows
        raise ServeError(str(exc)) from exc
    topology = None
    if options.config:  # read and shape-checked before the data directory is touched
        from oncebus.server.topology import load_topology

        topology = load_topology(options.config)
    datadir = DataDir(options.data_dir)
    if not datadir.try_lock():
        pid = (datadir.read_server_info() or {}).get("pid") or datadir.owner_pid()
        raise ServeError(
            f"the data directory {datadir.path} is already in use by oncebus (pid {pid})"
            "; stop it or choose another directory with --data-dir",
            busy=True,
        )
    loop = asyncio.get_running_loop()
    stop = stop if stop is not None else asyncio.Event()
    try:
        stored_tier = datadir.read_tier()
        try:  # the tier chosen now (--tier, $ONCEBUS_TIER), else the one this data directory was last served with
            quotas = settings.quotas(tier=options.tier, stored=stored_tier)
            if stored_tier is not None and Tier.parse(stored_tier) is not quotas.tier:
                say(f"the tier changes from {Tier.parse(stored_tier).value} to {quotas.tier.value} (as asked)")
            datadir.write_tier(quotas.tier.value)
        except (InvalidArgumentError, OSError) as exc:
            raise ServeError(f"the data directory's tier ({datadir.tier_file}): {exc}") from exc
        if install_signal_handlers:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
        serving = _Serving(options, datadir, keys, quotas, settings, topology, stop, ready, say)
        if options.cluster:
            await _run_node(serving)
        else:
            started = time.monotonic()
            await serving.serve(open_store(options.store, datadir.store_path), started)
    finally:
        if install_signal_handlers:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
        datadir.unlock()
    return 0


class _Serving:
    """What one term of serving needs (a single node serves one term; a cluster's node one per leadership)."""

    def __init__(
        self,
        options: ServeOptions,
        datadir: DataDir,
        keys: KeyRing,
        quotas: TierQuotas,
        settings: Settings,
        topology: Any,
        stop: asyncio.Event,
        ready: Callable[[dict[str, Any]], None] | None,
        say: Callable[[str], None],
    ) -> None:
        self.options = options
        self.datadir = datadir
        self.keys = keys
        self.quotas = quotas
        self.settings = settings
        self.topology = topology
        self.stop = stop
        self._ready = ready
        self.say = say
        self.ports: dict[str, int] = {  # fixed once bound (a cluster's node keeps its ports whatever its role)
            "amqp": options.port,
            "tls": options.resolved_port(options.tls_port, DEFAULT_TLS_PORT),
            "http": options.resolved_port(options.http_port, DEFAULT_HTTP_PORT),
        }

    def ready(self, info: dict[str, Any]) -> None:
        ready, self._ready = self._ready, None  # once, whatever the roles that follow
        if ready is not None:
            ready(dict(info))

    def bound(self, info: dict[str, Any]) -> None:
        self.ports = {
            "amqp": int(info["amqp_port"]),
            "tls": -1 if info["tls_port"] is None else int(info["tls_port"]),
            "http": -1 if info["http_port"] is None else int(info["http_port"]),
        }

    async def serve(
        self,
        store: Any,
        started: float,
        *,
        deposed: asyncio.Event | None = None,
        announce: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        """Serve ``store`` until ``stop`` (or ``deposed``) is set; closes it."""
        options, datadir, say, stop = self.options, self.datadir, self.say, self.stop
        send_log = SendLogWriter(options.send_log) if options.send_log else None
        clock = FileClock(options.clock_file) if options.clock_file else SystemClock()
        try:
            namespace = await Namespace.open(  # the stored messages load while it serves
                store,
                clock,
                send_log=send_log,
                backlog_in_background=True,
                quotas=self.quotas,
                checkpoint_keys=self.settings.checkpoint_keys,
                checkpoint_seconds=self.settings.checkpoint_seconds,
            )
        except BaseException:
            store.close()
            if send_log is not None:
                send_log.close()
            raise
        keys = self.keys
        keys.attach_entity_rules(namespace.authorization_rules)  # tokens signed by an entity's own rules
        if self.topology is not None:
            from oncebus.server.topology import apply_topology

            try:
                await apply_topology(namespace, self.topology)  # all or nothing
            except BaseException:
                with contextlib.suppress(OncebusError):
                    await namespace.close()
                store.close()
                if send_log is not None:
                    send_log.close()
                raise
        if not is_loopback(options.host) and not options.allow_faults:
            namespace.faults.refusal = (
                f"faults cannot be armed on a broker serving beyond loopback ({options.host}): a fault is a failure "
                "on cue for every client; start oncebus serve with --allow-faults to allow it"
            )
        if options.tune_gc:
            tune_gc()
        namespaces = Namespaces(namespace, keys, quotas=self.quotas, max_namespaces=self.settings.max_namespaces)
        control = ControlServer(namespace, namespaces=namespaces)
        await control.start()
        info: dict[str, Any] = {
            "pid": os.getpid(),
            "control_port": control.port,
            "control_token": control.token,
            "data_dir": str(datadir.path),
            "event_loop": event_loop.running(),  # uvloop, or asyncio (ONCEBUS_EVENT_LOOP; server/loop.py)
        }
        if options.cluster:
            info["role"] = "leader"
        front: Front | None = None
        timers: asyncio.Task[None] | None = None
        settled: asyncio.Task[None] | None = None
        quotas = self.quotas
        try:
            certificates = ensure_certificates(datadir.path, options.host)
            try:
                front = await open_front(
                    namespace,
                    host=options.host,
                    port=self.ports["amqp"],
                    tls_port=self.ports["tls"],
                    http_port=self.ports["http"],
                    keys=keys,
                    certificates=certificates,
                    mount=options.mount,
                    namespaces=namespaces,
                    settings=self.settings,
                )
            except OSError as exc:
                raise ServeError(f"cannot listen: {exc}") from exc
            info.update(front.info())
            self.bound(info)
            if announce is not None:
                await asyncio.to_thread(announce, info)
            timers = asyncio.create_task(namespace.run_timers(0.05 if options.clock_file else 0.5))
            settled = asyncio.create_task(_tune_gc_when_loaded(namespace, options.tune_gc))
            datadir.write_server_info(info)
            where = f" with its store on {store.display}" if hasattr(store, "display") else ""  # PostgreSQL
            units = f", {quotas.messaging_units} messaging unit{'s' if quotas.messaging_units > 1 else ''}"
            tier = f"{quotas.tier.value} tier{units if quotas.premium else ''}"
            lead = ", leading its cluster" if options.cluster else ""
            say(
                f"oncebus {__version__} serving {datadir.path}{where}{lead} ({tier}; started in "
                f"{time.monotonic() - started:.2f} s)"
            )
            say(f"AMQP on {info['amqp_host']}:{info['amqp_port']} (also AMQP over TLS, HTTPS and HTTP on this port)")
            if info["tls_port"] is not None:
                say(f"TLS on {info['amqp_host']}:{info['tls_port']} (AMQP over TLS and HTTPS)")
            if info["http_port"] is not None:
                say(
                    f"HTTP on {info['amqp_host']}:{info['http_port']} (administration API, /health, /metrics, "
                    "dashboard)"
                )
            say(f"connection string: {info['connection_string']}")
            say(
                f"CA certificate: {info['ca_file']} "
                "(trust it with connection_verify=<this file> or REQUESTS_CA_BUNDLE=<this file>)"
            )
            self.ready(info)
            say("ready")
            waits = [asyncio.ensure_future(stop.wait())]
            if deposed is not None:
                waits.append(asyncio.ensure_future(deposed.wait()))
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiting in waits:
                    waiting.cancel()
        finally:
            if timers is not None:
                timers.cancel()
            if settled is not None:
                settled.cancel()
            if front is not None:
                await front.close()
            await control.close()
            await namespaces.close()
            with contextlib.suppress(OncebusError):
                await namespace.close()
            store.close()
            if send_log is not None:
                send_log.close()


async def _run_node(serving: _Serving) -> None:
    """A node of a cluster: lead while this node holds the store's node lock, else forward to the node that does
    (``server/cluster.py``), until ``stop``."""
    from oncebus.server.cluster import Leader, LeaderWatch, Relay, run_in_thread

    options, say, stop = serving.options, serving.say, serving.stop
    if not options.store:
        raise ServeError(
            "--cluster needs the PostgreSQL store, which the nodes share: give --store postgresql://... "
            "(or $ONCEBUS_STORE)"
        )
    try:
        from oncebus.store.postgres import LeaderReader, LeadershipCancelled, PostgresStore
    except ImportError as exc:
        raise ServeError(
            f"the PostgreSQL store needs the psycopg driver ({exc}): install it with pip install 'oncebus[postgresql]'"
        ) from None
    url = options.store
    node = f"{socket.gethostname()}:{os.getpid()}"
    advertise = options.advertise or (options.host if options.host not in ("0.0.0.0", "::", "") else socket.getfqdn())
    reader = LeaderReader(url)

    def read_leader() -> Leader | None:
        found = reader.read()
        return None if found is None else Leader.of(found[0], found[1])

    watch = LeaderWatch(read_leader)
    watching = False
    loop = asyncio.get_running_loop()
    stopping = asyncio.ensure_future(stop.wait())
    try:
        while not stop.is_set():
            cancelled = threading.Event()
            started = time.monotonic()
            waiting = run_in_thread(cancelled, lambda event: PostgresStore(url, leadership=event))
            await asyncio.wait({waiting, stopping}, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
            relay: Relay | None = None
            if not waiting.done() and not stop.is_set():  # another node leads: forward to it meanwhile
                if not watching:
                    watch.start()
                    watching = True
                relay = Relay(options.host, watch)
                try:
                    serving.ports = {k: -1 if v is None else v for k, v in (await relay.start(serving.ports)).items()}
                except OSError as exc:
                    cancelled.set()
                    raise ServeError(f"cannot listen: {exc}") from exc
                _standby_lines(serving, await watch.wait_leader(2.0), url)
                await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if stop.is_set():
                cancelled.set()
                with contextlib.suppress(BaseException):
                    store = await waiting
                    store.close()  # taken as the node stopped: let go at once
                if relay is not None:
                    await relay.close()
                return
            try:
                store = waiting.result()
            except LeadershipCancelled:
                return
            if relay is not None:
                await relay.close()
                started = store.led_since  # the start of its term, not of its wait
                say("this node leads the cluster now (the leader before it stopped)")
            deposed = asyncio.Event()
            store.on_deposed = lambda _reason, event=deposed: loop.call_soon_threadsafe(event.set)
            if store.deposed is not None:
                deposed.set()

            def announce(info: dict[str, Any], store: PostgresStore = store) -> None:
                address = {"host": advertise, "amqp": info["amqp_port"], "tls": info["tls_port"]}
                address["http"] = info["http_port"]
                store.announce(node, address)

            try:
                await serving.serve(store, started, deposed=deposed, announce=announce)
            except (StoreError, StoreWriteError) as exc:  # the database went away as this term started: wait again
                if store.deposed is None:  # a refusal of what the database holds, not its session lost
                    raise
                say(f"this node could not start its term as the cluster's leader ({exc}): it waits to lead again")
                await asyncio.sleep(1.0)
                continue
            if deposed.is_set() and not stop.is_set():
                say(f"this node is no longer the cluster's leader ({store.deposed}): it forwards to the next one")
    finally:
        stopping.cancel()
        await watch.close()
        await asyncio.to_thread(reader.close)


def _standby_lines(serving: _Serving, leader: Any, url: str) -> None:
    """A standby's start-up lines and server info (printed at each term as a standby)."""
    from oncebus.auth import connection_string
    from oncebus.store.postgres import display_url

    options, ports, say = serving.options, serving.ports, serving.say
    host = client_host(options.host)
    key = serving.keys.printed()
    info: dict[str, Any] = {
        "pid": os.getpid(),
        "role": "standby",
        "data_dir": str(serving.datadir.path),
        "amqp_host": options.host,
        "amqp_port": ports["amqp"],
        "tls_port": None if ports["tls"] < 0 else ports["tls"],
        "http_port": None if ports["http"] < 0 else ports["http"],
        "connection_string": connection_string(host, ports["amqp"], key.name, key.key),
        "leader": None if leader is None else leader.where(),
    }
    serving.datadir.write_server_info(info)
    who = "no node leads yet" if leader is None else f"the leader is {leader.where()}"
    say(
        f"oncebus {__version__} on {serving.datadir.path}: a standby of the cluster on {display_url(url)} ({who}); "
        "it forwards its clients to the leader and takes over if the leader stops"
    )
    say(f"AMQP on {options.host}:{ports['amqp']} (forwarded to the leader, as are its other ports)")
    if info["tls_port"] is not None:
        say(f"TLS on {options.host}:{info['tls_port']}")
    if info["http_port"] is not None:
        say(f"HTTP on {options.host}:{info['http_port']}")
    say(f"connection string: {info['connection_string']}")
    serving.ready(info)
    say("ready")


async def _tune_gc_when_loaded(namespace: Namespace, tune: bool) -> None:
    """Once the stored messages are in memory (restored after ready), the collector leaves them alone too."""
    with contextlib.suppress(OncebusError):
        await namespace.backlog_restored()
    if tune:
        freeze_again()
