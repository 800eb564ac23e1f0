"""What the AMQP adapter needs from the process that hosts it, as a narrow protocol.

Connections, the link router and the link handlers depend on this, not on
:class:`~oncebus.amqp.server.AmqpServer` (which implements it), so the listener
can be replaced (e.g. by ``oncebus.server``'s sniffing front door) without
touching them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import proton

    from oncebus.amqp.connection import AmqpConnection
    from oncebus.amqp.limits import AmqpLimits
    from oncebus.broker import Namespace

__all__ = ["AmqpHost"]


class AmqpHost(Protocol):
    """The engine, the SAS keys tokens are verified with, the wall clock, the limits, and connection bookkeeping."""

    @property
    def namespace(self) -> Namespace:
        """The engine every link sends to and receives from."""
        ...

    @property
    def keys(self) -> Mapping[str, str]:
        """SAS key name -> key: what every CBS token is verified with."""
        ...

    @property
    def limits(self) -> AmqpLimits:
        """What a client may make the server do (frame sizes, handshake timeouts, buffers)."""
        ...

    def wall_time(self) -> float:
        """Seconds since the epoch: token expiry is judged against this."""
        ...

    def connection_opened(self, conn: AmqpConnection) -> None:
        """A connection started: keep checking its tokens."""
        ...

    def connection_active(self, conn: AmqpConnection) -> None:
        """A connection without a token yet received bytes."""
        ...

    def connection_authenticated(self, conn: AmqpConnection) -> None:
        """A connection's first CBS token was accepted."""
        ...

    def connection_closed(self, conn: AmqpConnection) -> None:
        """A connection ended: forget it."""
        ...

    def attach(self, conn: AmqpConnection, link: proton.Link) -> None:
        """A client attached ``link`` on ``conn``: give it its handler (or refuse it)."""
        ...
