"""The engine's events: what the client did, as typed records the connection hands to its link handlers.

:class:`oncebus.amqp.engine.Connection` reads the client's frames and puts one of these in its
:class:`Collector` for each change the client made (an open, a begin, an attach, credit, a delivery that
arrived or that the client settled, a detach, an end, a close, the end of the byte stream);
:class:`oncebus.amqp.connection.AmqpConnection` takes them in order and dispatches them. Nothing here does
I/O. The connection's events are defined here; each state machine defines those it emits (the session's in
:mod:`oncebus.amqp.session_state`, the link's in :mod:`oncebus.amqp.link_state`), gathered here. An event
equal to the one just put (the same kind about the same objects) is not put twice.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from oncebus.amqp.link_state import DeliveryChanged, LinkAttached, LinkDetached, LinkFlow
from oncebus.amqp.session_state import SessionBegun, SessionEnded

__all__ = [
    "Collector",
    "ConnectionClosed",
    "ConnectionOpened",
    "DeliveryChanged",
    "Event",
    "LinkAttached",
    "LinkDetached",
    "LinkFlow",
    "SessionBegun",
    "SessionEnded",
    "TransportClosed",
]


@dataclass(frozen=True, slots=True)
class ConnectionOpened:
    """The client's ``open`` arrived."""


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The client's ``close`` arrived."""


@dataclass(frozen=True, slots=True)
class TransportClosed:
    """The client's byte stream ended."""


Event = (
    ConnectionOpened
    | ConnectionClosed
    | SessionBegun
    | SessionEnded
    | LinkAttached
    | LinkDetached
    | LinkFlow
    | DeliveryChanged
    | TransportClosed
)


class Collector:
    """The events not handled yet, oldest first."""

    def __init__(self) -> None:
        self.events: collections.deque[Event] = collections.deque()

    def put(self, event: Event) -> None:
        events = self.events
        if events and events[-1] == event:  # the same news again (a delivery's frames read at once): once
            return
        events.append(event)

    def peek(self) -> Event | None:
        return self.events[0] if self.events else None

    def pop(self) -> None:
        if self.events:
            self.events.popleft()
