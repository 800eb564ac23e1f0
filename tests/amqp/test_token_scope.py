"""CBS tokens are checked against the node a link or request actually uses, with the key's rights (raw AMQP).

A token grants what its key's rights allow on the resource its audience names and everything below it:
the JavaScript SDK puts a token for ``sb://host/q/$management`` before it schedules or peeks on a fresh
link, so that token must authorize the ``q/$management`` node; a token for ``q`` must not cover ``q2``,
nor one made for another host this connection.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from azure.servicebus._pyamqp._decode import decode_payload
from azure.servicebus._pyamqp.message import Message, Properties
from azure.servicebus._pyamqp.performatives import OpenFrame

from oncebus.amqp import connection as _connection
from oncebus.amqp.limits import AmqpLimits
from oncebus.amqp.server import AmqpServer
from oncebus.auth import KeyRing, SasKey, make_token, parse_rights
from oncebus.broker import Namespace
from oncebus.broker.clock import ManualClock
from oncebus.store.memory import MemoryStore
from tests.amqp.inprocess import InProcessServer
from tests.amqp.raw import (
    AMQP_HEADER,
    ATTACH,
    DETACH,
    DISPOSITION,
    OPEN,
    SASL_HEADER,
    SASL_MECHANISMS,
    SASL_OUTCOME,
    TRANSFER,
    RawClient,
    attach_frame,
    encoded,
    error_of,
    flow_frame,
    frame,
    outcome_of,
)

KEYS = KeyRing(
    [
        SasKey("RootManageSharedAccessKey", "SAS_KEY_VALUE"),
        SasKey("sender", "send-key", parse_rights("Send")),
        SasKey("listener", "listen-key", parse_rights("Listen")),
        SasKey("sendlisten", "sl-key", parse_rights("Send,Listen")),
    ]
)
SECRETS = {key.name: key.key for key in KEYS.entries()}
QUEUES = ["q", "q2", "other"]
MAX_GRANTS_PER_CONNECTION: int = getattr(_connection, "MAX_GRANTS_PER_CONNECTION", 1000)
HOST = "127.0.0.1"


class ScopedServer(InProcessServer):
    """The in-process listener with the keys above and a topic ``t`` with subscription ``s``."""

    def start(self) -> ScopedServer:
        self.thread.start()

        async def start() -> None:
            self.namespace = await Namespace.open(MemoryStore(), ManualClock(int(self.wall * 1_000_000)))
            for name in self.queues:
                await self.namespace.create_queue(name)
            await self.namespace.create_topic("t")
            await self.namespace.create_subscription("t", "s")
            self.server = AmqpServer(self.namespace, KEYS, wall_time=self.wall_time, limits=self.limits)
            await self.server.start(HOST, 0)

        self.run(start)
        return self


@pytest.fixture(scope="module")
def listener() -> Iterator[ScopedServer]:
    server = ScopedServer(AmqpLimits(token_check_interval=0.3), QUEUES).start()
    yield server
    server.stop()


class Client(RawClient):
    """A raw client that names its host in ``open`` (as the SDKs do) and puts any token on $cbs."""

    def __init__(self, port: int) -> None:
        super().__init__(port)
        self.cbs_ready = False
        self.handle = 1000  # above the $cbs links' handles (100, 101): a handle in use may not be attached again

    def handshake(self, *, begin: bool = True, hostname: str | None = HOST) -> None:
        from azure.servicebus._pyamqp.performatives import BeginFrame, SASLInit

        self.send(SASL_HEADER)
        self.expect(SASL_MECHANISMS)
        self.send(frame(SASLInit(b"ANONYMOUS", None, None), frame_type=b"\x01"))
        self.expect(SASL_OUTCOME)
        opened = OpenFrame("scope-client", hostname, 65536, 255, None, None, None, None, None, None)
        self.send(AMQP_HEADER + frame(opened))
        self.expect(OPEN)
        if begin:
            self.send(frame(BeginFrame(None, 0, 65536, 65536, 1023, None, None, None)))
            self.expect(BEGIN)

    def token(
        self,
        path: str,
        *,
        key_name: str = "RootManageSharedAccessKey",
        key: str | None = None,
        host: str = HOST,
        audience: str | None = None,
        expiry: int | None = None,
    ) -> tuple[int, str]:
        """Put a token for ``sb://host/path`` on $cbs, signed with ``key`` (default: the namespace key named
        ``key_name``); (status code, description)."""
        if not self.cbs_ready:
            self.send(attach_frame("cbs-sender", 100, "$cbs", sender=True))
            self.send(attach_frame("cbs-receiver", 101, "$cbs", sender=False))
            self.send(flow_frame(101, 100000))
            self.expect(ATTACH)
            self.expect(ATTACH)
            self.cbs_ready = True
        resource = f"sb://{host}:{self.port}/{path}"
        signing = SECRETS[key_name] if key is None else key
        token = make_token(resource, key_name, signing, expiry or int(time.time()) + 3600)
        request = Message(
            value=token,
            properties=Properties(message_id=str(uuid.uuid4()), reply_to="cbs-receiver"),
            application_properties={
                "operation": "put-token",
                "type": "servicebus.windows.net:sastoken",
                "name": audience or resource,
            },
        )
        self.transfer(100, encoded(request))
        props = self.reply(TRANSFER).application_properties
        return int(props[b"status-code"]), bytes(props[b"status-description"]).decode()

    def reply(self, code: int) -> Any:
        got = self.expect(code)
        return decode_payload(memoryview(got.fields[-1]))

    def attach(self, address: str, *, sender: bool) -> tuple[bool, str]:
        """Attach a link; (accepted, the detach's description when refused)."""
        self.handle += 1
        handle = self.handle
        self.send(attach_frame(f"link-{handle}", handle, address, sender=sender))
        if not sender:
            self.send(flow_frame(handle, 1))
        attach = self.expect(ATTACH)
        terminus = attach.fields[6] if sender else attach.fields[5]  # a refused link's is null
        if terminus is None:
            return False, error_of(self.expect(DETACH))[1]
        return True, ""

    def management(self, node: str, operation: str, body: dict[str, Any]) -> tuple[int, str]:
        """One request to ``node`` (e.g. ``q/$management``) on fresh links; (statusCode, statusDescription).

        A node no token of the connection covers may also refuse by detaching the links: the server's token check
        (every ``token_check_interval``) force-detaches them if it runs between their attach and the request.
        That refusal reads as 401 with the detach's description."""
        self.handle += 2
        request_handle, response_handle = self.handle - 1, self.handle
        reply_to = f"mgmt-reply-{response_handle}"
        names = {f"mgmt-{request_handle}", reply_to}
        self.send(attach_frame(f"mgmt-{request_handle}", request_handle, node, sender=True))
        self.send(attach_frame(reply_to, response_handle, node, sender=False))
        self.send(flow_frame(response_handle, 10))
        theirs: set[int] = set()  # the server's handles of the two links (its detach names its own)
        sent = None
        response = None
        disposition = None
        while response is None or disposition is None:
            got = self.read_frame()
            assert got is not None, "no answer to the management request"
            if got.code == ATTACH and _text(got.fields[0]) in names:
                theirs.add(got.fields[1])
                if len(theirs) == 2:
                    request = Message(
                        value=body,
                        properties=Properties(message_id=str(uuid.uuid4()), reply_to=node),
                        application_properties={"operation": f"com.microsoft:{operation}"},
                    )
                    sent = self.transfer(request_handle, encoded(request))
            elif got.code == DETACH and got.fields[0] in theirs:
                condition, description = error_of(got)
                assert condition == "amqp:link:detach-forced" and "Unauthorized access" in description, description
                return 401, description
            elif got.code == TRANSFER and sent is not None:
                response = decode_payload(memoryview(got.fields[-1]))
            elif got.code == DISPOSITION and sent is not None:
                if got.fields[1] <= sent <= (got.fields[2] or got.fields[1]):
                    disposition = got
        assert outcome_of(disposition)[0] == "accepted"
        props = response.application_properties
        return int(props[b"statusCode"]), bytes(props[b"statusDescription"]).decode()


BEGIN = 0x11


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


PEEK = {"from-sequence-number": 0, "message-count": 1}


@pytest.fixture
def client(listener: ScopedServer) -> Iterator[Client]:
    with Client(listener.port) as raw:
        raw.handshake()
        yield raw


# --- audience forms that must be accepted --------------------------------------------------------------
def test_a_token_for_the_management_node_authorizes_that_node(client: Client) -> None:
    """What the JavaScript SDK does before scheduleMessages/peekMessages on a fresh link."""
    assert client.token("q/$management")[0] == 202
    assert client.management("q/$management", "peek-message", PEEK)[0] == 204
    assert client.management("Q/$Management", "peek-message", PEEK)[0] == 204  # case aside
    # ... and nothing above it or beside it
    assert client.attach("q", sender=True)[0] is False
    status, description = client.management("q2/$management", "peek-message", PEEK)
    assert status == 401 and "q2/$management" in description


def test_a_token_for_the_entity_covers_its_management_node_and_sub_queues(client: Client) -> None:
    assert client.token("q")[0] == 202
    assert client.attach("q", sender=True) == (True, "")
    assert client.attach("q/$DeadLetterQueue", sender=False) == (True, "")
    assert client.management("q/$management", "peek-message", PEEK)[0] == 204


def test_a_token_for_a_subscription_path_covers_the_subscription(client: Client) -> None:
    assert client.token("t/Subscriptions/s")[0] == 202
    assert client.attach("t/subscriptions/s", sender=False) == (True, "")
    assert client.management("t/Subscriptions/s/$management", "peek-message", PEEK)[0] == 204
    assert client.attach("t", sender=True)[0] is False  # the topic is above the token


def test_a_token_for_the_namespace_root_covers_everything(client: Client) -> None:
    assert client.token("")[0] == 202
    assert client.attach("q2", sender=True) == (True, "")
    assert client.attach("t/subscriptions/s", sender=False) == (True, "")
    assert client.management("other/$management", "peek-message", PEEK)[0] == 204


def test_an_url_encoded_audience_is_read_decoded(client: Client) -> None:
    assert client.token("q%2F%24management")[0] == 202
    assert client.management("q/$management", "peek-message", PEEK)[0] == 204


# --- tokens that must be refused ------------------------------------------------------------------------
def test_a_token_for_another_entity_or_a_sibling_with_a_common_prefix_is_refused(client: Client) -> None:
    assert client.token("q")[0] == 202
    accepted, why = client.attach("q2", sender=True)
    assert not accepted and "q2" in why
    assert client.management("q2/$management", "peek-message", PEEK)[0] == 401
    assert client.attach("other", sender=False)[0] is False


def test_a_token_does_not_cover_an_audience_outside_its_resource(client: Client) -> None:
    status, description = client.token("q", audience=f"sb://{HOST}:{client.port}/q2")
    assert status == 401 and "does not cover" in description


def test_a_token_made_for_another_host_is_refused(client: Client) -> None:
    status, description = client.token("q", host="evil.example")
    assert status == 401 and "evil.example" in description and HOST in description
    assert client.attach("q", sender=True)[0] is False


def test_se_beyond_year_9999_is_a_clean_401(client: Client) -> None:
    status, description = client.token("q", expiry=10**400)
    assert status == 401 and "9999" in description
    assert client.token("q")[0] == 202  # the connection still serves


# --- rights -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("key_name", "can_send", "can_receive"),
    [("sender", True, False), ("listener", False, True), ("sendlisten", True, True)],
)
def test_links_need_send_or_listen(client: Client, key_name: str, can_send: bool, can_receive: bool) -> None:
    assert client.token("q", key_name=key_name)[0] == 202
    sent, why_send = client.attach("q", sender=True)
    received, why_receive = client.attach("q", sender=False)
    assert (sent, received) == (can_send, can_receive)
    if not can_send:
        assert "'Send' claim(s) are required" in why_send
    if not can_receive:
        assert "'Listen' claim(s) are required" in why_receive


@pytest.mark.parametrize(
    ("key_name", "schedule", "peek"),
    [("sender", 200, 401), ("listener", 401, 204), ("RootManageSharedAccessKey", 200, 204)],
)
def test_management_operations_need_their_right(client: Client, key_name: str, schedule: int, peek: int) -> None:
    assert client.token("q/$management", key_name=key_name)[0] == 202
    when = int(time.time() * 1000) + 3_600_000
    scheduled = Message(
        data=[b"later"],
        properties=Properties(message_id=str(uuid.uuid4())),
        message_annotations={b"x-opt-scheduled-enqueue-time": _timestamp(when)},
    )
    status, description = client.management(
        "q/$management", "schedule-message", {"messages": [{"message": encoded(scheduled)}]}
    )
    assert status == schedule, description
    if schedule == 401:
        assert "'Send' claim(s) are required" in description
    status, description = client.management("q/$management", "peek-message", PEEK)
    assert status == peek or (peek == 204 and status == 200), description  # 200: it peeked a scheduled one
    if peek == 401:
        assert "'Listen' claim(s) are required" in description


def _timestamp(ms: int) -> Any:
    from azure.servicebus._pyamqp.types import AMQPTypes

    return {"TYPE": AMQPTypes.timestamp, "VALUE": ms}


# --- what the client is told ----------------------------------------------------------------------------
def test_a_transfer_on_a_refused_link_is_settled_with_an_outcome(client: Client) -> None:
    """rhea (the JavaScript SDK's AMQP) cannot read a disposition whose state is null."""
    client.handle += 1
    handle = client.handle
    client.send(attach_frame(f"link-{handle}", handle, "q", sender=True))  # no token: refused
    sent = client.transfer(handle, encoded(Message(data=[b"x"], properties=Properties(message_id="x"))))
    disposition = client.disposition(sent)
    assert disposition.fields[3] is True  # settled
    assert outcome_of(disposition)[0] == "rejected"


def test_a_forced_detach_names_no_token_that_never_existed(listener: ScopedServer, client: Client) -> None:
    client.handle += 1
    client.send(attach_frame("mgmt-no-token", client.handle, "q/$management", sender=True))
    client.expect(ATTACH)
    got = client.expect(DETACH, timeout=3)
    condition, description = error_of(got)
    assert condition == "amqp:link:detach-forced"
    assert "expired" not in description and "no token covers 'q/$management'" in description


# --- the grants a connection keeps are bounded ------------------------------------------------------------
def test_grants_per_connection_are_bounded_and_a_renewal_replaces(listener: ScopedServer, client: Client) -> None:
    assert client.token("q")[0] == 202
    for index in range(1, MAX_GRANTS_PER_CONNECTION):
        assert client.token(f"q/x{index}")[0] == 202
    status, description = client.token("q/one-too-many")
    assert status == 403 and str(MAX_GRANTS_PER_CONNECTION) in description
    assert client.token("")[0] == 403  # the root is one more audience: refused as well
    assert client.token("q/x7")[0] == 202  # a new token for a held audience replaces the old one
    # with the most grants held, a link's check is a few look-ups: 300 attaches stay quick
    started = time.monotonic()
    for _ in range(300):
        assert client.attach("q", sender=True) == (True, "")
    assert time.monotonic() - started < 3.0
    # and another client on the same server is served meanwhile
    with Client(listener.port) as other:
        other.handshake()
        assert other.token("q2")[0] == 202
        assert other.attach("q2", sender=True) == (True, "")


def test_responses_are_sent_settled_so_a_client_that_never_settles_keeps_nothing_on_the_server(
    client: Client,
) -> None:
    """50,000 put-tokens from a client that never settled the answers held ~100 MB of deliveries."""
    client.token("q")
    request = Message(
        value="not a token",
        properties=Properties(message_id="m", reply_to="cbs-receiver"),
        application_properties={"operation": "put-token", "type": "servicebus.windows.net:sastoken", "name": "x"},
    )
    client.transfer(100, encoded(request))
    answer = client.expect(TRANSFER)
    assert answer.fields[4] is True  # settled
