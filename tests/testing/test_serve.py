"""``oncebus.testing.serve()`` against the real azure-servicebus SDK."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode
from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient

from oncebus.core.errors import EntityAlreadyExistsError, InvalidArgumentError
from oncebus.testing import MODES, BrokerGoneError, BrokerStartError, Mode, OncebusServer, serve

CONFIG = {
    "UserConfig": {
        "Namespaces": [
            {
                "Name": "sbemulatorns",
                "Queues": [{"Name": "orders", "Properties": {"RequiresDuplicateDetection": True}}],
                "Topics": [{"Name": "events", "Properties": {}, "Subscriptions": [{"Name": "audit"}]}],
            }
        ]
    }
}


def send(server: OncebusServer, queue: str, *messages: ServiceBusMessage) -> None:
    with ServiceBusClient.from_connection_string(server.connection_string) as client:
        with client.get_queue_sender(queue) as sender:
            for message in messages:
                sender.send_messages(message)


def receive(server: OncebusServer, queue: str, *, wait: float = 5) -> list[str]:
    with ServiceBusClient.from_connection_string(server.connection_string) as client:
        with client.get_queue_receiver(queue, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as receiver:
            return [str(m) for m in receiver.receive_messages(max_message_count=50, max_wait_time=wait)]


@pytest.fixture(scope="module")
def server() -> OncebusServer:
    with serve(config=CONFIG) as running:
        yield running  # type: ignore[misc]


@pytest.fixture
def fresh(server: OncebusServer) -> OncebusServer:
    server.reset()
    return server


@pytest.mark.parametrize("mode", MODES)
def test_serve_answers_the_sdk_on_a_free_port_and_removes_its_temporary_directory(mode: Mode) -> None:
    with serve(mode=mode) as server:
        assert server.mode == mode
        assert (int(server.info["pid"]) == os.getpid()) == (mode == "thread")
        assert server.port not in (0, 5672)
        assert "ready" in server.output() and "Warning" not in server.output()
        assert f"Endpoint=sb://127.0.0.1:{server.port};" in server.connection_string
        assert server.data_dir.is_dir() and (server.data_dir / "server.json").is_file()
        info = json.loads((server.data_dir / "server.json").read_text())
        assert server.ca_file == Path(info["ca_file"]) and server.ca_file.is_relative_to(server.data_dir)
        assert server.ca_file.read_text().startswith("-----BEGIN CERTIFICATE-----")
        assert server.tls_port not in (None, 0, 5671) and server.http_port not in (None, 0, 5300)
        server.create_queue("orders", requires_duplicate_detection=True)
        send(server, "orders", ServiceBusMessage("a", message_id="1"), ServiceBusMessage("a", message_id="1"))
        assert server.stats("orders")["duplicates_dropped"] == 1
        server.advance(timedelta(minutes=11))
        send(server, "orders", ServiceBusMessage("a", message_id="1"))
        assert server.stats("orders")["accepted"] == 2
        work = server.data_dir.parent
    assert not work.exists()
    assert not server.alive
    if mode == "subprocess":  # a clean exit on SIGTERM, no abort at interpreter shutdown
        assert server.output().endswith("(oncebus serve exited with code 0)"), server.output()


def test_the_config_dict_creates_entities_at_start(server: OncebusServer) -> None:
    # the module's server was started with CONFIG and not reset yet in this test
    assert server.stats("orders")["requires_duplicate_detection"] is True
    assert [s["name"] for s in server.control("subscription.list", topic="events")] == ["audit"]


def test_entity_helpers_take_sdk_or_emulator_property_names(fresh: OncebusServer) -> None:
    queue = fresh.create_queue(
        "payments", requires_duplicate_detection=True, duplicate_detection_history_time_window=timedelta(minutes=2)
    )
    assert queue["duplicate_detection_history_time_window"] == "PT2M"
    assert fresh.create_topic("events", RequiresDuplicateDetection=True)["requires_duplicate_detection"] is True
    assert fresh.create_subscription("events", "audit", LockDuration="PT5S")["lock_duration"] == "PT5S"
    with pytest.raises(EntityAlreadyExistsError):
        fresh.create_queue("payments")
    with pytest.raises(InvalidArgumentError, match="colour: unknown queue property"):
        fresh.create_queue("bad", colour="blue")
    assert set(fresh.stats()) == {"payments", "events"}
    fresh.delete_subscription("events", "audit")
    fresh.delete_topic("events")
    fresh.delete_queue("payments")
    assert fresh.stats() == {}


def test_create_entities_merges_a_config_and_declarations(fresh: OncebusServer) -> None:
    fresh.create_entities(CONFIG, queues={"orders": {"max_delivery_count": 3}, "plain": None})
    orders = fresh.control("queue.show", name="orders")
    assert (orders["requires_duplicate_detection"], orders["max_delivery_count"]) == (True, 3)
    assert {q["name"] for q in fresh.control("queue.list")} == {"orders", "plain"}
    with pytest.raises(
        InvalidArgumentError,
        match=r"^declared entities: subscription 't/s': Properties.colour: unknown subscription property",
    ):
        fresh.create_entities(topics={"t": {"subscriptions": {"s": {"colour": "blue"}}}})


def test_reset_deletes_messages_and_dedup_history_and_brings_the_clock_back(fresh: OncebusServer) -> None:
    fresh.create_queue("orders", requires_duplicate_detection=True)
    send(fresh, "orders", ServiceBusMessage("old", message_id="m1"))
    fresh.advance(timedelta(days=2))
    fresh.reset()
    assert fresh.stats() == {}
    assert abs(fresh.now() - datetime.now(UTC)) < timedelta(minutes=1)
    fresh.create_queue("orders", requires_duplicate_detection=True)
    send(fresh, "orders", ServiceBusMessage("new", message_id="m1"))
    stats = fresh.stats("orders")
    assert (stats["accepted"], stats["duplicates_dropped"], stats["active_message_count"]) == (1, 0, 1)
    assert receive(fresh, "orders") == ["new"]


def test_advance_moves_past_the_window_without_sleeping(fresh: OncebusServer) -> None:
    fresh.create_queue("orders", requires_duplicate_detection=True, duplicate_detection_history_time_window="PT1M")
    send(fresh, "orders", ServiceBusMessage("first", message_id="o1"), ServiceBusMessage("retry", message_id="o1"))
    before = fresh.now()
    after = fresh.advance(timedelta(seconds=90))
    assert after - before >= timedelta(seconds=90)
    send(fresh, "orders", ServiceBusMessage("late", message_id="o1"))
    stats = fresh.stats("orders")
    assert (stats["accepted"], stats["duplicates_dropped"], stats["late_resends"]) == (2, 1, 1)
    assert receive(fresh, "orders") == ["first", "late"]


def test_advance_applies_scheduled_messages_and_ttl_at_once(fresh: OncebusServer) -> None:
    fresh.create_queue("jobs", dead_lettering_on_message_expiration=True)
    with ServiceBusClient.from_connection_string(fresh.connection_string) as client:
        with client.get_queue_sender("jobs") as sender:
            sender.schedule_messages(ServiceBusMessage("later"), fresh.now() + timedelta(hours=1))
            sender.send_messages(ServiceBusMessage("short-lived", time_to_live=timedelta(minutes=5)))
    stats = fresh.stats("jobs")
    assert (stats["scheduled_message_count"], stats["active_message_count"], stats["dead_letter_message_count"]) == (
        1,
        1,
        0,
    )
    fresh.advance(timedelta(hours=1, seconds=1))
    stats = fresh.stats("jobs")  # straight after advance() returns: no wait for a timer
    assert (stats["scheduled_message_count"], stats["active_message_count"], stats["dead_letter_message_count"]) == (
        0,
        1,
        1,
    )
    assert receive(fresh, "jobs") == ["later"]
    assert [m["body"] for m in fresh.peek("jobs/$DeadLetterQueue")] == ["short-lived"]


def test_advance_expires_a_lock_and_the_message_is_delivered_again(fresh: OncebusServer) -> None:
    fresh.create_queue("work", lock_duration="PT30S")
    send(fresh, "work", ServiceBusMessage("task"))
    with ServiceBusClient.from_connection_string(fresh.connection_string) as client:
        with client.get_queue_receiver("work") as first:
            (locked,) = first.receive_messages(max_message_count=1, max_wait_time=5)
            assert locked.delivery_count == 0  # the SDK counts earlier deliveries
            fresh.advance(timedelta(seconds=31))
            with client.get_queue_receiver("work") as second:
                again = second.receive_messages(max_message_count=1, max_wait_time=5)
    assert [(str(m), m.delivery_count) for m in again] == [("task", 1)]


def test_advance_only_moves_forward_and_needs_the_test_clock(fresh: OncebusServer) -> None:
    with pytest.raises(ValueError, match="only moves forward"):
        fresh.advance(timedelta(seconds=-1))
    with serve(test_clock=False) as server:
        with pytest.raises(RuntimeError, match="test_clock=False"):
            server.advance(60)


def test_async_with_and_the_aio_sdk() -> None:
    async def main() -> list[str]:
        async with serve() as server:
            server.create_queue("orders", requires_duplicate_detection=True)
            async with AsyncServiceBusClient.from_connection_string(server.connection_string) as client:
                async with client.get_queue_sender("orders") as sender:
                    await sender.send_messages(ServiceBusMessage("a", message_id="1"))
                    await sender.send_messages(ServiceBusMessage("a", message_id="1"))
                async with client.get_queue_receiver(
                    "orders", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
                ) as receiver:
                    got = [str(m) for m in await receiver.receive_messages(max_message_count=10, max_wait_time=5)]
            assert server.stats("orders")["duplicates_dropped"] == 1
            return got

    assert asyncio.run(main()) == ["a"]


def test_a_given_data_dir_is_kept_and_served_again(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with serve(data_dir=data) as server:
        server.create_queue("orders", requires_duplicate_detection=True)
        send(server, "orders", ServiceBusMessage("a", message_id="1"))
    assert (data / "oncebus.db").is_file()
    with serve(data_dir=data) as server:
        send(server, "orders", ServiceBusMessage("a", message_id="1"))
        stats = server.stats("orders")
        assert (stats["accepted"], stats["duplicates_dropped"]) == (1, 1)


@pytest.mark.parametrize("mode", MODES)
def test_a_broker_that_cannot_start_says_why(mode: Mode) -> None:
    bad = {"UserConfig": {"Namespaces": [{"Queues": [{"Name": "q", "Properties": {"Colour": "blue"}}]}]}}
    with pytest.raises(BrokerStartError, match="Colour: unknown queue property"):
        with serve(mode=mode, config=bad):
            pass


def test_a_busy_data_dir_is_refused_in_both_modes(tmp_path: Path) -> None:
    with serve(data_dir=tmp_path / "data"):
        for mode in MODES:
            with pytest.raises(BrokerStartError, match="already in use by oncebus"):
                with serve(mode=mode, data_dir=tmp_path / "data"):
                    pass


def test_thread_mode_leaves_the_test_process_garbage_collector_as_it_was() -> None:
    gc.freeze()  # a test process that froze objects of its own (the broker must not freeze more of them)
    try:
        threshold, frozen = gc.get_threshold(), gc.get_freeze_count()
        with serve(mode="thread") as server:  # (frozen objects may die meanwhile: the count never grows)
            assert gc.get_threshold() == threshold and gc.get_freeze_count() <= frozen
            assert server.stats() == {}
        assert gc.get_threshold() == threshold and gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()


def test_a_crashed_broker_is_reported_with_its_output() -> None:
    with serve() as server:
        os.kill(int(server.info["pid"]), signal.SIGKILL)
        with pytest.raises(BrokerGoneError, match="exited with code -9"):
            for _ in range(100):  # the kill is asynchronous
                server.stats()
        assert not server.alive
        assert "ready" in server.output()


@pytest.mark.parametrize("mode", MODES)
def test_keys_replace_the_default_key(mode: Mode) -> None:
    with serve(mode=mode, keys={"tester": "c2VjcmV0a2V5"}) as server:
        assert "SharedAccessKeyName=tester;SharedAccessKey=c2VjcmV0a2V5;" in server.connection_string
        server.create_queue("q")
        send(server, "q", ServiceBusMessage("signed with the given key"))
        assert server.stats("q")["active_message_count"] == 1


def test_a_subprocess_brokers_keys_are_not_on_its_command_line() -> None:
    """Any local user reads /proc/PID/cmdline: the keys travel in the environment instead."""
    with serve(mode="subprocess", keys={"tester": "c2VjcmV0a2V5"}) as server:
        cmdline = Path(f"/proc/{server.info['pid']}/cmdline").read_bytes()
        assert b"c2VjcmV0a2V5" not in cmdline
        server.create_queue("q")
        send(server, "q", ServiceBusMessage("signed with the given key"))


def test_a_subprocess_broker_stops_when_its_test_process_is_killed(tmp_path: Path) -> None:
    """SIGKILL leaves no fixture teardown to run; the broker must not outlive the tests anyway."""
    script = tmp_path / "killed.py"
    script.write_text(
        "import os, signal\n"
        "from oncebus.testing import serve\n"
        "context = serve()\n"
        "server = context.start()\n"
        "print(server.info['pid'], server.data_dir.parent, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert result.returncode == -signal.SIGKILL, result.stderr
    pid, work = result.stdout.split()
    deadline = time.monotonic() + 20
    while (_running(int(pid)) or Path(work).exists()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(int(pid))
    assert not Path(work).exists()


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has exited; only its parent's wait is missing
