"""The bounds of issue 18 under generated input: Host names, control-socket lines, peek sizes and id lengths.

Each case runs against a real ``oncebus serve`` (or the broker API for ids) and checks the bound holds exactly,
the answer is a clear refusal (never a server failure), and the server still serves a well-behaved client.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.management import ServiceBusAdministrationClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oncebus.broker import ManualClock, Message, Namespace
from oncebus.broker.delivery import MAX_PEEK_MESSAGES
from oncebus.core.errors import InvalidArgumentError
from oncebus.server.control import TOKEN_LINE
from oncebus.store.memory import MemoryStore
from tests.http.conftest import Served, start_server

EXAMPLES = int(os.environ.get("ONCEBUS_FUZZ_EXAMPLES", "250")) // 5


def _settings(examples: int = EXAMPLES) -> Any:
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=os.environ.get("ONCEBUS_FUZZ_RANDOM") != "1",
        database=None,
        suppress_health_check=list(HealthCheck),
    )


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    served = start_server(tmp_path_factory.mktemp("fuzz-bounds") / "data")
    with ServiceBusClient.from_connection_string(served.connection_string) as client:
        with ServiceBusAdministrationClient.from_connection_string(
            served.connection_string, connection_verify=served.ca_file
        ) as admin:
            admin.create_queue("peeked")
        with client.get_queue_sender("peeked") as sender:
            sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(300)])
    yield served
    served.stop()


def _health(port: int, host: bytes) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: " + host + b"\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    if not data:
        return 0  # closed without an answer (h11 refused the header outright): also not served
    return int(data.split(b" ", 2)[1])


_labels = st.text("abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=12)
_foreign = st.builds(
    lambda parts, port: ".".join([*parts, "example"]) + port,
    st.lists(_labels, min_size=1, max_size=3),
    st.sampled_from(["", ":80", ":5300"]),
)


def test_hosts_the_server_does_not_answer_to_are_refused(served: Served) -> None:
    @_settings()
    @given(name=_foreign, odd=st.binary(max_size=40))
    def example(name: str, odd: bytes) -> None:
        assert _health(served.http_port, name.encode()) == 403, name  # a foreign DNS name: never served
        status = _health(served.http_port, odd.replace(b"\r", b"").replace(b"\n", b""))
        assert status in (0, 200, 400, 403), (odd, status)  # whatever it is: a refusal or an answer, no failure
        assert _health(served.http_port, b"localhost") == 200

    example()


def test_control_lines_without_the_token_get_an_error_and_nothing_more(served: Served) -> None:
    port = int(json.loads((served.data_dir / "server.json").read_text())["control_port"])

    @_settings()
    @given(prefix=st.binary(max_size=64), size=st.integers(0, 3 * TOKEN_LINE), newline=st.booleans())
    def example(prefix: bytes, size: int, newline: bool) -> None:
        line = (prefix + b"x" * size).replace(b"\n", b" ") + (b"\n" if newline else b"")
        with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
            sock.sendall(line)
            if not newline:
                sock.shutdown(socket.SHUT_WR)
            reply = sock.makefile("rb").readline()
        if reply:  # (an empty line, or one closed unfinished and empty, gets no reply)
            answer = json.loads(reply)
            assert answer["ok"] is False and answer["error"] in ("UnauthorizedError", "InvalidArgumentError"), answer

    example()


def test_a_peek_of_any_size_returns_at_most_the_cap(served: Served) -> None:
    with ServiceBusClient.from_connection_string(served.connection_string) as client:
        with client.get_queue_receiver("peeked") as receiver:

            @_settings(20)
            @given(count=st.integers(1, 2**31 - 1), start=st.integers(1, 320))
            def example(count: int, start: int) -> None:
                got = receiver.peek_messages(max_message_count=count, sequence_number=start)
                expected = min(count, MAX_PEEK_MESSAGES, max(0, 300 - start + 1))
                assert len(got) == expected, (count, start, len(got))
                assert [m.sequence_number for m in got] == list(range(start, start + expected))

            example()


def test_ids_are_accepted_exactly_up_to_128_utf16_code_units() -> None:
    async def check(values: list[str]) -> None:
        ns = await Namespace.open(MemoryStore(), ManualClock())
        await ns.create_queue("q")
        for value in values:
            units = len(value.encode("utf-16-le", "surrogatepass")) // 2
            try:
                await ns.send("q", Message(b"x", message_id=value, session_id=None))
            except InvalidArgumentError as exc:
                assert units > 128 or value == "", (units, str(exc))
                assert units <= 128 or "at most 128" in str(exc)
            else:
                assert 0 < units <= 128, units
        await ns.close()

    @_settings()
    @given(values=st.lists(st.text(st.characters(exclude_categories=["Cs"]), min_size=100, max_size=140), max_size=5))
    def example(values: list[str]) -> None:
        asyncio.run(check(values))

    example()
