"""Raw sockets against the sniffing listener: garbage, silence, slow TLS and slow HTTP are bounded and closed.

The listener, the HTTP protocol and the AMQP server are the real ones, run in
this process with short timeouts so that each case takes well under a second.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from oncebus.amqp.server import AmqpServer
from oncebus.auth import DEFAULT_KEYS
from oncebus.broker import Namespace
from oncebus.http import HttpApp, HttpLimits, HttpProtocol
from oncebus.server.certs import ensure_certificates
from oncebus.server.listener import Doors, Listener, classify
from oncebus.store.memory import MemoryStore

TIMEOUT = 0.5  # every handshake / request timeout of the server under test
LIMITS = HttpLimits(max_header_bytes=4096, max_body_bytes=10_000, request_timeout=TIMEOUT, keepalive_timeout=1.0)


@asynccontextmanager
async def serving(tmp_path: Path, *, max_pending: int = 64, sniff_timeout: float = TIMEOUT) -> AsyncIterator[Listener]:
    namespace = await Namespace.open(MemoryStore())
    certs = ensure_certificates(tmp_path)
    amqp = AmqpServer(namespace, DEFAULT_KEYS)
    app = HttpApp(namespace, DEFAULT_KEYS)
    doors = Doors(
        amqp=amqp.connection_protocol,
        http=lambda scheme: HttpProtocol(app, scheme=scheme, limits=LIMITS),
        tls=certs.server_context(),
        sniff_timeout=sniff_timeout,
        handshake_timeout=TIMEOUT,
        max_pending=max_pending,
        pressure_sniff_timeout=sniff_timeout,
    )
    listener = Listener.open("127.0.0.1", 0, doors)
    listener.start()
    try:
        yield listener
    finally:
        await listener.close()
        await amqp.close()


def run(tmp_path: Path, scenario: Callable[[Listener], Awaitable[None]], **kwargs: object) -> None:
    async def main() -> None:
        async with serving(tmp_path, **kwargs) as listener:  # type: ignore[arg-type]
            await scenario(listener)

    asyncio.run(main())


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bytes:
    """Everything the server sends until it closes; fails if it has not closed within ``seconds``."""
    data = b""
    deadline = time.monotonic() + seconds
    while True:
        try:
            chunk = await asyncio.wait_for(reader.read(65536), max(deadline - time.monotonic(), 0.01))
        except ConnectionResetError:  # closed with the client's bytes unread: TCP answers with a reset
            return data
        if not chunk:
            return data
        data += chunk


def client_context(tmp_path: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(tmp_path / "tls" / "ca.pem"))


def test_classify_first_bytes() -> None:
    assert classify(b"AMQP\x03\x01\x00\x00") == "amqp" and classify(b"AMQP\x00\x01\x00\x00") == "amqp"
    assert classify(b"\x16\x03\x01\x02\x00") == "tls"
    assert classify(b"GET / HT") == "http" and classify(b"OPTIONS ") == "http" and classify(b"DELETE /") == "http"
    assert classify(b"AM") is None and classify(b"GE") is None and classify(b"\x16") is None
    assert classify(b"\x00\x01garb") == "" and classify(b"GETX / H") == "" and classify(b"\x16\x01") == ""


def test_garbage_and_silence_are_closed(tmp_path: Path) -> None:
    async def scenario(listener: Listener) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        writer.write(b"\x00\x01garbage, not a protocol")
        assert await closed_within(reader, 1.0) == b""
        for first in (b"", b"AM", b"GE"):  # silence, and half a header then silence
            started = time.monotonic()
            reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
            writer.write(first)
            assert await closed_within(reader, TIMEOUT + 2.0) == b""
            assert time.monotonic() - started >= TIMEOUT * 0.8

    run(tmp_path, scenario)


def test_half_a_header_then_end_of_stream_is_closed_at_once(tmp_path: Path) -> None:
    """A client that sends part of a header and shuts its side down is closed now, not at the sniff timeout."""

    async def scenario(listener: Listener) -> None:
        for first in (b"A", b"AMQ", b"GE", b"\x16"):
            started = time.monotonic()
            reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
            writer.write(first)
            writer.write_eof()
            assert await closed_within(reader, TIMEOUT) == b""
            assert time.monotonic() - started < TIMEOUT * 0.8, first

    run(tmp_path, scenario, sniff_timeout=10.0)


def test_head_gets_the_headers_without_a_body_and_the_connection_goes_on(tmp_path: Path) -> None:
    async def scenario(listener: Listener) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        for target in (b"/$namespaceinfo", b"/some-queue", b"/health"):
            writer.write(b"HEAD " + target + b" HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2.0)
            assert head.startswith(b"HTTP/1.1 "), head
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = await closed_within(reader, 2.0)
        assert answer.startswith(b"HTTP/1.1 200 "), answer  # nothing of the HEAD answers' bodies came before

    run(tmp_path, scenario)


def test_slow_or_broken_tls_is_closed(tmp_path: Path) -> None:
    async def scenario(listener: Listener) -> None:
        # a TLS record header and then nothing: the handshake times out
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        writer.write(b"\x16\x03\x01\x02\x00\x01")
        await closed_within(reader, TIMEOUT * 2 + 2.0)
        # a garbage "handshake"
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        writer.write(b"\x16\x03\x01\x00\x05hello" + b"\x00" * 64)
        await closed_within(reader, TIMEOUT * 2 + 2.0)
        # a complete handshake, then silence inside TLS
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", listener.port, ssl=client_context(tmp_path), server_hostname="localhost"
        )
        assert await closed_within(reader, TIMEOUT + 2.0) == b""
        # a complete handshake, then neither AMQP nor HTTP
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", listener.port, ssl=client_context(tmp_path), server_hostname="127.0.0.1"
        )
        writer.write(b"HELLO?? what is this")
        assert await closed_within(reader, 2.0) == b""

    run(tmp_path, scenario)


def test_slow_http_is_timed_out_even_while_bytes_trickle_in(tmp_path: Path) -> None:
    async def scenario(listener: Listener) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        started = time.monotonic()
        answer = asyncio.ensure_future(closed_within(reader, TIMEOUT + 2.0))
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        for _ in range(40):  # one byte every 50 ms: would last 2 s, four times the request timeout
            if answer.done():
                break
            try:
                writer.write(b"X")
                await writer.drain()
            except ConnectionError:
                break
            await asyncio.sleep(0.05)
        assert (await answer).startswith(b"HTTP/1.1 408 ")
        assert time.monotonic() - started < TIMEOUT + 1.5

    run(tmp_path, scenario)


def test_header_and_body_limits(tmp_path: Path) -> None:
    async def scenario(listener: Listener) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 8000 + b"\r\n\r\n")
        assert (await closed_within(reader, 2.0)).startswith(b"HTTP/1.1 431 ")

        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        writer.write(b"PUT /q HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n")
        assert (await closed_within(reader, 2.0)).startswith(b"HTTP/1.1 413 ")

        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        writer.write(b"PUT /q HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(20):
            writer.write(b"3e8\r\n" + b"z" * 1000 + b"\r\n")  # 20 kB in chunks, over the 10 kB limit
        assert (await closed_within(reader, 2.0)).startswith(b"HTTP/1.1 413 ")

        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        writer.write(b"GET /health HTTP/1.1\r\nno colon here\r\n\r\n")
        assert (await closed_within(reader, 2.0)).startswith(b"HTTP/1.1 400 ")

    run(tmp_path, scenario)


def test_stalled_clients_do_not_stall_others(tmp_path: Path) -> None:
    async def scenario(listener: Listener) -> None:
        stalled = []
        for first in (b"", b"\x16\x03\x01\x02\x00", b"GET /health HTTP/1.1\r\nHost", b"AM"):
            reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
            writer.write(first)
            stalled.append(writer)
        started = time.monotonic()
        for use_tls in (False, True):
            ctx = client_context(tmp_path) if use_tls else None
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", listener.port, ssl=ctx, server_hostname="localhost" if use_tls else None
            )
            # two requests on one connection (keep-alive), the second pipelined behind the first
            writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" * 2)
            data = b""
            while data.count(b'"status": "ok"') < 2:
                chunk = await asyncio.wait_for(reader.read(65536), 2.0)
                assert chunk, data
                data += chunk
            assert data.startswith(b"HTTP/1.1 200 ")
            writer.close()
        assert time.monotonic() - started < TIMEOUT  # answered before any stalled client was even timed out
        for writer in stalled:
            writer.close()

    run(tmp_path, scenario)


def test_undecided_connections_are_bounded(tmp_path: Path) -> None:
    async def scenario(listener: Listener) -> None:
        connections = [await asyncio.open_connection("127.0.0.1", listener.port) for _ in range(12)]
        await asyncio.sleep(0.3)
        closed = 0
        for reader, _ in connections:
            try:
                if await asyncio.wait_for(reader.read(1), 0.2) == b"":
                    closed += 1
            except TimeoutError:
                pass
        assert closed == 4  # 8 may wait for their first bytes; the 4 oldest were closed to make room
        for _, writer in connections:
            writer.close()

    run(tmp_path, scenario, max_pending=8, sniff_timeout=5.0)


@pytest.mark.parametrize("tls", [False, True])
def test_admin_api_needs_a_valid_token(tmp_path: Path, tls: bool) -> None:
    async def scenario(listener: Listener) -> None:
        ctx = client_context(tmp_path) if tls else None
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", listener.port, ssl=ctx, server_hostname="localhost" if tls else None
        )
        writer.write(b"GET /$Resources/Queues HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = await closed_within(reader, 2.0)
        assert answer.startswith(b"HTTP/1.1 401 ") and b"<Code>401</Code>" in answer
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", listener.port, ssl=ctx, server_hostname="localhost" if tls else None
        )
        bad = b"SharedAccessSignature sr=x&sig=bm8%3D&se=99999999999&skn=RootManageSharedAccessKey"
        writer.write(
            b"GET /$Resources/Queues HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: " + bad + b"\r\n\r\n"
        )
        answer = await closed_within(reader, 2.0)
        assert answer.startswith(b"HTTP/1.1 401 ") and b"signature does not match" in answer

    run(tmp_path, scenario)
