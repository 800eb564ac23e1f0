"""A receiver's settlements give the same outcomes whichever way the server reads them.

A client's disposition of its peek-locked deliveries goes straight from the frame to the broker when nothing
else waits in the same read (docs/performance-log.md, "Receive + complete: one path from the disposition to
its outcome"), and through the connection's events otherwise (a flow read before it, a transaction, a fault).
The SDK's receivers meet the first; a raw client puts a flow before a disposition in one write to meet the
second, and a range of deliveries in one disposition; the outcomes and what the queue holds after are the same.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode, ServiceBusSubQueue
from azure.servicebus._pyamqp.outcomes import Accepted, Modified, Released
from azure.servicebus._pyamqp.performatives import DispositionFrame

from tests.amqp.conftest import ServerProcess, topology
from tests.amqp.raw import ATTACH, DISPOSITION, TRANSFER, RawClient, attach_frame, flow_frame, frame

SND_UNSETTLED, RCV_SECOND = 0, 1


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    queues = {name: {"MaxDeliveryCount": 10} for name in ("sdk", "wire", "ranges", "others", "counts")}
    process = ServerProcess(tmp_path_factory.mktemp("settle") / "data", topology(queues, {})).start()
    yield process
    process.stop()


def _fill(server: ServerProcess, queue: str, count: int) -> None:
    with ServiceBusClient.from_connection_string(server.connection_string) as client:
        with client.get_queue_sender(queue) as sender:
            sender.send_messages([ServiceBusMessage(f"m{i}", message_id=str(i)) for i in range(count)])


def _left(server: ServerProcess, queue: str) -> dict[str, int]:
    """message id -> delivery count of what ``queue`` holds, received (and deleted) now."""
    with ServiceBusClient.from_connection_string(server.connection_string) as client:
        with client.get_queue_receiver(queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as receiver:
            got = receiver.receive_messages(max_message_count=50, max_wait_time=2)
            return {str(m.message_id): m.delivery_count or 0 for m in got}


def test_an_sdk_receiver_completes_abandons_defers_and_dead_letters(server: ServerProcess) -> None:
    _fill(server, "sdk", 8)
    with ServiceBusClient.from_connection_string(server.connection_string) as client:
        with client.get_queue_receiver("sdk", max_wait_time=5) as receiver:
            got: list = []
            while len(got) < 8:
                batch = receiver.receive_messages(max_message_count=8, max_wait_time=5)
                assert batch, f"received {len(got)} of 8"
                got += batch
            by_id = {str(m.message_id): m for m in got}
            for i in (0, 1, 2):
                receiver.complete_message(by_id[str(i)])
            receiver.abandon_message(by_id["3"])
            receiver.abandon_message(by_id["4"])
            receiver.defer_message(by_id["5"])
            receiver.dead_letter_message(by_id["6"], reason="bad", error_description="cannot parse")
            receiver.complete_message(by_id["7"])
            with pytest.raises(Exception, match="already settled"):  # completed already (the SDK knows)
                receiver.complete_message(by_id["0"])
            (deferred,) = receiver.receive_deferred_messages([by_id["5"].sequence_number])
            receiver.complete_message(deferred)
        with client.get_queue_receiver("sdk", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dead:
            (letter,) = dead.peek_messages(max_message_count=5)
            assert (str(letter.message_id), letter.dead_letter_reason) == ("6", "bad")
            assert letter.dead_letter_error_description == "cannot parse"
    assert _left(server, "sdk") == {"3": 1, "4": 1}  # abandoned: available again, one delivery counted


def test_a_peek_shows_the_delivery_count_the_receive_shows_after_an_abandon(server: ServerProcess) -> None:
    """As on Service Bus: the count is the attempts that failed (an abandon, a lock that expired), 0 on the first
    receive in this SDK (it shows the AMQP header's count, as the service sends it); a peek of the message shows
    the same count as the receive that comes next, and while it is locked the count its delivery showed."""
    _fill(server, "counts", 1)
    with ServiceBusClient.from_connection_string(server.connection_string) as client:
        with client.get_queue_receiver("counts", max_wait_time=5) as receiver:
            assert [m.delivery_count for m in receiver.peek_messages(5, sequence_number=1)] == [0]
            (first,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            assert first.delivery_count == 0
            assert [m.delivery_count for m in receiver.peek_messages(5, sequence_number=1)] == [0]  # locked
            receiver.abandon_message(first)
            assert [m.delivery_count for m in receiver.peek_messages(5, sequence_number=1)] == [1]
            (second,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            assert (second.message_id, second.delivery_count) == (first.message_id, 1)
            assert [m.delivery_count for m in receiver.peek_messages(5, sequence_number=1)] == [1]  # locked
            receiver.abandon_message(second)
            assert [m.delivery_count for m in receiver.peek_messages(5, sequence_number=1)] == [2]
    assert _left(server, "counts") == {"0": 2}


@contextmanager
def _raw_receiver(server: ServerProcess, queue: str, count: int) -> Iterator[tuple[RawClient, list[int]]]:
    """``count`` messages sent to ``queue``, then a raw client with a peek-lock receiver of it on handle 1 given
    ``count`` credit: the client and the delivery ids of the ``count`` transfers."""
    _fill(server, queue, count)
    with RawClient(server.port) as client:
        client.handshake()
        assert client.put_token(queue) == 202
        client.send(
            attach_frame("receiver", 1, queue, sender=False, send_settle_mode=SND_UNSETTLED, rcv_settle_mode=RCV_SECOND)
        )
        client.expect(ATTACH)
        client.send(flow_frame(1, count))
        transfers = [client.expect(TRANSFER) for _ in range(count)]
        assert all(t.fields[4] is not True for t in transfers)  # unsettled: peek-locked
        yield client, [t.fields[1] for t in transfers]


def _outcomes(client: RawClient, ids: set[int]) -> dict[int, tuple[bool, object]]:
    """delivery id -> (settled, state) of the server's dispositions until every one of ``ids`` has one."""
    said: dict[int, tuple[bool, object]] = {}
    while not ids <= set(said):
        got = client.expect(DISPOSITION)
        first, last = got.fields[1], got.fields[2]
        assert got.fields[0] is False  # the server's role: the sender
        for delivery_id in range(first, (first if last is None else last) + 1):
            said[delivery_id] = (got.fields[3], got.fields[4])
    return said


def test_a_completion_alone_and_after_a_flow_in_the_same_write_say_the_same(server: ServerProcess) -> None:
    with _raw_receiver(server, "wire", 4) as (client, ids):
        # alone in its write: straight from the frame
        client.send(frame(DispositionFrame(True, ids[0], None, False, Accepted(), None)))
        alone = _outcomes(client, {ids[0]})
        # a flow first in the same write: through the connection's events
        client.send(flow_frame(1, 0) + frame(DispositionFrame(True, ids[1], None, False, Accepted(), None)))
        after_flow = _outcomes(client, {ids[1]})
        assert alone[ids[0]] == after_flow[ids[1]] == (True, {"accepted": []})
        # released (an abandon that is no attempt) and modified (an abandon that is), alone and after a flow
        client.send(frame(DispositionFrame(True, ids[2], None, False, Released(), None)))
        client.send(flow_frame(1, 0) + frame(DispositionFrame(True, ids[3], None, False, Modified(True), None)))
        others = _outcomes(client, {ids[2], ids[3]})
        assert others[ids[2]] == (True, {"released": []})
        assert others[ids[3]][0] is True and "modified" in others[ids[3]][1]
    assert _left(server, "wire") == {"2": 0, "3": 1}


def test_a_range_of_completions_in_one_disposition(server: ServerProcess) -> None:
    with _raw_receiver(server, "ranges", 5) as (client, ids):
        client.send(frame(DispositionFrame(True, ids[0], ids[3], False, Accepted(), None)))
        said = _outcomes(client, set(ids[:4]))
        assert all(said[i] == (True, {"accepted": []}) for i in ids[:4])
        # an id the server never sent, in a range with one it did: the unknown one is ignored
        client.send(frame(DispositionFrame(True, ids[4], ids[4] + 10, False, Accepted(), None)))
        assert _outcomes(client, {ids[4]})[ids[4]] == (True, {"accepted": []})
    assert _left(server, "ranges") == {}


def test_a_completion_settled_by_the_client_gets_no_answer_and_completes(server: ServerProcess) -> None:
    with _raw_receiver(server, "others", 2) as (client, ids):
        client.send(frame(DispositionFrame(True, ids[0], None, True, Accepted(), None)))  # settled: no answer
        client.send(frame(DispositionFrame(True, ids[1], None, False, Accepted(), None)))
        said = _outcomes(client, {ids[1]})
        assert ids[0] not in said  # (the server's answers come in order: none came for the settled one)
    assert _left(server, "others") == {}
