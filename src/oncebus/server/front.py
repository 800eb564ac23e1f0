"""The serve process's doors: one AMQP server and one HTTP application behind sniffing listeners.

* the main port (``--port``, 5672): AMQP, AMQP over TLS, HTTPS and HTTP;
* the TLS port (``--tls-port``, 5671): TLS only (AMQP or HTTPS inside), for
  ``UseDevelopmentEmulator=false`` clients, which always go to 5671;
* the HTTP port (``--http-port``, 5300, like the emulator's): plain HTTP only.

Wherever HTTP is spoken (HTTP or HTTPS, on any of the three), a WebSocket upgrade
on ``/$servicebus/websocket`` becomes an AMQP connection (``oncebus.amqp.websocket``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import resource
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from oncebus.amqp.server import AmqpServer
from oncebus.amqp.websocket import WEBSOCKET_PATH
from oncebus.auth import connection_string, is_loopback
from oncebus.broker import Namespace
from oncebus.http.app import HttpApp
from oncebus.http.observe import make_observe_app
from oncebus.http.server import AllowedHosts, ASGIApp, HttpProtocol, Upgrade, host_name
from oncebus.server.certs import Certificates
from oncebus.server.listener import ALL_KINDS, HTTP, TLS, Doors, Listener
from oncebus.server.namespaces import Namespaces
from oncebus.server.settings import Settings


def client_host(host: str) -> str:
    """The address a client on this machine reaches ``host`` at (a wildcard address: loopback)."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


@dataclass
class Front:
    amqp: AmqpServer
    app: HttpApp
    listener: Listener
    tls_listener: Listener | None
    http_listener: Listener | None
    certificates: Certificates
    host: str
    http_connections: set[HttpProtocol] = field(default_factory=set)

    @property
    def client_host(self) -> str:
        return client_host(self.host)

    @property
    def connection_string(self) -> str:
        key = self.amqp.keys.printed()  # a key with Manage when there is one
        return connection_string(self.client_host, self.listener.port, key.name, key.key)

    def info(self) -> dict[str, object]:
        return {
            "amqp_host": self.host,
            "amqp_port": self.listener.port,
            "tls_port": None if self.tls_listener is None else self.tls_listener.port,
            "http_port": None if self.http_listener is None else self.http_listener.port,
            "ca_file": str(self.certificates.ca_file),
            "connection_string": self.connection_string,
        }

    async def close(self) -> None:
        await asyncio.gather(
            *(x.close() for x in (self.listener, self.tls_listener, self.http_listener) if x is not None)
        )
        for conn in list(self.http_connections):
            conn.close()
        await self.amqp.close()


ALLOWED_HOSTS_ENV = "ONCEBUS_HTTP_ALLOWED_HOSTS"


def allowed_hosts(host: str, added: Iterable[str] = ()) -> AllowedHosts:
    """The names the HTTP doors answer to: loopback names and IPs (always), ``--host``, this machine's name, and
    ``added`` (``ONCEBUS_HTTP_ALLOWED_HOSTS``: ``.example.org`` a domain, ``*`` every name)."""
    names = {host_name(host.encode()), socket.gethostname().lower()}
    names.update(n.strip().lower() for n in added)
    return AllowedHosts(frozenset(n for n in names if n))


def raise_file_limit(wanted: int = 65536) -> int:
    """Raise this process's soft limit on open files toward its hard limit (at most ``wanted``): every bound on
    connections (AMQP, HTTP, undecided) fits under it, so a flood meets those bounds, not ``EMFILE``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


async def open_front(
    namespace: Namespace,
    *,
    host: str,
    port: int,
    tls_port: int,
    http_port: int,
    keys: Mapping[str, str],
    certificates: Certificates,
    mount: ASGIApp | None = None,
    namespaces: Namespaces | None = None,
    settings: Settings | None = None,
) -> Front:
    """Bind every listener (all or none: a port in use fails the start) and start accepting, with the bounds
    ``settings`` gives (None: the defaults)."""
    if not keys:
        raise ValueError("give at least one SAS key (name -> key)")
    settings = settings if settings is not None else Settings()
    raise_file_limit()
    amqp = AmqpServer(namespace, keys, limits=settings.amqp)
    if mount is None:  # /metrics and the dashboard (oncebus.http.observe)
        mount = make_observe_app(namespace)  # with the gauges the AMQP server reports to the namespace
    app = HttpApp(  # beyond loopback: /metrics and the dashboard need a key
        namespace, keys, mounted=mount, observe_needs_key=not is_loopback(host), namespaces=namespaces
    )
    if namespaces is not None:  # key name "<key>@<name>": a namespace created at run time
        amqp.namespaces = namespaces
        namespaces.on_delete(amqp.namespace_deleted)
    context = certificates.server_context()
    connections: set[HttpProtocol] = set()
    limits = settings.http
    hosts = allowed_hosts(host, settings.allowed_hosts)

    def websocket(upgrade: Upgrade) -> asyncio.Protocol:
        return amqp.websocket_protocol(upgrade.target, upgrade.headers, upgrade.early_data)

    upgrades = {WEBSOCKET_PATH: websocket}  # AMQP over WebSockets, on every port that speaks HTTP

    def http(scheme: str) -> HttpProtocol:
        return HttpProtocol(app, scheme=scheme, limits=limits, connections=connections, hosts=hosts, upgrades=upgrades)

    doors = dataclasses.replace(
        Doors(amqp=amqp.connection_protocol, http=http, tls=context),
        **settings.listen,  # type: ignore[arg-type]
    )
    opened: list[Listener] = []
    try:
        main = Listener.open(host, port, doors, ALL_KINDS)
        opened.append(main)
        tls = Listener.open(host, tls_port, doors, frozenset({TLS})) if tls_port >= 0 else None
        if tls is not None:
            opened.append(tls)
        plain = Listener.open(host, http_port, doors, frozenset({HTTP})) if http_port >= 0 else None
        if plain is not None:
            opened.append(plain)
    except BaseException:
        for listener in opened:
            await listener.close()
        raise
    amqp.host, amqp.port = host, main.port
    for listener in opened:
        listener.start()
    front = Front(amqp, app, main, tls, plain, certificates, host, connections)
    if namespaces is not None:
        namespaces.connection_string = front.connection_string
    return front
