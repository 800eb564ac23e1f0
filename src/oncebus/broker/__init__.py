"""The broker engine: entities, send, receive, locks, sessions, scheduling, dead-letter, fan-out.

Front ends import engine names from here only (never a module of the package by path): the
namespace, its three ports (``Messaging``, ``Administration``, ``Observation``: see ``ports``),
clocks, the address helpers, and the types the ports speak in.
"""

from __future__ import annotations

from oncebus.broker.clock import Clock, FileClock, ManualClock, SystemClock
from oncebus.broker.counters import (
    HISTORY_KEPT_US,
    HISTORY_SAMPLE_US,
    EntityView,
    Histogram,
    ReceivableView,
    StoreCounters,
    suggest_window,
)
from oncebus.broker.faults import FAULT_KINDS, ArmedFault, FaultBook, FaultsDisabledError, FaultSpec
from oncebus.broker.namespace import Namespace
from oncebus.broker.observation import NamespaceObserver
from oncebus.broker.paths import EntityPath, address_path, parse_path, subscription_path
from oncebus.broker.ports import Administration, Broker, Messaging, Observation, TransportGauges
from oncebus.broker.receivable import SessionLock
from oncebus.broker.runtime_properties import (
    UNKNOWN_TIME,
    RuntimeProperties,
    queue_runtime_properties,
    subscription_runtime_properties,
    topic_runtime_properties,
)
from oncebus.broker.sending import SendOutcome
from oncebus.broker.stats import EntityStats
from oncebus.broker.transactions import (
    MAX_OPERATIONS,
    TIMEOUT_US,
    PendingSettlement,
    TransactionRollbackError,
    Transactions,
    TransactionSpanError,
    TransactionTimeoutError,
    UnknownTransactionError,
)
from oncebus.core.messages import Message, MessageState, ServiceBusReceiveMode
from oncebus.core.received import ReceivedMessage

__all__ = [
    "FAULT_KINDS",
    "HISTORY_KEPT_US",
    "HISTORY_SAMPLE_US",
    "MAX_OPERATIONS",
    "TIMEOUT_US",
    "UNKNOWN_TIME",
    "Administration",
    "ArmedFault",
    "Broker",
    "Clock",
    "EntityPath",
    "EntityStats",
    "EntityView",
    "FaultBook",
    "FaultSpec",
    "FaultsDisabledError",
    "FileClock",
    "Histogram",
    "ManualClock",
    "Message",
    "MessageState",
    "Messaging",
    "Namespace",
    "NamespaceObserver",
    "Observation",
    "PendingSettlement",
    "ReceivableView",
    "ReceivedMessage",
    "RuntimeProperties",
    "SendOutcome",
    "ServiceBusReceiveMode",
    "SessionLock",
    "StoreCounters",
    "SystemClock",
    "TransactionRollbackError",
    "TransactionSpanError",
    "TransactionTimeoutError",
    "Transactions",
    "TransportGauges",
    "UnknownTransactionError",
    "address_path",
    "parse_path",
    "queue_runtime_properties",
    "subscription_path",
    "subscription_runtime_properties",
    "suggest_window",
    "topic_runtime_properties",
]
