"""``$management`` operations at the level the Python SDK meets them: ``get-message-sessions`` with its
last-updated-time filter (``ServiceBusClient.list_queue_sessions(state_updated_after=...)``), and the deadline for a
connection's first CBS token.

The listener runs in this process on a ManualClock (the broker's time moves when the test says, no waiting).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

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
        await server.namespace.create_queue("plain")
        await server.namespace.create_topic("orders")
        await server.namespace.create_subscription("orders", "audit")

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
    assert AmqpLimits().auth_timeout == 20.0


def _request(receiver: Any, operation: str, body: dict[str, Any]) -> tuple[int, Any, str]:
    """A raw request on the receiver's $management node through the SDK's own request-response link."""

    def answer(status: int, message: Any, description: str, *_: Any, **__: Any) -> tuple[int, Any, str]:
        return status, message, description

    status, message, description = receiver._mgmt_request_response_with_retry(
        b"com.microsoft:" + operation.encode(), body, answer
    )
    return status, message, description.decode() if isinstance(description, bytes) else str(description)


def test_rule_and_batch_delete_requests_are_checked_and_rules_round_trip(listener: InProcessServer) -> None:
    """The request maps as the .NET SDK writes them (typed correlation properties, the name repeated inside the
    description), answered as Service Bus's described lists; wrong input is refused (400) naming what is allowed."""
    when = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    description = {
        "correlation-filter": {"label": "vip", "properties": {"tier": 3, "ratio": 0.5, "gold": True, "since": when}},
        "sql-rule-action": {"expression": "SET routed = 1"},
        "rule-name": "vip",
    }
    with _client(listener) as client:
        with client.get_subscription_receiver("orders", "audit") as receiver:
            assert _request(receiver, "add-rule", {"rule-name": "vip", "rule-description": description})[0] == 200
            status, message, _ = _request(receiver, "enumerate-rules", {"top": 10, "skip": 0})
            assert status == 200
            # pyamqp hands out described values without their descriptors (the JS test reads those)
            rules = [rule[b"rule-description"] for rule in message.value[b"rules"]]
            assert [rule[2] for rule in rules] == [b"$Default", b"vip"]
            default_filter, default_action = rules[0][:2]
            assert default_filter == [b"1=1", 20] and default_action == []
            vip_filter, vip_action, _, created = rules[1]
            assert vip_filter[:8] == [None, None, None, None, b"vip", None, None, None]
            since_ms = int(when.timestamp() * 1000)
            assert vip_filter[8] == {b"tier": 3, b"ratio": 0.5, b"gold": True, b"since": since_ms}
            assert vip_action == [b"SET routed = 1", 20] and created > 0
            bad_key = {"rule-name": "x", "rule-description": {"sql-filter": {"expression": "1=1"}, "filters": 1}}
            status, _, text = _request(receiver, "add-rule", bad_key)
            assert status == 400 and "'filters'" in text and "sql-filter" in text
            status, _, text = _request(receiver, "batch-delete-messages", {"message-count": 501})
            assert status == 400 and "500" in text
        with client.get_queue_receiver("plain") as receiver:
            status, _, text = _request(receiver, "enumerate-rules", {"top": 10, "skip": 0})
            assert status == 400 and "Subscriptions" in text
