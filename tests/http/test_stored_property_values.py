"""A message stored with an application property no door carries any more (an integer past 64 bits, sent over
REST before the doors refused it: issue 33 item 2) never stops a queue: ``oncebus serve`` moves it to the
dead-letter queue when it comes up for delivery, and its receivers get the others. From the dead-letter queue it
is delivered with that value as text, and why in its DeadLetterErrorDescription."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from azure.servicebus import ServiceBusClient, ServiceBusReceiveMode, ServiceBusSubQueue

from oncebus.auth import make_token
from oncebus.broker import Namespace
from oncebus.broker.clock import ManualClock
from oncebus.core.messages import Message
from oncebus.store.base import UpdateMessage
from oncebus.store.sqlite import SqliteStore
from tests.http.conftest import Served, start_server

BIG = 10**30
QUEUES = ("peeklock", "deleting")


def _stored_before_the_doors_refused(data: Path) -> None:
    """Each queue: ``before``, ``poison``, ``after``; then ``poison`` gets a property past 64 bits, through the
    store (as a REST send stored it before; no door admits one any more)."""

    async def seed() -> None:
        store = SqliteStore(data / "oncebus.db")
        namespace = await Namespace.open(store, ManualClock(int(time.time() * 1_000_000)))
        for queue in QUEUES:
            await namespace.create_queue(queue)
            sent = [Message(body, message_id=body.decode()) for body in (b"before", b"poison", b"after")]
            sent[1].application_properties = {"kept": "yes"}
            await namespace.send(queue, sent)
        await namespace.close()
        for queue in QUEUES:
            store.submit([UpdateMessage(queue, 2, 0, 0, {"x-big": BIG})]).result()
        store.close()

    data.mkdir(parents=True)
    asyncio.run(seed())


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    _stored_before_the_doors_refused(tmp_path / "data")
    server = start_server(tmp_path / "data")
    yield server
    server.stop()


def _bodies(messages: list) -> list[bytes]:  # type: ignore[type-arg]
    return [b"".join(m.body) for m in messages]


def _text_keys(properties: dict) -> dict:  # type: ignore[type-arg]
    def text(value: object) -> object:
        return value.decode() if isinstance(value, bytes) else value

    return {text(k): text(v) for k, v in properties.items()}


def test_a_stored_message_no_door_can_encode_is_dead_lettered_and_the_others_are_delivered(served: Served) -> None:
    with ServiceBusClient.from_connection_string(served.connection_string) as sb:
        with sb.get_queue_receiver("peeklock", max_wait_time=5) as receiver:
            got = receiver.receive_messages(max_message_count=10, max_wait_time=5)
            got += receiver.receive_messages(max_message_count=10, max_wait_time=2)
            assert _bodies(got) == [b"before", b"after"]
            for message in got:
                receiver.complete_message(message)
        mode = ServiceBusReceiveMode.RECEIVE_AND_DELETE
        with sb.get_queue_receiver("deleting", receive_mode=mode, max_wait_time=5) as receiver:
            got = receiver.receive_messages(max_message_count=10, max_wait_time=5)
            got += receiver.receive_messages(max_message_count=10, max_wait_time=2)
            assert _bodies(got) == [b"before", b"after"]
        for queue in QUEUES:  # nothing lost: the poison waits in the dead-letter queue, its value as text
            dead_letters = sb.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=5)
            with dead_letters as receiver:
                (dead,) = receiver.receive_messages(max_message_count=10, max_wait_time=5)
                assert b"".join(dead.body) == b"poison" and dead.message_id == "poison"
                assert dead.dead_letter_reason == "InvalidApplicationProperty"
                description = dead.dead_letter_error_description or ""
                assert "'x-big'" in description and "2**64 - 1" in description, description
                properties = _text_keys(dict(dead.application_properties or {}))
                assert properties["x-big"] == str(BIG) and properties["kept"] == "yes"
                receiver.complete_message(dead)
    log = "\n".join(served.output)
    assert "Traceback" not in log and "OverflowError" not in log
    assert "cannot be delivered as it was stored" in log  # and the operator is told


def test_rest_receives_it_from_the_dead_letter_queue_with_the_value_as_text(served: Served) -> None:
    where = f"http://127.0.0.1:{served.http_port}"
    token = make_token(where + "/", "RootManageSharedAccessKey", "SAS_KEY_VALUE", int(time.time()) + 600)
    headers = {"Authorization": token}
    bodies = []
    for _ in range(3):
        answer = requests.delete(f"{where}/peeklock/messages/head?timeout=1", headers=headers, timeout=10)
        if answer.status_code == 204:
            break
        assert answer.status_code == 200, answer.text
        bodies.append(answer.content)
    assert bodies == [b"before", b"after"]
    dead = requests.delete(f"{where}/peeklock/$DeadLetterQueue/messages/head?timeout=1", headers=headers, timeout=10)
    assert dead.status_code == 200 and dead.content == b"poison", dead.text
    assert dead.headers["x-big"] == f'"{BIG}"'
