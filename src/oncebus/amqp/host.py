"""What the AMQP adapter needs from the process that hosts it: :class:`AmqpHost`, a narrow protocol.

Connections, the link router and the link handlers depend on it, not on
:class:`~oncebus.amqp.server.AmqpServer` (which implements it), so the listener
can be replaced (e.g. by ``oncebus.server``'s sniffing front door) without
touching them. It is defined beside the connection that calls it (``amqp/connection.py``), so the two
modules do not import each other; this module names it for the rest of the adapter.
"""

from __future__ import annotations

from oncebus.amqp.connection import AmqpHost

__all__ = ["AmqpHost"]
