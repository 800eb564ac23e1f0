"""Mutated administration requests and odd first bytes thrown at a running ``oncebus serve``'s HTTP doors.

The starting points are the real ServiceBusAdministrationClient's requests (see
``http_sessions``): namespace, queues, topics, subscriptions and rules, created,
read, updated, listed and deleted. hypothesis mutates them (flipped, cut and
inserted bytes; headers replaced, added or repeated, with odd Content-Length and
Transfer-Encoding; bodies replaced by generated XML: deep nesting, DTDs with
entity expansion and external entities, Atom entries with generated property
values; odd paths and methods; pipelined repeats) and each example is sent on a
fresh connection to the plain HTTP port. The sniffing port gets generated first
bytes: AMQP headers, TLS records and HTTP lines, cut and flipped.

After every example: the server is alive and logged no traceback, every response
is well-formed HTTP with no server failure (5xx but 501/505), no file content leaked through an
XML entity, ``/health`` and an AMQP client's acknowledged send and round trip
still work, and memory stays bounded. The REST data plane gets generated JSON too
(BrokerProperties, property headers and batch bodies: deep, huge, NaN, integers past
64 bits, arrays, lone surrogates): a 201 or a 4xx, and every message taken is
delivered over AMQP afterwards. At the end, the real administration client
lists every entity the fuzzing left behind, and each one's properties are within
what Service Bus allows (a bad request stored nothing invalid), and every
acknowledged AMQP send is still there.

``ONCEBUS_FUZZ_EXAMPLES`` sets the number of examples (default sized for CI);
``ONCEBUS_FUZZ_RANDOM=1`` explores new examples instead of the fixed CI set.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusReceiveMode
from azure.servicebus.management import ServiceBusAdministrationClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oncebus.auth import make_token
from tests.amqp.raw import vmrss_kib
from tests.fuzz.http_sessions import Request, record_admin_requests
from tests.fuzz.sessions import Checker, drain_ids
from tests.http.conftest import Served, start_server

EXAMPLES = int(os.environ.get("ONCEBUS_FUZZ_EXAMPLES", "250"))
MEMORY_HEADROOM_KIB = 96 * 1024
SECRET_FILE = "/etc/passwd"  # an external entity naming it must never bring its content back
SECRET_MARK = b"root:"


def _settings(examples: int) -> Any:
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=os.environ.get("ONCEBUS_FUZZ_RANDOM") != "1",
        database=None,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    served = start_server(tmp_path_factory.mktemp("fuzz-http") / "data", "--http-port", "0")
    assert served.http_port, served.output
    yield served
    served.stop()


@pytest.fixture(scope="module")
def admin_requests(http_server: Served) -> list[Request]:
    found = record_admin_requests(http_server.connection_string, http_server.data_dir, http_server.http_port)
    methods = {request.head.split(b" ", 1)[0] for request in found}
    assert methods >= {b"GET", b"PUT", b"DELETE"}, methods
    assert any(b"entry" in request.body for request in found)
    return found


@pytest.fixture(scope="module")
def probe_queues(http_server: Served) -> None:
    with ServiceBusAdministrationClient.from_connection_string(
        http_server.connection_string, connection_verify=http_server.ca_file
    ) as admin:
        admin.create_queue("ledger", requires_duplicate_detection=True)
        admin.create_queue("probe")  # each test's checker numbers its probes from 0


# ------------------------------------------------------------------------------ mutations
_names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)
_values = st.one_of(
    _names,
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.sampled_from(
        [
            "PT0S",
            "PT-1S",
            "P99999999999D",
            "P10675199DT2H48M5.4775807S",
            "PT19S",
            "P8D",
            "PT1H",
            "true",
            "false",
            "NaN",
            "1e309",
            "",
            "Active",
            "Disabled",
            "ReceiveDisabled",
            "Creating",
            "\x00",
            "&amp;",
            "]]>",
        ]
    ),
)
_fields = st.sampled_from(
    [
        b"DuplicateDetectionHistoryTimeWindow",
        b"LockDuration",
        b"MaxDeliveryCount",
        b"RequiresDuplicateDetection",
        b"DefaultMessageTimeToLive",
        b"AutoDeleteOnIdle",
        b"MaxSizeInMegabytes",
        b"RequiresSession",
        b"EnablePartitioning",
        b"ForwardTo",
        b"Status",
        b"SqlExpression",
        b"Name",
        b"MaxMessageSizeInKilobytes",
        b"ForwardDeadLetteredMessagesTo",
        b"DeadLetteringOnMessageExpiration",
        b"EnableBatchedOperations",
    ]
)


def _deep(depth: int) -> bytes:
    return b"<a>" * depth + b"x" + b"</a>" * depth


LAUGHS = (
    b'<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol1 "&lol;&lol;&lol;&lol;&lol;&lol;">'
    b'<!ENTITY lol2 "&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;"><!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;">]>'
    b'<entry xmlns="http://www.w3.org/2005/Atom"><content><QueueDescription>&lol3;</QueueDescription></content></entry>'
)
EXTERNAL = (
    b'<?xml version="1.0"?><!DOCTYPE e [<!ENTITY x SYSTEM "file://' + SECRET_FILE.encode() + b'">]>'
    b'<entry xmlns="http://www.w3.org/2005/Atom"><title>&x;</title><content type="application/xml">'
    b'<QueueDescription xmlns="http://schemas.microsoft.com/netservices/2010/10/servicebus/connect">'
    b"<ForwardTo>&x;</ForwardTo></QueueDescription></content></entry>"
)

mutations = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(1, 255)),
    st.tuples(st.just("cut"), st.integers(0, 10**6)),
    st.tuples(st.just("insert"), st.integers(0, 10**6), st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("field"), _fields, _values),
    st.tuples(
        st.just("header"),
        st.sampled_from(
            [
                b"Content-Length",
                b"Transfer-Encoding",
                b"Authorization",
                b"Content-Type",
                b"Host",
                b"Expect",
                b"Connection",
            ]
        ),
        st.one_of(
            st.sampled_from(
                [
                    b"-1",
                    b"99999999999999999999",
                    b"chunked",
                    b"gzip, chunked",
                    b"100-continue",
                    b"close",
                    b"SharedAccessSignature sr=x&sig=y&se=1&skn=z",
                    b"",
                    b"0x10",
                    b"1 2",
                ]
            ),
            st.binary(max_size=40),
        ),
        st.booleans(),  # replace (True) or add a second one (False)
    ),
    st.tuples(st.just("big_header"), st.integers(1, 200_000)),
    st.tuples(st.just("many_headers"), st.integers(1, 5_000)),
    st.tuples(
        st.just("body"),
        st.one_of(
            st.sampled_from([LAUGHS, EXTERNAL, b"", b"<", b"<entry/>", b"\xff\xfe<\x00e\x00"]),
            st.integers(1, 100_000).map(_deep),
            st.binary(max_size=300),
        ),
    ),
    st.tuples(
        st.just("path"),
        st.one_of(
            st.sampled_from(
                [
                    "/..%2f..%2fetc",
                    "/%00",
                    "/a/Subscriptions/b/Rules/c/d",
                    "/$Resources/Queues",
                    "/" + "q" * 300,
                    "/a%2Fb",
                    "//",
                    "/health/..",
                    "/metrics?x=" + "y" * 5000,
                    "*",
                ]
            ),
            _names.map(lambda s: "/" + s),
        ),
    ),
    st.tuples(
        st.just("method"),
        st.sampled_from(
            [
                b"GET",
                b"PUT",
                b"DELETE",
                b"POST",
                b"PATCH",
                b"OPTIONS",
                b"HEAD",
                b"CONNECT",
                b"TRACE",
                b"G\x00T",
                b"PUT" * 50,
            ]
        ),
    ),
    st.tuples(st.just("repeat"), st.integers(2, 20)),
)


def _set_header(head: bytes, name: bytes, value: bytes, replace: bool) -> bytes:
    lines = head[:-4].split(b"\r\n")
    if replace:
        lines = [line for line in lines if not line.lower().startswith(name.lower() + b":")]
    lines.append(name + b": " + value)
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _length(head: bytes, body: bytes) -> bytes:
    if re.search(rb"\r\ncontent-length:", head, re.IGNORECASE):
        return re.sub(rb"(?i)(\r\ncontent-length:)[^\r]*", rb"\g<1> " + str(len(body)).encode(), head, count=1)
    return head


def apply(request: Request, ops: list[tuple[Any, ...]]) -> bytes:
    """The request's bytes after the mutations, in order (structured ones first keep the framing consistent)."""
    head, body = request.head, request.body
    data: bytes | None = None
    for op in ops:
        kind = op[0]
        if data is None and kind == "field":
            value = _xml(op[2])
            body = re.sub(rb"(<" + op[1] + rb">)[^<]*(</)", lambda m, v=value: m.group(1) + v + m.group(2), body)
            head = _length(head, body)
        elif data is None and kind == "header":
            head = _set_header(head, op[1], op[2], op[3])
        elif data is None and kind == "big_header":
            head = _set_header(head, b"X-Big", b"b" * op[1], True)
        elif data is None and kind == "many_headers":
            head = head[:-2] + b"".join(b"X-%d: v\r\n" % i for i in range(op[1])) + b"\r\n"
        elif data is None and kind == "body":
            body = op[1]
            head = (
                _length(head, body)
                if b"content-length" in head.lower()
                else _set_header(head, b"Content-Length", str(len(body)).encode(), True)
            )
        elif data is None and kind == "path":
            method, rest = head.split(b" ", 1)
            head = method + b" " + op[1].encode("utf-8", "surrogateescape") + b" " + rest.split(b" ", 1)[1]
        elif data is None and kind == "method":
            head = op[1] + b" " + head.split(b" ", 1)[1]
        else:
            data = data if data is not None else head + body
            if kind == "flip" and data:
                i = op[1] % len(data)
                data = data[:i] + bytes([data[i] ^ op[2]]) + data[i + 1 :]
            elif kind == "cut" and data:
                data = data[: op[1] % len(data)]
            elif kind == "insert":
                i = op[1] % (len(data) + 1)
                data = data[:i] + op[2] + data[i:]
            elif kind == "repeat":
                data = data * op[1]
    return data if data is not None else head + body


def _xml(value: str) -> bytes:
    return value.replace("&", "&amp;").replace("<", "&lt;").encode("utf-8", "surrogateescape")


# ------------------------------------------------------------------------------ sending and checking
STATUS = re.compile(rb"HTTP/1\.[01] (\d{3}) ")


def exchange(port: int, data: bytes, *, wait: float = 1.0) -> bytes:
    """Send ``data`` on a fresh connection and read what comes back until the server closes or goes quiet."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    received = bytearray()
    try:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            sock.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                chunk = sock.recv(65536)
            except (TimeoutError, BlockingIOError):
                break
            except OSError:
                break
            if not chunk:
                break
            received += chunk
    finally:
        sock.close()
    return bytes(received)


def statuses(response: bytes) -> list[int]:
    return [int(m.group(1)) for m in STATUS.finditer(response)]


def check_response(response: bytes) -> None:
    if response:
        assert response.startswith(b"HTTP/1.1 ") or response.startswith(b"HTTP/1.0 "), response[:200]
    assert SECRET_MARK not in response, "an XML entity brought a file's content back"
    # 501 (a transfer coding or method it does not implement) and 505 (HTTP version) are HTTP's own answers
    bad = [status for status in statuses(response) if status >= 500 and status not in (501, 505)]
    assert not bad, "the server failed on a request (5xx):\n" + response[:2000].decode("latin-1")


def health(port: int) -> None:
    response = exchange(port, b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n", wait=5)
    assert statuses(response)[:1] == [200], response[:300]


class ServerWatch:
    def __init__(self, served: Served) -> None:
        self.served = served
        self.seen = len(served.output)
        self.baseline = vmrss_kib(served.process.pid)

    def check(self) -> None:
        assert self.served.process.poll() is None, "the server died:\n" + "\n".join(self.served.output[-40:])
        new = self.served.output[self.seen :]
        self.seen = len(self.served.output)
        assert not [line for line in new if "Traceback" in line], "the server logged a failure:\n" + "\n".join(new)
        grown = vmrss_kib(self.served.process.pid) - self.baseline
        assert grown < MEMORY_HEADROOM_KIB, f"server memory grew by {grown // 1024} MiB"


MAX_LOCK = timedelta(minutes=5)
MAX_TTL = timedelta(days=10675199, seconds=10085, microseconds=477581)


def assert_every_entity_is_valid(served: Served) -> None:
    """What the fuzzing left in the namespace, as the real administration client reads it: all within bounds."""
    with ServiceBusAdministrationClient.from_connection_string(
        served.connection_string, connection_verify=served.ca_file
    ) as admin:
        for queue in admin.list_queues():
            assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/-]*", queue.name) and len(queue.name) <= 260, queue.name
            window = queue.duplicate_detection_history_time_window
            assert window is not None and timedelta(seconds=20) <= window <= timedelta(days=7), (queue.name, window)
            assert queue.lock_duration is not None and timedelta(0) < queue.lock_duration <= MAX_LOCK, queue.name
            assert queue.max_delivery_count is not None and queue.max_delivery_count >= 1, queue.name
            ttl = queue.default_message_time_to_live
            assert ttl is not None and timedelta(0) < ttl <= MAX_TTL, (queue.name, ttl)
        for topic in admin.list_topics():
            window = topic.duplicate_detection_history_time_window
            assert window is not None and timedelta(seconds=20) <= window <= timedelta(days=7), (topic.name, window)
            for subscription in admin.list_subscriptions(topic.name):
                lock = subscription.lock_duration
                assert lock is not None and timedelta(0) < lock <= MAX_LOCK, subscription.name
                list(admin.list_rules(topic.name, subscription.name))


def test_mutated_admin_requests_never_hurt_the_server_or_other_clients(
    http_server: Served, admin_requests: list[Request], probe_queues: None
) -> None:
    watch = ServerWatch(http_server)
    checker = Checker(http_server.connection_string)
    checker.check()
    stats = {"examples": 0, "answered": 0, "closed_silently": 0}

    @_settings(EXAMPLES)
    @given(request=st.sampled_from(admin_requests), ops=st.lists(mutations, min_size=1, max_size=3))
    def example(request: Request, ops: list[tuple[Any, ...]]) -> None:
        response = exchange(http_server.http_port, apply(request, ops))
        stats["examples"] += 1
        stats["answered" if response else "closed_silently"] += 1
        if os.environ.get("ONCEBUS_FUZZ_TRACE"):
            print(ops)
        check_response(response)
        watch.check()
        health(http_server.http_port)
        checker.check()

    try:
        example()
        for request in admin_requests:  # unmutated, they still work (the token may be reused until it expires)
            check_response(exchange(http_server.http_port, request.raw))
        watch.check()
        assert_every_entity_is_valid(http_server)
    finally:
        checker.close()
    acknowledged = set(checker.acknowledged)
    assert acknowledged <= set(drain_ids(http_server.connection_string, "ledger"))
    print(f"http fuzz: {stats}")


_first_bytes = st.one_of(
    st.sampled_from(
        [
            b"AMQP\x00\x01\x00\x00",
            b"AMQP\x03\x01\x00\x00",
            b"AMQP\x02\x01\x00\x00",
            b"AMQP",
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
            b"\x16\x03\x03\xff\xff",
            b"\x16",
            b"GET / HTTP/1.1\r\n",
            b"PUT /q HTTP/1.1\r\nContent-Length: 999999999\r\n\r\n",
            b"G",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            b"\x00" * 8,
            b"\r\n\r\n",
        ]
    ),
    st.binary(min_size=1, max_size=64),
)


def test_odd_first_bytes_on_the_shared_port_are_closed_cleanly(http_server: Served, probe_queues: None) -> None:
    watch = ServerWatch(http_server)
    checker = Checker(http_server.connection_string)

    @_settings(max(EXAMPLES // 5, 20))
    @given(prefix=_first_bytes, tail=st.binary(max_size=200), cut=st.integers(0, 300))
    def example(prefix: bytes, tail: bytes, cut: int) -> None:
        data = (prefix + tail)[: max(cut, 1)]
        response = exchange(http_server.port, data, wait=3)
        if response.startswith(b"HTTP/"):
            check_response(response)
        watch.check()
        checker.check()

    try:
        example()
        health(http_server.http_port)
    finally:
        checker.close()


REST_EXAMPLES = max(EXAMPLES // 8, 10)


def rest_requests(port: int, queue: str) -> list[Request]:
    """The REST data plane's requests (send, batch, peek-lock, receive-and-delete, unlock, complete, renew), the
    namespaces door's (create, list, use, delete) and the faults door's (arm, list, clear)."""
    token = make_token(f"http://127.0.0.1:{port}/", "RootManageSharedAccessKey", "SAS_KEY_VALUE", 2**31)
    common = f"Host: 127.0.0.1:{port}\r\nAuthorization: {token}\r\n"
    named = make_token(f"http://127.0.0.1:{port}/", "RootManageSharedAccessKey@fuzz-ns", "SAS_KEY_VALUE", 2**31)

    def request(line: str, headers: str = "", body: bytes = b"") -> Request:
        head = f"{line} HTTP/1.1\r\n{common}{headers}Content-Length: {len(body)}\r\n\r\n".encode()
        return Request(head, body)

    lock = f"/{queue}/messages/1/00000000-0000-0000-0000-000000000001"
    batch = b'[{"Body": "a", "BrokerProperties": {"MessageId": "b1"}}, {"Body": "b", "UserProperties": {"n": 1}}]'
    return [
        request(
            f"POST /{queue}/messages",
            'BrokerProperties: {"MessageId": "m1", "Label": "x", "TimeToLive": 60}\r\nPriority: "High"\r\n',
            b"hello",
        ),
        request(f"POST /{queue}/messages", "Content-Type: application/vnd.microsoft.servicebus.json\r\n", batch),
        request(f"POST /{queue}/messages/head?timeout=0"),
        request(f"DELETE /{queue}/messages/head?timeout=0"),
        request(f"PUT {lock}"),
        request(f"DELETE {lock}"),
        request(f"POST {lock}"),
        # the namespaces door (Manage of the default namespace): create, list, use with "<key>@<name>", delete
        request("PUT /$namespaces/fuzz-ns"),
        request("GET /$namespaces"),
        request("GET /$namespaces/fuzz-ns"),
        Request(
            f"GET /$Resources/Queues HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: {named}\r\n"
            "Content-Length: 0\r\n\r\n".encode(),
            b"",
        ),
        request("DELETE /$namespaces/fuzz-ns"),
        # the faults door (Manage): arm on an entity nothing else uses, list, clear (cleared again after the run)
        request("POST /$faults", "Content-Type: application/json\r\n", b'{"kind": "server-busy", "entity": "no-one"}'),
        request("GET /$faults"),
        request("DELETE /$faults"),
    ]


def test_mutated_rest_messaging_requests_never_hurt_the_server(http_server: Served, probe_queues: None) -> None:
    with ServiceBusAdministrationClient.from_connection_string(
        http_server.connection_string, connection_verify=http_server.ca_file
    ) as admin:
        admin.create_queue("rest-fuzz", requires_duplicate_detection=True)
    found = rest_requests(http_server.http_port, "rest-fuzz")
    for request in found:  # unmutated, each is answered without a failure
        response = exchange(http_server.http_port, request.raw)
        check_response(response)
        assert statuses(response)[:1] and statuses(response)[0] < 500, response[:300]
    watch = ServerWatch(http_server)

    @_settings(REST_EXAMPLES)
    @given(request=st.sampled_from(found), ops=st.lists(mutations, min_size=1, max_size=3))
    def example(request: Request, ops: list[tuple[Any, ...]]) -> None:
        check_response(exchange(http_server.http_port, apply(request, ops), wait=0.5))
        watch.check()

    try:
        example()
    finally:  # a mutated arming may have armed a fault for every entity: none outlives this test
        check_response(exchange(http_server.http_port, found[-1].raw))
        _delete_created_namespaces(http_server.http_port, found[0])  # nor a namespace a mutated PUT made
    health(http_server.http_port)


def _delete_created_namespaces(port: int, signed: Request) -> None:
    """Delete every namespace created at run time (``signed``: a request carrying a Manage token)."""
    header = next(line for line in signed.head.split(b"\r\n") if line.lower().startswith(b"authorization:"))
    token = header.split(b":", 1)[1].strip().decode()
    with urllib.request.urlopen(
        urllib.request.Request(f"http://127.0.0.1:{port}/$namespaces", headers={"Authorization": token}), timeout=10
    ) as listed:
        names = [entry["name"] for entry in json.loads(listed.read())]
    for name in names:
        doomed = urllib.request.Request(
            f"http://127.0.0.1:{port}/$namespaces/{name}", method="DELETE", headers={"Authorization": token}
        )
        urllib.request.urlopen(doomed, timeout=10).close()


# ------------------------------------------------------------------------------ REST JSON and property values
REST_VALUE_EXAMPLES = max(EXAMPLES // 2, 40)
VALUES_QUEUE = "rest-values"
BATCH_CONTENT_TYPE = "application/vnd.microsoft.servicebus.json"

_json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**200), max_value=2**200),
    st.sampled_from([-(2**63), -(2**63) - 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 10**30, -(10**30)]),
    st.floats(allow_nan=True, allow_infinity=True),  # json.dumps writes NaN and Infinity, which Python reads
    st.text(max_size=20),
    st.text(st.characters(codec=None, categories=["Cs"]), min_size=1, max_size=2),  # lone surrogates, escaped
)
_json_values = st.recursive(
    st.one_of(_json_scalars, st.text(max_size=10), st.integers(-(2**63), 2**64 - 1)),  # more that are taken
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8,
)
_odd_json = st.one_of(
    st.integers(1, 400_000).map(lambda n: "[" * n),
    st.integers(1, 50_000).map(lambda n: '{"a":' * n),
    st.integers(1, 20_000).map(lambda n: "[" * n + "]" * n),
    st.integers(1, 6_000).map(lambda n: "9" * n),  # past Python's 4300 digits
    st.sampled_from(["", "null", "NaN", "-Infinity", "1e309", '"\\ud800"', "[1,", "{", "}", '{"a":}', "\x00"]),
)
_system_names = st.sampled_from(
    ["Label", "CorrelationId", "SessionId", "TimeToLive", "ScheduledEnqueueTimeUtc", "To", "ReplyTo", "ContentType",
     "PartitionKey", "Unknown"]
)  # fmt: skip
_broker_properties = st.dictionaries(_system_names, _json_values, max_size=3)
_property_names = st.text(st.sampled_from("abcXYZ019-_"), min_size=1, max_size=8).filter(
    lambda name: name.lower() not in ("te", "host", "expect", "upgrade", "connection", "trailer", "keep-alive")
)


_seldom = st.sampled_from([False, False, False, True])  # a quarter of the time
_LASTING = ("TimeToLive", "ScheduledEnqueueTimeUtc")  # a message with one may expire or wait: not counted


@st.composite
def _rest_send(draw: st.DrawFn, marker: str) -> tuple[dict[str, str], bytes, list[str]]:
    """A REST send to the values queue: its headers, its body, and the ids of the messages it carries that must
    be delivered if it is answered 201."""
    if draw(st.booleans()):  # one message: BrokerProperties and property headers
        broker: Any = draw(_json_values if draw(_seldom) else _broker_properties)
        ids: list[str] = []
        if isinstance(broker, dict):
            broker["MessageId"] = marker
            ids = [] if any(name in broker for name in _LASTING) else [marker]
        raw_broker = json.dumps(broker)
        if draw(_seldom):
            raw_broker, ids = draw(_odd_json), []
        headers = {"BrokerProperties": raw_broker}
        for name, value in draw(
            st.dictionaries(_property_names, st.one_of(_json_values, _odd_json), max_size=3)
        ).items():
            raw = isinstance(value, str) and value.isprintable() and draw(st.booleans())  # as is, or as JSON
            headers["x-" + name] = value if raw else json.dumps(value)
        return headers, b"body", ids
    items: list[Any] = []
    ids = []
    for i in range(draw(st.integers(1, 3))):
        odd = draw(_seldom)  # a Body that is not a string, properties that are not objects
        item: Any = {"Body": draw(_json_values if odd else st.text(max_size=10))}
        if draw(st.booleans()):
            item["BrokerProperties"] = draw(_json_values if odd else _broker_properties)
        if draw(st.booleans()):
            item["UserProperties"] = draw(_json_values if odd else st.dictionaries(st.text(max_size=6), _json_values))
        broker = item.setdefault("BrokerProperties", {})
        if isinstance(broker, dict):
            broker["MessageId"] = f"{marker}-{i}"
            if not any(name in broker for name in _LASTING):
                ids.append(f"{marker}-{i}")
        items.append(item)
    if draw(_seldom):
        return {"Content-Type": BATCH_CONTENT_TYPE}, draw(_odd_json).encode(), []
    return {"Content-Type": BATCH_CONTENT_TYPE}, json.dumps(items).encode(), ids


def _rest_request(port: int, headers: dict[str, str], body: bytes) -> bytes:
    token = make_token(f"http://127.0.0.1:{port}/", "RootManageSharedAccessKey", "SAS_KEY_VALUE", 2**31)
    lines = [f"POST /{VALUES_QUEUE}/messages HTTP/1.1", f"Host: 127.0.0.1:{port}", f"Authorization: {token}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    lines += [f"Content-Length: {len(body)}", "Connection: close"]
    head = "\r\n".join(lines).encode("utf-8") + b"\r\n\r\n"
    return head + body


def _drain(connection_string: str, queue: str) -> list[tuple[str, dict[str, Any]]]:
    """Every message of ``queue`` through AMQP (receive and delete): its id and application properties."""
    found = []
    with ServiceBusClient.from_connection_string(connection_string) as client:
        with client.get_queue_receiver(queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as receiver:
            while batch := receiver.receive_messages(max_message_count=100, max_wait_time=2):
                found += [(str(m.message_id), dict(m.application_properties or {})) for m in batch]
    return found


def test_generated_rest_json_and_property_values_are_never_a_server_failure(
    http_server: Served, probe_queues: None
) -> None:
    """BrokerProperties, property headers and batch bodies of generated JSON (deep, huge, odd numbers, NaN,
    integers past 64 bits, arrays, objects, lone surrogates): every answer is a 201 or a 4xx, never a 5xx; the
    server logs no failure; and every message answered 201 is delivered over AMQP afterwards, none held back in a
    dead-letter queue (what a door takes, every door hands out)."""
    with ServiceBusAdministrationClient.from_connection_string(
        http_server.connection_string, connection_verify=http_server.ca_file
    ) as admin:
        admin.create_queue(VALUES_QUEUE)
    watch = ServerWatch(http_server)
    accepted: set[str] = set()
    counts = {"sent": 0, "accepted": 0}

    @_settings(REST_VALUE_EXAMPLES)
    @given(data=st.data())
    def example(data: st.DataObject) -> None:
        marker = f"m{counts['sent']}"
        counts["sent"] += 1
        headers, body, ids = data.draw(_rest_send(marker))
        response = exchange(http_server.http_port, _rest_request(http_server.http_port, headers, body), wait=5)
        check_response(response)
        got = statuses(response)
        assert got, response[:300]
        if got[0] == 201:
            accepted.update(ids)
            counts["accepted"] += 1
        else:
            assert 400 <= got[0] < 500, response[:300]
            assert b"\r\n\r\n" in response and response.split(b"\r\n\r\n", 1)[1].strip(), "a refusal says why"
        watch.check()

    example()
    health(http_server.http_port)
    delivered = _drain(http_server.connection_string, VALUES_QUEUE)
    assert accepted <= {message_id for message_id, _ in delivered}, "an accepted message was not delivered"
    assert _drain(http_server.connection_string, VALUES_QUEUE + "/$DeadLetterQueue") == []
    watch.check()
    print(f"rest values fuzz: {counts}")
