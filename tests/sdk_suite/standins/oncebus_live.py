"""What the stand-ins know of the ``oncebus serve`` the SDK's tests run against (tests/sdk_suite/test_sdk_suite.py
starts it and passes it in ``ONCEBUS_SUITE_*`` environment variables).

The tests address their namespace as ``f"{servicebus_namespace.name}{SERVICEBUS_ENDPOINT_SUFFIX}"`` and the SDK
goes there as to Azure: AMQP over TLS on port 5671, HTTPS and AMQP over WebSockets on 443, the host name checked
against the server's certificate. Here that name is ``localhost`` (the certificate of ``oncebus serve`` names
it), and :func:`route` sends a connection to ``localhost`` on 5671 or 443 to the server's TLS port instead: the
SDK's code runs unchanged, TLS and its verification included (the server's CA is the only one trusted).

Each test gets a namespace of its own on the server (``RootManageSharedAccessKey@<name>``: the key name picks
it, docs/namespaces.md), made before the test and deleted after it, so the tests, which assume an empty
namespace (the administration tests clear it), can run side by side.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import urllib.request
import uuid
from typing import Any

HOST = "localhost"  # the namespace's host name as the tests see it
AZURE_TLS_PORTS = (5671, 443)  # AMQP over TLS; HTTPS and wss://: where the SDK goes for a namespace
ROOT_KEY_NAME = "RootManageSharedAccessKey"


def setting(name: str) -> str:
    value = os.environ.get(f"ONCEBUS_SUITE_{name}")
    if not value:
        raise RuntimeError(
            f"ONCEBUS_SUITE_{name} is not set: run these tests through tests/sdk_suite/test_sdk_suite.py"
        )
    return value


def tls_port() -> int:
    return int(setting("TLS_PORT"))


def key() -> str:
    return setting("KEY")


def ca_file() -> str:
    return setting("CA")


def rule_keys() -> dict[str, tuple[str, str]]:
    """Namespace-level keys with fewer rights, given to ``oncebus serve`` (``--key NAME:RIGHTS=KEY``):
    ``{"Listen": (name, key), ...}``, what ServiceBusNamespaceAuthorizationRulePreparer hands out."""
    return {rights: (name, value) for rights, (name, value) in json.loads(setting("RULE_KEYS")).items()}


# ------------------------------------------------------------------------------------------ the test's namespace
_namespace: str | None = None


def namespace() -> str:
    if _namespace is None:
        raise RuntimeError("no namespace: the suite's conftest.py makes one for each test")
    return _namespace


def key_name(base: str = ROOT_KEY_NAME) -> str:
    """A namespace key's name as it selects this test's namespace."""
    return f"{base}@{namespace()}"


def connection_string(base: str = ROOT_KEY_NAME, secret: str | None = None, entity: str | None = None) -> str:
    text = f"Endpoint=sb://{HOST}/;SharedAccessKeyName={key_name(base)};SharedAccessKey={secret or key()}"
    return text + (f";EntityPath={entity}" if entity else "")


def _namespaces_request(method: str, name: str) -> dict[str, Any]:
    basic = base64.b64encode(f"{ROOT_KEY_NAME}:{key()}".encode()).decode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{setting('HTTP_PORT')}/$namespaces/{name}",
        method=method,
        headers={"Authorization": f"Basic {basic}"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return dict(json.load(answer))


def open_namespace() -> str:
    global _namespace
    name = f"sdk-{uuid.uuid4().hex[:16]}"
    _namespaces_request("PUT", name)
    _namespace = name
    return name


def close_namespace() -> None:
    global _namespace
    if _namespace is not None:
        name, _namespace = _namespace, None
        _namespaces_request("DELETE", name)


def administration_client() -> Any:
    """The SDK's own administration client on this test's namespace (the preparers create entities with it)."""
    from azure.servicebus._base_handler import ServiceBusSharedKeyCredential
    from azure.servicebus.management import ServiceBusAdministrationClient

    return ServiceBusAdministrationClient(HOST, ServiceBusSharedKeyCredential(key_name(), key()))


# ------------------------------------------------------------------------------------------------ the routing
def route() -> None:
    """Send the SDK's connections to ``localhost`` on Azure's TLS ports to the server's TLS port, and trust the
    server's CA where the SDK reads its CA bundle (``certifi.where()``; requests and aiohttp read
    ``REQUESTS_CA_BUNDLE`` and ``SSL_CERT_FILE``, which the runner sets)."""
    import certifi

    real_getaddrinfo = socket.getaddrinfo
    port = tls_port()

    def getaddrinfo(host: Any, service: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host.lower().rstrip(".") == HOST and _port(service) in AZURE_TLS_PORTS:
            return real_getaddrinfo("127.0.0.1", port, *args, **kwargs)
        return real_getaddrinfo(host, service, *args, **kwargs)

    socket.getaddrinfo = getaddrinfo
    bundle = ca_file()
    certifi.where = lambda: bundle


def _port(service: Any) -> int | None:
    try:
        return int(service)
    except (TypeError, ValueError):
        return None
