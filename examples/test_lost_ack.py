import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage


@pytest.mark.oncebus_entities(queues={"orders": {"requires_duplicate_detection": True}})
def test_every_order_arrives_once_though_an_ack_is_lost(oncebus_namespace):
    oncebus_namespace.arm_fault("lost-ack", "orders", after=2)  # the 3rd send is stored, its ack lost
    orders = [f"order {i}" for i in range(5)]
    with ServiceBusClient.from_connection_string(oncebus_namespace.connection_string) as client:
        with client.get_queue_sender("orders") as sender:  # the SDK's retry policy resends the 3rd
            for order in orders:
                sender.send_messages(ServiceBusMessage(order, message_id=order))
        received = []
        with client.get_queue_receiver("orders") as receiver:
            while batch := receiver.receive_messages(max_message_count=10, max_wait_time=1):
                for message in batch:
                    received.append(str(message))
                    receiver.complete_message(message)
    assert sorted(received) == orders  # each once; without duplicate detection "order 2" comes twice
