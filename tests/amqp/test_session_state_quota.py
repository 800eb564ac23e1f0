"""Issue 33, item 4, where a user meets it: the azure-servicebus SDK against ``oncebus serve``, session states on a
1 MB queue.

The issue: 200 KB of state on each of 120 sessions of a 1 MB queue, 24 MB accepted, nothing refused. Session
states count toward the entity's size, as on Service Bus: ``session.set_state`` past it raises the SDK's
``ServiceBusQuotaExceededError`` (the error a send past it gets) and leaves the state as it was; the size the
administration client reports includes the states, after replacing and clearing one and after a restart.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusQuotaExceededError
from azure.servicebus.management import ServiceBusAdministrationClient

from tests.amqp.conftest import ServerProcess, topology

STATE = 200_000
FITS = 1024 * 1024 // (STATE + 256)  # 5: each state counts its size plus 256 bytes, as each message does


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("statequota")
    queues = {"small": {"RequiresSession": True, "MaxSizeInMegabytes": 1}}
    process = ServerProcess(base / "data", topology(queues, {})).start()
    yield process
    process.stop()


def _size(server: ServerProcess) -> int:
    ca_file = next(line for line in server.output if line.startswith("CA certificate: "))
    ca_file = ca_file.split(": ", 1)[1].split(" (", 1)[0]
    with ServiceBusAdministrationClient.from_connection_string(
        server.connection_string, connection_verify=ca_file
    ) as admin:
        return int(admin.get_queue_runtime_properties("small").size_in_bytes)


def _set_state(client: ServiceBusClient, session_id: str, state: bytes | None) -> None:
    with client.get_queue_receiver("small", session_id=session_id) as receiver:
        assert receiver.session is not None
        receiver.session.set_state(state)


def _get_state(client: ServiceBusClient, session_id: str) -> bytes | None:
    with client.get_queue_receiver("small", session_id=session_id) as receiver:
        assert receiver.session is not None
        state = receiver.session.get_state()
        return None if state is None else bytes(state)


def test_session_states_count_toward_the_queue_size(server: ServerProcess) -> None:
    with ServiceBusClient.from_connection_string(server.connection_string, retry_total=0) as client:
        accepted = 0
        with pytest.raises(ServiceBusQuotaExceededError, match="max_size_in_megabytes=1"):
            while accepted < 120:  # the 120 sessions of 200 KB: 24 MB
                _set_state(client, f"s{accepted}", b"x" * STATE)
                accepted += 1
        assert accepted == FITS
        assert _get_state(client, f"s{FITS}") is None  # the refused state was not set
        assert _size(server) == FITS * STATE

        with client.get_queue_sender("small") as sender:  # a send meets the room the states take
            with pytest.raises(ServiceBusQuotaExceededError, match="max_size_in_megabytes=1"):
                sender.send_messages(ServiceBusMessage(b"y" * 100_000, session_id="s0"))

        with pytest.raises(ServiceBusQuotaExceededError):  # a larger state refused: the old one stays
            _set_state(client, "s0", b"z" * (STATE + 100_000))
        assert _get_state(client, "s0") == b"x" * STATE

        _set_state(client, "s0", b"replaced")  # replacing and clearing free their room
        _set_state(client, "s1", None)
        size = (FITS - 2) * STATE + len(b"replaced")
        assert _size(server) == size
        with client.get_queue_sender("small") as sender:
            sender.send_messages(ServiceBusMessage(b"y" * 100_000, session_id="s0"))
        message_size = _size(server) - size  # the message as encoded: its body and its properties
        assert 100_000 < message_size < 100_200
        size += message_size

    server.restart()  # the states are stored: the size, and the room left, are the same after a restart
    assert _size(server) == size
    with ServiceBusClient.from_connection_string(server.connection_string, retry_total=0) as client:
        assert _get_state(client, "s0") == b"replaced"
        _set_state(client, "s1", b"x" * STATE)
        with pytest.raises(ServiceBusQuotaExceededError, match="max_size_in_megabytes=1"):
            _set_state(client, "s9", b"x" * STATE)
    assert _size(server) == size + STATE
