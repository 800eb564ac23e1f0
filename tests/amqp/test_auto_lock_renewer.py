"""AutoLockRenewer with many registered messages per receiver, sync and aio, while the receiver keeps working.

The SDK's renewer sends its renew-lock requests from several threads (sync) or
tasks (aio) over the receiver's one session, whose delivery-id counter the SDK
does not lock: transfers can repeat or reorder delivery-ids. The server
answers each under the id it came with (see ``oncebus.amqp.frames``); these tests hold 20 locks of
10 s for longer than a lock period and then complete every message. With
10 s locks the SDK renews every message continuously (it renews whatever
expires within 10 s). Locks of 5 s were lost on a loaded CI machine: the
SDK's renewing threads were starved of CPU for longer than the lock (the
server answered message-lock-lost, as Service Bus does for an expired lock).
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

from azure.servicebus import AutoLockRenewer, ServiceBusClient, ServiceBusMessage, ServiceBusReceivedMessage

from tests.amqp.test_sdk_capabilities import drain

HELD = 20
EXTRA = 10
HOLD_SECONDS = 15.0  # the queues' locks last 10 s
WORK_SECONDS = 60.0  # bound on receiving the extra messages on a loaded machine


def test_auto_lock_renewer_keeps_many_locks_while_the_receiver_keeps_receiving(connection_string: str) -> None:
    failures: list[BaseException | None] = []
    with ServiceBusClient.from_connection_string(connection_string) as client:
        with client.get_queue_sender("renew") as sender:
            sender.send_messages([ServiceBusMessage(b"r", message_id=f"r{i}") for i in range(HELD)])
        with client.get_queue_receiver("renew") as receiver:
            held: list[ServiceBusReceivedMessage] = []
            while len(held) < HELD:
                held += receiver.receive_messages(max_message_count=HELD - len(held), max_wait_time=5)
            renewer = AutoLockRenewer(
                max_lock_renewal_duration=60, on_lock_renew_failure=lambda _m, error: failures.append(error)
            )
            for message in held:
                renewer.register(receiver, message)
            with client.get_queue_sender("renew") as sender:
                sender.send_messages([ServiceBusMessage(b"e", message_id=f"e{i}") for i in range(EXTRA)])
            # the receiving thread keeps using the receiver (receive, complete) while the renewer's threads renew
            worked: list[str | None] = []
            started = time.monotonic()
            while (time.monotonic() < started + HOLD_SECONDS or len(worked) < EXTRA) and (
                time.monotonic() < started + WORK_SECONDS
            ):
                for message in receiver.receive_messages(max_message_count=3, max_wait_time=0.5):
                    receiver.complete_message(message)
                    worked.append(message.message_id)
                # the SDK's reading thread holds its socket lock while it waits for a frame (up to 0.2 s at a
                # time, taken again at once), which starves the renewer's threads: give them room, as
                # processing the messages would
                time.sleep(0.5)
            assert sorted(worked) == sorted(f"e{i}" for i in range(EXTRA))
            # stop renewing before settling: a renewal the SDK already started can otherwise reach the server
            # just after the complete and be answered message-lock-lost, as Service Bus answers it
            renewer.close()
            now = datetime.now(UTC)
            assert all(message.locked_until_utc > now for message in held)
            for message in held:
                receiver.complete_message(message)
        assert [repr(getattr(error, "inner_exception", error)) for error in failures] == []
        assert drain(client, "renew") == []


def test_async_auto_lock_renewer_keeps_many_locks(connection_string: str) -> None:
    from azure.servicebus.aio import AutoLockRenewer as AsyncAutoLockRenewer
    from azure.servicebus.aio import ServiceBusClient as AsyncClient

    failures: list[BaseException | None] = []

    async def on_failure(_message: object, error: BaseException | None) -> None:
        failures.append(error)

    async def run() -> list[str]:
        async with AsyncClient.from_connection_string(connection_string) as client:
            async with client.get_queue_sender("renewaio") as sender:
                await sender.send_messages([ServiceBusMessage(b"a", message_id=f"a{i}") for i in range(HELD)])
            async with client.get_queue_receiver("renewaio") as receiver:
                held: list[ServiceBusReceivedMessage] = []
                while len(held) < HELD:
                    held += await receiver.receive_messages(max_message_count=HELD - len(held), max_wait_time=5)
                renewer = AsyncAutoLockRenewer(max_lock_renewal_duration=60, on_lock_renew_failure=on_failure)
                for message in held:
                    renewer.register(receiver, message)
                # the receiver keeps receiving (nothing arrives) while the renewer's tasks renew
                deadline = time.monotonic() + HOLD_SECONDS
                while time.monotonic() < deadline:
                    assert await receiver.receive_messages(max_wait_time=1) == []
                await renewer.close()  # before settling (see the sync test)
                now = datetime.now(UTC)
                assert all(message.locked_until_utc > now for message in held)
                for message in held:
                    await receiver.complete_message(message)
                return [str(message.message_id) for message in held]

    completed = asyncio.run(run())
    assert sorted(completed) == sorted(f"a{i}" for i in range(HELD))
    assert failures == []
    with ServiceBusClient.from_connection_string(connection_string) as client:
        assert drain(client, "renewaio") == []
