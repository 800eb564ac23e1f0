"""What a token reaches, door by door, when entity names hold '/': an entity's own shared access rule grants on
that entity alone (with its sub-queues, its subscriptions and their rules, its ``$management`` node), never on
another entity whose name starts with it (queue ``a``'s rule does not reach queue ``a/b``), while a namespace
key's token for ``sb://host/a`` covers everything under ``a``, as Azure's URI-prefix scope does.

One table: every token below is tried on every door (CBS put-token, AMQP send and receive links, ``$management``
peek, the REST data plane, the administration API, ``/$faults``, ``/$namespaces``), and the places it lets in
must be exactly the ones listed for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import requests

from oncebus.auth import DEFAULT_KEY, DEFAULT_KEY_NAME, make_token
from oncebus.testing import OncebusServer, serve
from tests.amqp.test_token_scope import HOST, PEEK, Client

ROOT = (DEFAULT_KEY_NAME, DEFAULT_KEY)
TENANT_A = ("tenantA", "tenant-a-key")  # a rule of queue a
TENANT_T = ("tenantT", "tenant-t-key")  # a rule of topic t
MANAGE = ["Manage", "Send", "Listen"]
QUEUE_XML = (
    '<entry xmlns="http://www.w3.org/2005/Atom"><content type="application/xml"><QueueDescription '
    'xmlns="http://schemas.microsoft.com/netservices/2010/10/servicebus/connect"/></content></entry>'
)

# (door, address) in the order they are tried; deletions last
CASES: list[tuple[str, str]] = [
    *[("put-token", a) for a in ["a", "a/b", "a/b/c", "ab", "t", "t/subscriptions/s", "t/x"]],
    *[("amqp-send", a) for a in ["a", "a/b", "a/b/c", "ab", "t", "t/x"]],
    *[
        ("amqp-receive", a)
        for a in [
            "a",
            "a/$deadletterqueue",
            "a/b",
            "a/b/$deadletterqueue",
            "ab",
            "t/subscriptions/s",
            "t/subscriptions/s/$deadletterqueue",
            "t/x",
        ]
    ],
    *[("peek", f"{a}/$management") for a in ["a", "a/b", "ab", "t/subscriptions/s", "t/x"]],
    *[("rest-send", a) for a in ["a", "a/b", "a/b/c", "ab", "t", "t/x"]],
    *[("rest-receive-and-delete", a) for a in ["a", "a/b", "ab", "t/subscriptions/s", "t/x"]],
    *[("admin-get", a) for a in ["a", "a/b", "a/b/c", "ab", "t", "t/subscriptions/s", "t/x"]],
    ("admin-create", "a/evil"),
    ("admin-create", "t/evil"),
    ("faults", "$faults"),
    ("namespaces", "$namespaces"),
    ("admin-delete", "a/evil"),
    ("admin-delete", "a/b"),
]
ADDRESSES = {address for _, address in CASES}

A_OWN = {"a", "a/$deadletterqueue", "a/$management"}
T_OWN = {"t", "t/subscriptions/s", "t/subscriptions/s/$deadletterqueue", "t/subscriptions/s/$management"}
UNDER_A = A_OWN | {"a/b", "a/b/c", "a/b/$deadletterqueue", "a/b/$management", "a/evil"}


@dataclass(frozen=True)
class Token:
    """A key, and the resource its tokens are signed for (None: each request's own address, as the SDKs sign)."""

    key: tuple[str, str]
    scope: str | None
    reaches: set[str]  # the addresses of CASES it must let in; every other one must refuse it


TOKENS = {
    "queue a's rule, for a": Token(TENANT_A, "a", A_OWN),
    "queue a's rule, for each address": Token(TENANT_A, None, A_OWN),
    "topic t's rule, for t": Token(TENANT_T, "t", T_OWN),
    "topic t's rule, for each address": Token(TENANT_T, None, T_OWN),
    "a namespace key, for a": Token(ROOT, "a", UNDER_A),
    "a namespace key, for the namespace": Token(ROOT, "", ADDRESSES),
}


@pytest.fixture(scope="module")
def broker() -> Iterator[OncebusServer]:
    with serve(mode="thread") as server:
        yield server


@pytest.fixture
def doors(broker: OncebusServer) -> Iterator[Doors]:
    broker.reset()
    broker.create_queue("a", authorization_rules=[_rule(TENANT_A)])
    for name in ("a/b", "a/b/c", "ab", "t/x"):
        broker.create_queue(name)
    broker.create_topic("t", authorization_rules=[_rule(TENANT_T)])
    broker.create_subscription("t", "s")
    with requests.Session() as http:
        tried = Doors(broker, http)
        assert tried.http("POST", "a/b/messages", ROOT, "", data=b"for a/b") == 201  # something to take
        yield tried


def _rule(key: tuple[str, str]) -> dict[str, object]:
    return {"key_name": key[0], "primary_key": key[1], "secondary_key": key[1] + "-2", "rights": MANAGE}


class Doors:
    """Each door tried with one token: True when it let the request in, False when it refused it as
    unauthorized; anything else (an unexpected status) fails the test."""

    def __init__(self, broker: OncebusServer, http: requests.Session) -> None:
        self.broker = broker
        self.session = http

    # --- HTTP ------------------------------------------------------------------------------------
    def http(self, method: str, path: str, key: tuple[str, str], scope: str, data: bytes | None = None) -> int:
        base = f"http://127.0.0.1:{self.broker.http_port}"
        token = make_token(f"{base}/{scope}", key[0], key[1], int(time.time()) + 600)
        reply = self.session.request(method, f"{base}/{path}", data=data, headers={"Authorization": token}, timeout=10)
        return reply.status_code

    def _http_door(self, method: str, path: str, token: Token, address: str, data: bytes | None = None) -> bool:
        status = self.http(method, path, token.key, address if token.scope is None else token.scope, data)
        assert status in (200, 201, 204, 401), f"{method} /{path}: {status}"
        return status != 401

    def rest_send(self, token: Token, address: str) -> bool:
        return self._http_door("POST", f"{address}/messages", token, address, b"hello")

    def rest_receive_and_delete(self, token: Token, address: str) -> bool:
        return self._http_door("DELETE", f"{address}/messages/head?timeout=0", token, address)

    def admin_get(self, token: Token, address: str) -> bool:
        return self._http_door("GET", address, token, address)

    def admin_create(self, token: Token, address: str) -> bool:
        return self._http_door("PUT", address, token, address, QUEUE_XML.encode())

    def admin_delete(self, token: Token, address: str) -> bool:
        return self._http_door("DELETE", address, token, address)

    def faults(self, token: Token, address: str) -> bool:
        return self._http_door("GET", address, token, address)

    def namespaces(self, token: Token, address: str) -> bool:
        return self._http_door("GET", address, token, address)

    # --- AMQP (a fresh connection each: the grants one connection holds stay apart) -----------------
    @contextmanager
    def _amqp(self, token: Token, audience: str) -> Iterator[Client]:
        with Client(self.broker.port) as client:
            client.handshake()
            self._put(client, token, audience)
            yield client

    def _uri(self, address: str) -> str:
        return f"sb://{HOST}:{self.broker.port}/{address}"

    def put_token(self, token: Token, address: str) -> bool:
        with Client(self.broker.port) as client:
            client.handshake()
            status, _ = self._put(client, token, address)
        return status == 202

    def _put(self, client: Client, token: Token, audience: str) -> tuple[int, str]:
        scope = audience if token.scope is None else token.scope
        status, why = client.token(scope, key_name=token.key[0], key=token.key[1], audience=self._uri(audience))
        assert status in (202, 401), why
        return status, why

    def _attach(self, token: Token, address: str, *, sender: bool) -> bool:
        # the token is put for the audience it is signed for (a client may well do so); the link is the door
        audience = address if token.scope is None else token.scope
        with self._amqp(token, audience) as client:
            accepted, why = client.attach(address, sender=sender)
        assert accepted or "nauthorized" in why, why
        return accepted

    def amqp_send(self, token: Token, address: str) -> bool:
        return self._attach(token, address, sender=True)

    def amqp_receive(self, token: Token, address: str) -> bool:
        return self._attach(token, address, sender=False)

    def peek(self, token: Token, address: str) -> bool:
        audience = address if token.scope is None else token.scope
        with self._amqp(token, audience) as client:
            status, why = client.management(address, "peek-message", PEEK)
        assert status in (200, 204, 401), why
        return status != 401


DOORS: dict[str, Callable[[Doors, Token, str], bool]] = {
    "put-token": Doors.put_token,
    "amqp-send": Doors.amqp_send,
    "amqp-receive": Doors.amqp_receive,
    "peek": Doors.peek,
    "rest-send": Doors.rest_send,
    "rest-receive-and-delete": Doors.rest_receive_and_delete,
    "admin-get": Doors.admin_get,
    "admin-create": Doors.admin_create,
    "admin-delete": Doors.admin_delete,
    "faults": Doors.faults,
    "namespaces": Doors.namespaces,
}


@pytest.mark.parametrize("name", list(TOKENS))
def test_a_token_reaches_exactly_its_scope_at_every_door(doors: Doors, name: str) -> None:
    token = TOKENS[name]
    assert token.reaches <= ADDRESSES
    wrong = []
    for door, address in CASES:
        let_in = DOORS[door](doors, token, address)
        if let_in != (address in token.reaches):
            wrong.append(f"{door} {address}: {'let in' if let_in else 'refused'}")
    assert wrong == [], f"{name}: " + "; ".join(wrong)
