"""The serve process's doors: one AMQP server and one HTTP application behind sniffing listeners.

* the main port (``--port``, 5672): AMQP, AMQP over TLS, HTTPS and HTTP;
* the TLS port (``--tls-port``, 5671): TLS only (AMQP or HTTPS inside), for
  ``UseDevelopmentEmulator=false`` clients, which always go to 5671;
* the HTTP port (``--http-port``, 5300, like the emulator's): plain HTTP only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

from oncebus.amqp.server import AmqpServer
from oncebus.auth import connection_string, is_loopback
from oncebus.broker.namespace import Namespace
from oncebus.http.app import HttpApp
from oncebus.http.observe import AmqpTransportGauges, make_observe_app
from oncebus.http.server import ASGIApp, HttpLimits, HttpProtocol
from oncebus.server.certs import Certificates
from oncebus.server.listener import ALL_KINDS, HTTP, TLS, Doors, Listener


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
        return "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host

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
) -> Front:
    """Bind every listener (all or none: a port in use fails the start) and start accepting."""
    if not keys:
        raise ValueError("give at least one SAS key (name -> key)")
    amqp = AmqpServer(namespace, keys)
    if mount is None:  # /metrics and the dashboard (oncebus.http.observe)
        mount = make_observe_app(namespace, transport=AmqpTransportGauges(amqp))
    app = HttpApp(namespace, keys, mounted=mount, observe_needs_key=not is_loopback(host))  # beyond loopback: a key
    context = certificates.server_context()
    connections: set[HttpProtocol] = set()
    limits = HttpLimits()

    def http(scheme: str) -> HttpProtocol:
        return HttpProtocol(app, scheme=scheme, limits=limits, connections=connections)

    doors = Doors(amqp=amqp.connection_protocol, http=http, tls=context)
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
    return Front(amqp, app, main, tls, plain, certificates, host, connections)
