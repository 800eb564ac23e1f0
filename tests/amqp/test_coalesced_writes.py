"""What the server has to say to a client leaves once a loop turn: N outcomes the store confirms together go out
in one transport write (one send syscall, not N), in order; and what waits for that write is not lost when the
connection closes (it goes out before the close) nor written after the connection is dropped.

The server runs in this process so the test can watch its transport's writes (a spy around the real socket
transport: every byte still goes to the client)."""

from __future__ import annotations

from collections.abc import Iterator

import proton
import pytest
from azure.servicebus._pyamqp.outcomes import Accepted
from azure.servicebus._pyamqp.performatives import DispositionFrame

from oncebus.amqp.connection import AmqpConnection
from oncebus.amqp.limits import AmqpLimits
from oncebus.core.messages import Message
from tests.amqp.inprocess import InProcessServer
from tests.amqp.raw import ATTACH, CLOSE, DETACH, DISPOSITION, TRANSFER, RawClient, attach_frame, flow_frame, frame

QUEUES = ["outcomes", "closing", "dropped"]
SND_UNSETTLED, RCV_SECOND = 0, 1


@pytest.fixture(scope="module")
def server() -> Iterator[InProcessServer]:
    srv = InProcessServer(AmqpLimits(), QUEUES).start()
    yield srv
    srv.stop()


def _fill(server: InProcessServer, queue: str, count: int) -> None:
    async def send() -> None:
        assert server.namespace is not None
        await server.namespace.send(queue, [Message(body=f"m{i}".encode(), message_id=str(i)) for i in range(count)])

    server.run(send)


def _receiving(server: InProcessServer, client: RawClient, queue: str, count: int) -> tuple[list[int], list[bytes]]:
    """A peek-lock receiver of ``queue`` given ``count`` credit; the delivery ids of its ``count`` transfers, and
    the list every write to the client's transport is recorded in from then on."""
    client.handshake()
    assert client.put_token(queue) == 202
    client.send(
        attach_frame("receiver", 1, queue, sender=False, send_settle_mode=SND_UNSETTLED, rcv_settle_mode=RCV_SECOND)
    )
    client.expect(ATTACH)
    client.send(flow_frame(1, count))
    ids = [client.expect(TRANSFER).fields[1] for _ in range(count)]
    writes: list[bytes] = []

    async def spy() -> None:
        socket = _connection(server).socket
        assert socket is not None
        write = socket.write

        def recorded(data: bytes | bytearray | memoryview) -> None:
            writes.append(bytes(data))
            write(data)

        socket.write = recorded  # type: ignore[method-assign]

    server.run(spy)
    return ids, writes


def _connection(server: InProcessServer) -> AmqpConnection:
    assert server.server is not None
    (conn,) = [c for c in server.server.connections if not c.closed]
    return conn


def _detach_all(conn: AmqpConnection) -> None:
    """Detach every link in one go: the first detach is written at once, the next ones a moment later wait for
    the turn's write."""
    for link in list(conn.connection.links):
        conn.close_link(link, proton.Condition("amqp:link:detach-forced", "going"))


def test_outcomes_confirmed_together_leave_in_one_write_in_order(server: InProcessServer) -> None:
    count = 10
    _fill(server, "outcomes", count)
    with RawClient(server.port) as client:
        ids, writes = _receiving(server, client, "outcomes", count)
        # one disposition for all: the server completes each, the store confirms them in one unit
        client.send(frame(DispositionFrame(True, ids[0], ids[-1], False, Accepted(), None)))
        said: list[int] = []
        while len(said) < count:
            got = client.expect(DISPOSITION)
            first, last = got.fields[1], got.fields[2]
            assert (got.fields[3], got.fields[4]) == (True, {"accepted": []})
            said += range(first, (first if last is None else last) + 1)
        assert said == ids  # every outcome, each once, in the order of the deliveries
        server.run(_idle)  # (every write of the turn is recorded)
        # the first at once, the rest in one write at the end of the turn (a third if the server was preempted
        # for more than COALESCE_SECONDS within the burst): not one a completion
        assert len(writes) <= 3, [len(w) for w in writes]


async def _idle() -> None:
    return None


def test_output_waiting_for_the_turns_write_goes_out_before_a_close(server: InProcessServer) -> None:
    _fill(server, "closing", 1)
    with RawClient(server.port) as client:
        _receiving(server, client, "closing", 1)

        async def detach_then_close() -> None:  # in one turn: the detach waits for the flush, the close comes
            conn = _connection(server)
            _detach_all(conn)
            assert conn.connection.has_output()  # (what this test is about: output waiting for its write)
            conn.close()

        server.run(detach_then_close)
        codes = [f.code for f in client.frames_until_closed()]
        assert codes[-2:] == [DETACH, CLOSE] and codes.count(DETACH) == 3, codes  # ($cbs's two links and ours)


def test_output_waiting_for_the_turns_write_is_not_written_after_a_drop(server: InProcessServer) -> None:
    _fill(server, "dropped", 1)
    with RawClient(server.port) as client:
        _, writes = _receiving(server, client, "dropped", 1)

        written_before_drop: list[int] = []

        async def detach_then_drop() -> None:
            conn = _connection(server)
            _detach_all(conn)
            assert conn.connection.has_output()
            written_before_drop.append(len(writes))
            conn.drop()

        server.run(detach_then_drop)
        server.run(_idle)
        codes = [f.code for f in client.frames_until_closed()]
        # cut without a word, as a network failure: what waited for the turn's write is never written
        assert len(writes) == written_before_drop[0] and codes.count(DETACH) < 3, (codes, writes)
