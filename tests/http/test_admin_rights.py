"""The administration API's tokens: scoped to the URL requested (as the JavaScript admin client signs them),
Manage right required; keys from a file and from ONCEBUS_SAS_KEYS; /metrics and the dashboard beyond loopback.

Every request goes to ``oncebus serve`` over plain HTTP with ``requests`` or through the real
``ServiceBusAdministrationClient``.
"""

from __future__ import annotations

import base64
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from azure.core.exceptions import ClientAuthenticationError, HttpResponseError
from azure.servicebus.management import ServiceBusAdministrationClient

from oncebus.auth import make_token
from tests.http.conftest import Served, start_server

KEYS_FILE = """# name[:rights]=key
RootManageSharedAccessKey=root-secret
sender:Send=send-secret
listener:Listen=listen-secret
"""
SECRETS = {
    "RootManageSharedAccessKey": "root-secret",
    "sender": "send-secret",
    "listener": "listen-secret",
    "envadmin": "env-secret",
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    base = tmp_path_factory.mktemp("admin-rights")
    (base / "keys").write_text(KEYS_FILE)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ONCEBUS_SAS_KEYS", "envadmin:Manage=env-secret")
        server = start_server(base / "data", "--keys-file", str(base / "keys"))
    yield server
    server.stop()


def url(served: Served, path: str) -> str:
    return f"http://127.0.0.1:{served.http_port}/{path}"


def auth(served: Served, resource: str, key_name: str = "RootManageSharedAccessKey", **kw: object) -> dict[str, str]:
    """A token whose ``sr`` is ``resource`` (a path below http://127.0.0.1:port/, or a full URL)."""
    sr = resource if "://" in resource else url(served, resource)
    expiry = int(kw.get("expiry", int(time.time()) + 600))  # type: ignore[call-overload]
    return {"Authorization": make_token(sr, key_name, SECRETS[key_name], expiry)}


def put_queue(served: Served, name: str) -> None:
    body = (
        '<entry xmlns="http://www.w3.org/2005/Atom"><content type="application/xml">'
        '<QueueDescription xmlns="http://schemas.microsoft.com/netservices/2010/10/servicebus/connect"/>'
        "</content></entry>"
    )
    reply = requests.put(url(served, name), data=body, headers=auth(served, ""), timeout=10)
    assert reply.status_code in (200, 201), reply.text


@pytest.fixture(scope="module")
def entities(served: Served) -> None:
    with admin(served, "RootManageSharedAccessKey") as client:
        for name in ("q", "q2"):
            client.create_queue(name)
        client.create_topic("t")
        client.create_subscription("t", "s")
        client.create_rule("t", "s", "r")


def admin(served: Served, key_name: str) -> ServiceBusAdministrationClient:
    """The real admin client (HTTPS on the main port, trusting the server's CA) signing with ``key_name``."""
    text = (
        f"Endpoint=sb://127.0.0.1:{served.port};SharedAccessKeyName={key_name};"
        f"SharedAccessKey={SECRETS[key_name]};UseDevelopmentEmulator=true"
    )
    return ServiceBusAdministrationClient.from_connection_string(text, connection_verify=served.ca_file)


# --- the URL used is what the token must cover ---------------------------------------------------------
@pytest.mark.parametrize(
    ("resource", "path"),
    [
        ("$Resources/Queues", "$Resources/Queues"),  # what the JavaScript admin client signs for listQueues
        ("$Resources/Topics", "$Resources/Topics"),
        ("t/Subscriptions", "t/Subscriptions"),
        ("t/subscriptions/s/rules/r", "t/Subscriptions/s/Rules/r"),  # getRule
        ("t/Subscriptions/s/Rules", "t/Subscriptions/s/Rules"),  # listRules
        ("", "$namespaceinfo"),  # the namespace root covers everything (getNamespaceProperties)
        ("q", "q"),
        ("t", "t/Subscriptions/s"),
        ("%24Resources%2FQueues", "$Resources/Queues"),  # URL-encoded
    ],
)
def test_a_token_for_the_url_or_a_parent_is_accepted(served: Served, entities: None, resource: str, path: str) -> None:
    reply = requests.get(url(served, path), headers=auth(served, resource), timeout=10)
    assert reply.status_code == 200, reply.text


@pytest.mark.parametrize(
    ("resource", "path", "why"),
    [
        ("q", "q2", "does not cover 'q2'"),  # a sibling with a common prefix
        ("q2", "q", "does not cover 'q'"),  # another entity
        ("t/subscriptions/s/rules/r", "t/Subscriptions/s", "does not cover"),  # below the resource asked for
        ("$Resources/Queues", "$Resources/Topics", "does not cover"),
        ("https://elsewhere.example/", "q", "elsewhere.example"),  # another host
    ],
)
def test_a_token_for_something_else_is_refused(
    served: Served, entities: None, resource: str, path: str, why: str
) -> None:
    reply = requests.get(url(served, path), headers=auth(served, resource), timeout=10)
    assert reply.status_code == 401 and why in reply.text, reply.text


def test_an_expiry_past_year_9999_is_a_401_not_a_500(served: Served) -> None:
    reply = requests.get(url(served, "$Resources/Queues"), headers=auth(served, "", expiry=10**400), timeout=10)
    assert reply.status_code == 401 and "9999" in reply.text, reply.text


# --- the Manage right ---------------------------------------------------------------------------------
@pytest.mark.parametrize("key_name", ["sender", "listener"])
def test_keys_without_manage_are_refused_naming_the_right(served: Served, entities: None, key_name: str) -> None:
    reply = requests.get(url(served, "q"), headers=auth(served, "", key_name), timeout=10)
    assert reply.status_code == 401
    assert "'Manage' claim(s) are required to perform this operation" in reply.text
    with admin(served, key_name) as client:
        with pytest.raises((ClientAuthenticationError, HttpResponseError)) as refused:
            client.create_queue(f"by-{key_name}")
        assert "Manage" in str(refused.value)
        with pytest.raises((ClientAuthenticationError, HttpResponseError)):
            list(client.list_queues())


def test_keys_from_the_file_and_the_environment_variable_manage(served: Served, entities: None) -> None:
    for key_name in ("RootManageSharedAccessKey", "envadmin"):
        with admin(served, key_name) as client:
            assert {"q", "q2"} <= {queue.name for queue in client.list_queues()}
            assert client.get_rule("t", "s", "r").name == "r"
    # the emulator's default key is not one of this server's keys
    default = {"Authorization": make_token(url(served, ""), "RootManageSharedAccessKey", "SAS_KEY_VALUE", 2**31)}
    assert requests.get(url(served, "q"), headers=default, timeout=10).status_code == 401


def test_keys_from_a_file_do_not_show_in_the_process_list(served: Served) -> None:
    cmdline = Path(f"/proc/{served.process.pid}/cmdline").read_bytes()
    assert b"--keys-file" in cmdline
    assert not any(secret.encode() in cmdline for secret in SECRETS.values())


# --- serving beyond loopback ----------------------------------------------------------------------------
def _serve_command(data_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-c",
        "import sys; from oncebus.cli import main; sys.exit(main())",
        "--data-dir",
        str(data_dir),
        "serve",
        "--port",
        "0",
        *extra,
    ]


def test_the_public_default_key_beyond_loopback_is_refused_with_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        _serve_command(tmp_path / "data", "--host", "0.0.0.0"), capture_output=True, text=True, timeout=30
    )
    assert result.returncode != 0
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "public" in lines[0] and "--allow-default-key" in lines[0], lines


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """Listening on every interface, with the default key allowed explicitly plus a Listen-only key."""
    base = tmp_path_factory.mktemp("wide")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ONCEBUS_SAS_KEYS", "listener:Listen=listen-secret;RootManageSharedAccessKey=SAS_KEY_VALUE")
        server = start_server(base / "data", "--host", "0.0.0.0", "--allow-default-key")
    yield server
    server.stop()


def _basic(name: str, key: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{name}:{key}".encode()).decode()}


@pytest.mark.parametrize("path", ["metrics", "", "dashboard", "api/dashboard"])
def test_metrics_and_dashboard_beyond_loopback_need_a_manage_key(wide: Served, path: str) -> None:
    where = f"http://127.0.0.1:{wide.http_port}/{path}"
    refused = requests.get(where, timeout=10)
    assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Basic")
    listen_only = requests.get(where, headers=_basic("listener", "listen-secret"), timeout=10)
    assert listen_only.status_code == 401 and "'Manage'" in listen_only.text
    wrong = requests.get(where, headers=_basic("RootManageSharedAccessKey", "nope"), timeout=10)
    assert wrong.status_code == 401
    allowed = requests.get(where, headers=_basic("RootManageSharedAccessKey", "SAS_KEY_VALUE"), timeout=10)
    assert allowed.status_code != 401, allowed.text
    token = make_token(f"http://127.0.0.1:{wide.http_port}/", "RootManageSharedAccessKey", "SAS_KEY_VALUE", 2**31)
    assert requests.get(where, headers={"Authorization": token}, timeout=10).status_code != 401
    assert requests.get(f"http://127.0.0.1:{wide.http_port}/health", timeout=10).status_code == 200  # still open


def test_metrics_on_loopback_stay_open(served: Served) -> None:
    assert requests.get(url(served, "metrics"), timeout=10).status_code == 200
