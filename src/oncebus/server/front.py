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
import os
import resource
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from oncebus.amqp.server import AmqpServer
from oncebus.amqp.websocket import WEBSOCKET_PATH
from oncebus.auth import connection_string, is_loopback
from oncebus.broker import Namespace
from oncebus.core.errors import InvalidArgumentError
from oncebus.http.app import HttpApp
from oncebus.http.observe import make_observe_app
from oncebus.http.server import AllowedHosts, ASGIApp, HttpLimits, HttpProtocol, Upgrade, host_name
from oncebus.server.certs import Certificates
from oncebus.server.listener import ALL_KINDS, HTTP, TLS, Doors, Listener
from oncebus.server.namespaces import Namespaces


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
T = TypeVar("T")


def from_env(defaults: T, prefix: str, environ: Mapping[str, str] | None = None) -> T:
    """``defaults`` (a dataclass) with its number fields overridden by ``<prefix><FIELD>`` variables, e.g.
    ``ONCEBUS_LISTEN_MAX_PENDING=512`` or ``ONCEBUS_HTTP_MAX_CONNECTIONS=64``; a bad value is an error naming it."""
    environ = os.environ if environ is None else environ
    changes: dict[str, int | float] = {}
    for f in dataclasses.fields(defaults):  # type: ignore[arg-type]
        value = getattr(defaults, f.name)
        text = environ.get(prefix + f.name.upper())
        if text is None or not isinstance(value, int | float) or isinstance(value, bool):
            continue
        kind = type(value)
        try:
            number = kind(text)
        except ValueError:
            raise InvalidArgumentError(
                f"{prefix}{f.name.upper()}={text!r} is not a{'' if kind is int else ' decimal'} number"
            ) from None
        if not number > 0:
            raise InvalidArgumentError(f"{prefix}{f.name.upper()}={text!r} must be positive")
        changes[f.name] = number
    return dataclasses.replace(defaults, **changes)  # type: ignore[type-var]


def allowed_hosts(host: str, environ: Mapping[str, str] | None = None) -> AllowedHosts:
    """The names the HTTP doors answer to: loopback names and IPs (always), ``--host``, this machine's name, and
    ``ONCEBUS_HTTP_ALLOWED_HOSTS`` (comma-separated; ``.example.org`` a domain, ``*`` every name)."""
    environ = os.environ if environ is None else environ
    names = {host_name(host.encode()), socket.gethostname().lower()}
    names.update(n.strip().lower() for n in environ.get(ALLOWED_HOSTS_ENV, "").split(","))
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
) -> Front:
    """Bind every listener (all or none: a port in use fails the start) and start accepting."""
    if not keys:
        raise ValueError("give at least one SAS key (name -> key)")
    raise_file_limit()
    amqp = AmqpServer(namespace, keys)
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
    limits = from_env(HttpLimits(), "ONCEBUS_HTTP_")
    hosts = allowed_hosts(host)

    def websocket(upgrade: Upgrade) -> asyncio.Protocol:
        return amqp.websocket_protocol(upgrade.target, upgrade.headers, upgrade.early_data)

    upgrades = {WEBSOCKET_PATH: websocket}  # AMQP over WebSockets, on every port that speaks HTTP

    def http(scheme: str) -> HttpProtocol:
        return HttpProtocol(app, scheme=scheme, limits=limits, connections=connections, hosts=hosts, upgrades=upgrades)

    doors = from_env(Doors(amqp=amqp.connection_protocol, http=http, tls=context), "ONCEBUS_LISTEN_")
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
