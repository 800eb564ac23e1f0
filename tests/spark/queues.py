"""What a queue of a test broker holds, as the administration client reports it."""

from __future__ import annotations

from azure.servicebus.management import ServiceBusAdministrationClient

from tests.amqp.conftest import ServerProcess


def active_messages(broker: ServerProcess, queue: str) -> int:
    """The queue's active message count (a locked message is active until it is settled)."""
    line = next(line for line in broker.output if line.startswith("CA certificate: "))
    ca_file = line.split(": ", 1)[1].split(" (", 1)[0]
    with ServiceBusAdministrationClient.from_connection_string(
        broker.connection_string, connection_verify=ca_file
    ) as admin:
        return int(admin.get_queue_runtime_properties(queue).active_message_count)
