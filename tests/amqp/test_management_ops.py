"""``$management`` operations at the level the Python SDK meets them: ``get-message-sessions`` with its
last-updated-time filter (``ServiceBusClient.list_queue_sessions(state_updated_after=...)``), and the deadline for a
connection's first CBS token.

The listener runs in this process on a ManualClock (the broker's time moves when the test says, no waiting).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from oncebus.amqp.limits import AmqpLimits
from oncebus.amqp.sas import DEFAULT_KEY, DEFAULT_KEY_NAME
from oncebus.broker import ManualClock
from oncebus.core.timeutil import us_to_datetime
from tests.amqp.inprocess import InProcessServer


@pytest.fixture(scope="module")
def listener() -> Iterator[InProcessServer]:
    server = InProcessServer(AmqpLimits(), []).start()

    async def queues() -> None:
        assert server.namespace is not None
        await server.namespace.create_queue("sessions", requires_session=True)

    server.run(queues)
    yield server
    server.stop()


def _client(server: InProcessServer) -> ServiceBusClient:
    return ServiceBusClient.from_connection_string(
        f"Endpoint=sb://127.0.0.1:{server.port};SharedAccessKeyName={DEFAULT_KEY_NAME};"
        f"SharedAccessKey={DEFAULT_KEY};UseDevelopmentEmulator=true"
    )


def test_list_sessions_honours_the_state_updated_after_filter(listener: InProcessServer) -> None:
    """Failed before: the filter was ignored, so every session came back whatever the time asked."""
    assert listener.namespace is not None
    clock = listener.namespace.clock
    assert isinstance(clock, ManualClock)
    with _client(listener) as client:
        with client.get_queue_sender("sessions") as sender:
            sender.send_messages([ServiceBusMessage(b"x", session_id=sid) for sid in ("early", "late", "quiet")])
        with client.get_queue_receiver("sessions", session_id="early") as receiver:
            assert receiver.session is not None
            receiver.session.set_state(b"early-state")
        started_us = clock.now_us()
        clock.advance(60)
        with client.get_queue_receiver("sessions", session_id="late") as receiver:
            assert receiver.session is not None
            receiver.session.set_state(b"late-state")
        everything = sorted(client.list_queue_sessions("sessions"))
        since = sorted(
            client.list_queue_sessions("sessions", state_updated_after=us_to_datetime(started_us + 30_000_000))
        )
        before = sorted(
            client.list_queue_sessions("sessions", state_updated_after=us_to_datetime(started_us - 1_000_000))
        )
    assert everything == ["early", "late", "quiet"]  # no filter: sessions with messages or a state
    assert since == ["late"]  # only the state set after the time; a session with messages and no state is not
    assert before == ["early", "late"]


def test_a_connection_has_20_seconds_for_its_first_token_as_in_azure() -> None:
    """Failed before: 60 s. Azure closes a connection that has not put a CBS token within 20 s of its open
    (the behaviour itself, with a short timeout, is test_connection_bounds.py's)."""
    assert AmqpLimits().auth_timeout == 20.0
    assert AmqpLimits.from_env({}).auth_timeout == 20.0
