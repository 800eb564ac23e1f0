"""Every bound the AMQP front end puts on a client, in one place.

A client cannot make oncebus do unbounded work: frames are bounded before and
after the open exchange, a delivery is refused as soon as it passes its link's
size, a connection that does not finish its handshake is closed, and a
receiver that does not read stops the broker from handing it more messages.

The defaults suit a local broker. A deployment (or a test, which wants short
timeouts) changes them through environment variables named
``ONCEBUS_AMQP_<FIELD>`` in upper case, e.g. ``ONCEBUS_AMQP_HANDSHAKE_TIMEOUT=0.5``,
read with every other setting by ``oncebus.server.settings``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

# AMQP 1.0 (2.4.1, 5.3.1): MIN-MAX-FRAME-SIZE, what either peer must accept before the open
# (or SASL) exchange has told it more; a larger frame then is a protocol error.
MIN_MAX_FRAME_SIZE = 512


@dataclass(frozen=True)
class AmqpLimits:
    """The bounds one AMQP listener applies to every connection."""

    # the max-frame-size oncebus advertises in its open: no incoming frame after the open exchange may be larger
    max_frame_size: int = 65536
    # every frame before the client's open (SASL frames included) must fit in this
    handshake_frame_size: int = MIN_MAX_FRAME_SIZE
    # seconds from accept to the client's open (protocol header, SASL, open); then the connection is closed
    handshake_timeout: float = 30.0
    # seconds a closing connection may take to flush its last frames to a client that does not read
    close_flush_timeout: float = 5.0
    # bytes waiting to be written to one client above which no more deliveries are taken from the broker
    outgoing_buffer_limit: int = 1024 * 1024
    # deliveries taken from the broker at once for one receiver link, before the sizes seen say more
    first_delivery_batch: int = 16
    # the most deliveries taken from the broker at once for one receiver link
    max_delivery_batch: int = 256
    # link-level max-message-size of a client's link to $cbs (a token is a few hundred bytes)
    cbs_message_size: int = 64 * 1024
    # link-level max-message-size of a client's link to <entity>/$management, at least
    management_message_size: int = 1024 * 1024
    # open links (both directions) one connection may hold
    max_links_per_connection: int = 1000
    # sessions one connection may begin (AMQP channel-max + 1)
    max_sessions_per_connection: int = 256
    # nesting of lists, maps, arrays and described values within one AMQP value
    max_value_depth: int = 64
    # seconds between checks that every open link is still covered by an unexpired CBS token
    token_check_interval: float = 1.0
    # seconds from the client's open to its first accepted CBS token; then the connection is closed
    auth_timeout: float = 20.0  # Azure closes a connection with no token 20 s after its open
    # authenticated AMQP connections (a CBS token accepted) served at once; past it a client's open is answered
    # with a close (amqp:resource-limit-exceeded)
    max_connections: int = 5000  # Azure Service Bus: 5,000 AMQP connections per namespace (its quotas page)
    # connections without an accepted token yet (in the handshake, or opened with no token); past it the oldest
    # of them is closed (amqp:resource-limit-exceeded), never the newcomer, nor one that holds a token
    max_unauthenticated: int = 512
    # the same, from one peer address (its own oldest is closed)
    max_unauthenticated_per_peer: int = 256
    # AMQP over WebSockets: the largest WebSocket message a client may send (its fragments added up); past it the
    # connection is closed (WebSocket close code 1009). Messages are never buffered (their bytes stream into the
    # AMQP connection, which bounds its frames as on TCP); the SDKs write one AMQP frame or a few per message
    websocket_message_size: int = 16 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.handshake_frame_size < MIN_MAX_FRAME_SIZE:
            raise ValueError(f"handshake_frame_size must be at least {MIN_MAX_FRAME_SIZE} (AMQP's minimum)")
        if self.max_frame_size < self.handshake_frame_size:
            raise ValueError("max_frame_size must be at least handshake_frame_size")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{f.name} must be positive, not {value!r}")


DEFAULT_LIMITS = AmqpLimits()


class OldestFirst:
    """Connections waiting for something (their first bytes, their first token), oldest first, by peer address;
    past a bound the oldest is shed (closed), so that idle connections cannot keep newcomers out."""

    def __init__(self) -> None:
        self.all: dict[object, str] = {}  # key -> peer address, in arrival order
        self.by_peer: dict[str, dict[object, None]] = {}
        self.shed: dict[object, Callable[[], object]] = {}

    def __len__(self) -> int:
        return len(self.all)

    def add(self, key: object, peer: str, shed: Callable[[], object]) -> None:
        self.all[key] = peer
        self.by_peer.setdefault(peer, {})[key] = None
        self.shed[key] = shed

    def set_shed(self, key: object, shed: Callable[[], object]) -> None:
        if key in self.all:
            self.shed[key] = shed

    def remove(self, key: object) -> None:
        peer = self.all.pop(key, None)
        self.shed.pop(key, None)
        if peer is None:
            return
        keys = self.by_peer.get(peer)
        if keys is not None:
            keys.pop(key, None)
            if not keys:
                del self.by_peer[peer]

    def touch(self, key: object) -> None:
        """``key`` did something: it becomes the newest (the shed take the longest idle first)."""
        peer = self.all.pop(key, None)
        if peer is None:
            return
        self.all[key] = peer
        keys = self.by_peer[peer]
        keys.pop(key, None)
        keys[key] = None

    def count(self, peer: str) -> int:
        return len(self.by_peer.get(peer, ()))

    def shed_oldest(self, peer: str | None = None) -> None:
        """Close the connection idle the longest of ``peer`` (None: of the peer holding the most)."""
        if peer is None:
            if not self.by_peer:
                return
            peer = max(self.by_peer, key=lambda p: len(self.by_peer[p]))
        keys = self.by_peer.get(peer)
        if not keys:
            return
        key = next(iter(keys))
        shed = self.shed.get(key)
        self.remove(key)
        if shed is not None:
            shed()
