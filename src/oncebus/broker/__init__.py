"""The broker engine: entities, send, receive, locks, sessions, scheduling, dead-letter, fan-out."""

from __future__ import annotations

from oncebus.broker.clock import Clock, ManualClock, SystemClock
from oncebus.broker.namespace import Namespace, SendOutcome
from oncebus.broker.receivable import SessionLock
from oncebus.core.messages import Message, MessageState, ReceivedMessage, ServiceBusReceiveMode

__all__ = [
    "Clock",
    "ManualClock",
    "Message",
    "MessageState",
    "Namespace",
    "ReceivedMessage",
    "SendOutcome",
    "ServiceBusReceiveMode",
    "SessionLock",
    "SystemClock",
]
