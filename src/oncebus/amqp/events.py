"""The engine's events: what the client did, as typed records the connection hands to its link handlers.

:class:`oncebus.amqp.engine.Connection` reads the client's frames and puts one of these in its
:class:`Collector` for each change the client made (an open, a begin, an attach, credit, a delivery that
arrived or that the client settled, a detach, an end, a close, the end of the byte stream);
:class:`oncebus.amqp.connection.AmqpConnection` takes them in order and dispatches them. Nothing here does
I/O. An event equal to the one just put (the same kind about the same objects) is not put twice.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from oncebus.amqp.endpoints import Delivery, Link, Session


@dataclass(frozen=True, slots=True)
class ConnectionOpened:
    """The client's ``open`` arrived."""


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The client's ``close`` arrived."""


@dataclass(frozen=True, slots=True)
class SessionBegun:
    """The client began ``session``."""

    session: Session


@dataclass(frozen=True, slots=True)
class SessionEnded:
    """The client ended ``session`` (its links ended with it: each had its :class:`LinkDetached`)."""

    session: Session


@dataclass(frozen=True, slots=True)
class LinkAttached:
    """The client attached ``link``."""

    link: Link


@dataclass(frozen=True, slots=True)
class LinkDetached:
    """The client detached ``link`` (``closed``: for good)."""

    link: Link
    closed: bool


@dataclass(frozen=True, slots=True)
class LinkFlow:
    """The client's ``flow`` for ``link`` (credit, drain) arrived."""

    link: Link


@dataclass(frozen=True, slots=True)
class DeliveryChanged:
    """A transfer of ``delivery`` arrived, or the client's disposition changed its state or settled it."""

    delivery: Delivery


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
