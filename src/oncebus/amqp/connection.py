"""One client connection: oncebus's AMQP engine (:mod:`oncebus.amqp.engine`) driven from an asyncio protocol.

The socket belongs to asyncio; every incoming byte goes through the
:class:`~oncebus.amqp.frames.FrameScanner` and into the engine; the engine's
events are dispatched to one handler object per link; whatever the engine has
to write is written back to the socket. Broker work runs as tasks on the same
loop, and each task calls :meth:`pump` when it has changed engine state, so the
Namespace is only ever touched from its loop.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Coroutine, Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

import proton

from oncebus.amqp import engine
from oncebus.amqp.errors import INTERNAL_ERROR, TRACKING_ID
from oncebus.amqp.events import (
    ConnectionClosed,
    ConnectionOpened,
    DeliveryChanged,
    Event,
    LinkAttached,
    LinkDetached,
    LinkFlow,
    SessionBegun,
    SessionEnded,
    TransportClosed,
)
from oncebus.amqp.frames import RESOURCE_LIMIT, FrameError, NotAmqpError
from oncebus.amqp.performatives import AMQP_HEADER, close_frame, open_frame
from oncebus.amqp.sas import Grant
from oncebus.auth import access_denied, ancestors, normalize_path

if TYPE_CHECKING:
    from oncebus.amqp.crossentity import CrossEntityScope
    from oncebus.amqp.limits import AmqpLimits
    from oncebus.broker import Broker, SessionLock

_LOG = logging.getLogger(__name__)
_CONTAINER_ID = "oncebus"
CONNECTION_FORCED = "amqp:connection:forced"
UNAUTHORIZED_ACCESS = "amqp:unauthorized-access"
LINK_DETACH_FORCED = "amqp:link:detach-forced"
TRANSFER_LIMIT_EXCEEDED = "amqp:link:transfer-limit-exceeded"
# distinct token audiences one connection may hold at once (a new token for an audience replaces the old one)
MAX_GRANTS_PER_CONNECTION = 1000


class AmqpHost(Protocol):
    """The engine, the SAS keys tokens are verified with, the wall clock, the limits, and connection bookkeeping."""

    @property
    def namespace(self) -> Broker:
        """The engine every link sends to and receives from."""
        ...

    @property
    def keys(self) -> Mapping[str, str]:
        """SAS key name -> key: what every CBS token is verified with."""
        ...

    def namespace_named(self, name: str | None) -> tuple[Broker, Mapping[str, str]]:
        """The namespace a token's key name selects (``key@name``; None: the default one) and its keys; raises
        :class:`~oncebus.core.errors.OncebusError` naming an unknown one."""
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

    def attach(self, conn: AmqpConnection, link: engine.Link) -> None:
        """A client attached ``link`` on ``conn``: give it its handler (or refuse it)."""
        ...


class LinkHandler(Protocol):
    """What the connection calls for the events of one link."""

    def on_flow(self) -> None: ...

    def on_delivery(self, delivery: engine.Delivery) -> None: ...

    def on_closed(self) -> None: ...

    def covered_path(self) -> str | None:
        """The entity path a CBS token must keep covering while the link is open (None: no token needed)."""
        ...


@runtime_checkable
class ReceivingHandler(LinkHandler, Protocol):
    """A handler of a link the client sends on: it can refuse a delivery still arriving."""

    def refuse_partial(self, delivery: engine.Delivery, size: int, limit: int) -> None:
        """Refuse ``delivery`` while it is still arriving: it passed the link's size ``limit``."""
        ...


def raw_delivery_tag(delivery: engine.Delivery) -> bytes:
    """The delivery tag as bytes."""
    return delivery.raw_tag


def session_key(link: engine.Link) -> int:
    return link.session.key


class AmqpConnection(asyncio.Protocol):
    def __init__(self, host: AmqpHost) -> None:
        self.host = host
        # the namespace this connection serves: the default one until its first CBS token names one (key@name)
        self.namespace: Broker = host.namespace
        self.namespace_name: str | None = None
        self.namespace_bound = False
        self.bound_keys: Mapping[str, str] = host.keys  # what its CBS tokens are verified with
        self.limits = host.limits
        self.loop = asyncio.get_running_loop()
        self.grants: dict[str, Grant] = {}  # by audience path: at most MAX_GRANTS_PER_CONNECTION
        self._grants_expire_at = float("inf")  # the earliest expiry among ``grants``
        # the engine: connection, sessions and links of this client, and the bytes in and out (I/O-free)
        self.connection = engine.Connection(self.limits)
        self.scanner = self.connection.scanner
        self.connection.container = _CONTAINER_ID
        self.connection.max_frame_size = self.limits.max_frame_size
        self.connection.channel_max = self.limits.max_sessions_per_connection - 1
        self.collector = engine.Collector()
        self.connection.collect(self.collector)
        self.socket: asyncio.Transport | None = None
        self.tasks: set[asyncio.Task[Any]] = set()
        self.closed = False
        self._pumping = False
        self._pump_again = False
        self._tick_handle: asyncio.TimerHandle | None = None
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._linger_timer: asyncio.TimerHandle | None = None
        self.writable = True  # the socket's write buffer is below its bound (asyncio's pause/resume_writing)
        self._writable_waiters: list[asyncio.Future[None]] = []
        self.handlers: dict[engine.Link, LinkHandler] = {}  # the handler serving each link oncebus opened
        self.response_links: dict[tuple[int, str], list[engine.Link]] = {}
        # each session's cross-entity scope by its key (``Session.key``), set by the router at its first link and
        # dropped when the session ends (a mypyc-compiled session cannot be weakly referenced)
        self.scopes: dict[int, CrossEntityScope | None] = {}
        # session locks held by this connection's receive links, by (receivable path, session id)
        self.sessions: dict[tuple[str, str], SessionLock] = {}
        self.opened_at: float | None = None  # loop time of the client's open
        self._authenticated = False  # a CBS token was accepted on this connection (``authenticated``)
        self.peer = ""  # the client's address: the per-peer bounds count by it
        self.refused: str | None = None  # why this connection is closed at its open (the host's connection cap)

    @property
    def authenticated(self) -> bool:
        """A CBS token was accepted on this connection (from then on it counts toward the connection cap)."""
        return self._authenticated

    @authenticated.setter
    def authenticated(self, value: bool) -> None:
        if value and not self._authenticated:
            self._authenticated = True
            self.host.connection_authenticated(self)

    # --- asyncio protocol --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # (uvloop's transports are not asyncio.Transport's subclasses)
        self.socket = transport
        peername = transport.get_extra_info("peername")
        self.peer = str(peername[0]) if isinstance(peername, tuple) and peername else ""
        # above this many unsent bytes asyncio calls pause_writing(): receive links stop taking messages
        transport.set_write_buffer_limits(high=self.limits.outgoing_buffer_limit)
        self.host.connection_opened(self)
        self._handshake_timer = self.loop.call_later(self.limits.handshake_timeout, self._handshake_expired)
        self.pump()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        if not self._authenticated:  # a client busy with its handshake is shed last (see max_unauthenticated)
            self.host.connection_active(self)
        try:
            frames = self.scanner.feed(data)
        except FrameError as exc:
            self.protocol_error(exc.condition, str(exc), not_amqp=isinstance(exc, NotAmqpError))
            return
        except Exception:  # a bug here must still end in a clean close, never a half-open socket
            _LOG.exception("cannot read the client's frames")
            self.protocol_error(INTERNAL_ERROR, "oncebus failed to read the frames; see its log")
            return
        refuse = False
        if self.scanner.opened and self.opened_at is None:
            self.opened_at = self.loop.time()
            if self._handshake_timer is not None:
                self._handshake_timer.cancel()
                self._handshake_timer = None
            refuse = self.refused is not None
        # the engine writes as it is asked, so it reads the client's header and open first (the answer must start
        # with our header)
        try:
            # one pump for what the frames changed, one more only after a refusal (the usual read, one disposition,
            # pumped twice before: a second dispatch, output check and tick for nothing; docs/performance-log.md);
            # none when they changed nothing to dispatch or write (a completion: its outcome is pumped once
            # committed), only the heartbeats' timer kept
            if frames:
                connection = self.connection
                connection.receive(frames)
                if self.collector.events or connection.has_output() or connection.head_closed:
                    self.pump()
                elif self._tick_handle is None and connection.remote_idle_timeout > 0:
                    self._schedule_tick()
            if self.scanner.oversized:
                self._refuse_all_oversized()
            if refuse:
                self._refuse()
                self.pump()
        except Exception:
            _LOG.exception("failed to handle the client's frames")
            self.protocol_error(INTERNAL_ERROR, "oncebus failed to handle the frames; see its log")

    def _refuse(self) -> None:
        """Open and close at once: the client reads why, then closes too."""
        assert self.refused is not None
        _LOG.warning("refusing a connection: %s", self.refused)
        # (with an info map: the SDK reads the error's third field by position)
        self.connection.condition = proton.Condition(RESOURCE_LIMIT, self.refused, {TRACKING_ID: str(uuid.uuid4())})
        self.connection.open()
        self.connection.close()

    def _refuse_all_oversized(self) -> None:
        oversized, self.scanner.oversized = self.scanner.oversized, []
        for name, size, limit in oversized:
            self._refuse_oversized(name, size, limit)
        self.pump()

    def eof_received(self) -> bool | None:
        self.connection.close_tail()
        self.pump()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed:
            self.connection.close_tail()
            self.connection.close_head()
        self._shutdown()
        for timer in (self._handshake_timer, self._linger_timer):
            if timer is not None:
                timer.cancel()
        self._set_writable(True)

    def pause_writing(self) -> None:
        self.writable = False

    def resume_writing(self) -> None:
        self._set_writable(True)

    def _set_writable(self, writable: bool) -> None:
        self.writable = writable
        if writable:
            waiters, self._writable_waiters = self._writable_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def outgoing_bytes(self) -> int:
        """Bytes waiting to reach this client: in the socket's buffer and in proton's sessions."""
        # the engine writes as it goes: nothing waits in it
        return self.socket.get_write_buffer_size() if self.socket is not None else 0

    def has_room(self) -> bool:
        """True while the client reads what it is sent (the outgoing bytes are under their bound)."""
        return self.writable and self.outgoing_bytes() < self.limits.outgoing_buffer_limit

    def room_changed(self) -> asyncio.Future[None]:
        """A future set when the socket's write buffer drains below its bound (or the connection ends)."""
        waiter: asyncio.Future[None] = self.loop.create_future()
        if self.writable or self.closed:
            waiter.set_result(None)
        else:
            self._writable_waiters.append(waiter)
        return waiter

    def close(self) -> None:
        """Close the connection (server shutdown): send close, flush, drop the socket."""
        if self.closed:
            return
        if self.connection.state & engine.LOCAL_ACTIVE:
            self.connection.close()
        self.pump()
        self._shutdown()

    def drop(self) -> None:
        """Cut the connection without a word, as a network failure does (the faults that drop a connection)."""
        if self.closed:
            return
        if self.socket is not None:
            self.socket.abort()
        self._shutdown()

    def protocol_error(self, condition: str, description: str, *, not_amqp: bool = False) -> None:
        """The client broke the protocol (or a bound): say why where AMQP allows it, then drop the socket.

        Before an AMQP header there is nothing to close: the answer to a wrong protocol header is
        oncebus's own header (AMQP 1.0, 2.2), then the socket closes. Within SASL there is no error
        frame either. Otherwise the client gets what AMQP requires before a ``close`` (a header and an
        ``open``, if proton has not sent them yet) and the ``close`` carrying ``condition``.
        """
        if self.closed:
            return
        peer = self.socket.get_extra_info("peername") if self.socket is not None else None
        _LOG.warning("closing the connection from %s: %s: %s", peer, condition, description)
        self._write()
        out = b""
        sent = self.connection
        if not_amqp:
            out = b"" if sent.sent_header else AMQP_HEADER
        elif self.scanner.in_amqp_layer:
            if not sent.sent_header:
                out += AMQP_HEADER
            if not sent.sent_open:
                out += open_frame(_CONTAINER_ID, self.limits.max_frame_size)
            if not sent.sent_close:
                out += close_frame(condition, description)
        if self.socket is not None and out:
            self.socket.write(out)
        self._shutdown()

    def _handshake_expired(self) -> None:
        self._handshake_timer = None
        if self.closed or self.scanner.opened:
            return
        self.protocol_error(
            CONNECTION_FORCED,
            "the AMQP handshake (protocol header, SASL, open) did not finish within "
            f"{self.limits.handshake_timeout:g} s",
        )

    def _shutdown(self, *, drain: bool = False) -> None:
        """Stop serving. ``drain``: the close exchange is over on our side; end our half of the stream and read
        (and drop) what the client still sends until it ends its half, for at most ``close_flush_timeout``:
        closing with its bytes unread would reset the connection, and a reset can destroy our close frame
        before the client reads it (a refused client would see a broken pipe instead of the reason)."""
        if self.closed:
            return
        self.closed = True
        self.host.connection_closed(self)
        self.scopes.clear()  # its sessions are over
        if self._tick_handle is not None:
            self._tick_handle.cancel()
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        for link in self._links():
            handler = self.handlers.pop(link, None)
            if handler is not None:
                handler.on_closed()
        # broker work is never cancelled (a cancelled write would leave the broker's memory behind its
        # store): running tasks finish, see ``closed`` and leave proton alone; link loops stop on their own
        if drain and self.socket is not None and self.socket.can_write_eof() and self._end_our_half():
            self._linger_timer = self.loop.call_later(self.limits.close_flush_timeout, self.socket.abort)
        elif self.socket is not None:
            if not self.socket.is_closing():  # aborted (drop) or lost: closing again would do nothing, except to
                # a TLS transport, which it empties (its get_write_buffer_size then fails)
                self.socket.close()  # after what is buffered has been written, unless the client never reads:
            if self.socket.get_write_buffer_size() > 0:
                self._linger_timer = self.loop.call_later(self.limits.close_flush_timeout, self.socket.abort)
        self._set_writable(True)

    def _end_our_half(self) -> bool:
        """Shut down our side of the stream (False when the client is gone already)."""
        assert self.socket is not None
        try:
            self.socket.write_eof()
        except OSError:
            return False
        return True

    def _links(self) -> list[engine.Link]:
        return list(self.connection.links)

    def _refuse_oversized(self, name: str, size: int, limit: int) -> None:
        """A delivery on the client's link ``name`` passed ``limit``: refuse it now (the rest of it is dropped)."""
        for link in self._links():
            if not (link.is_receiver and link.name == name):
                continue
            handler = self.handlers.get(link)
            delivery = link.current
            if isinstance(handler, ReceivingHandler) and delivery is not None and delivery.partial:
                handler.refuse_partial(delivery, size, limit)
            elif handler is None and link.state & engine.LOCAL_ACTIVE:
                condition = proton.Condition(
                    TRANSFER_LIMIT_EXCEEDED,
                    f"a transfer on link {name!r}, which oncebus has not accepted or given credit",
                    {TRACKING_ID: str(uuid.uuid4())},
                )
                self.close_link(link, condition)
            return

    def close_link(self, link: engine.Link, condition: proton.Condition) -> None:
        """Detach ``link`` (closed) with ``condition``; its handler stops now."""
        handler = self.handlers.pop(link, None)
        if handler is not None:
            handler.on_closed()
        if link.state & engine.LOCAL_ACTIVE:
            link.condition = condition
            link.close()
        self.pump()

    @property
    def client_hostname(self) -> str | None:
        """The hostname the client named in its ``open`` (tokens must be for it), if any."""
        try:
            return self.connection.remote_hostname or None
        except Exception:  # not opened yet
            return None

    def add_grant(self, grant: Grant, now: float) -> str | None:
        """Keep ``grant`` for its audience (replacing an earlier token for the same audience); None, or why not."""
        self._drop_expired(now)
        if grant.resource_path not in self.grants and len(self.grants) >= MAX_GRANTS_PER_CONNECTION:
            return (
                f"this connection holds tokens for {MAX_GRANTS_PER_CONNECTION} different audiences, the most oncebus "
                "keeps per connection; put a token for a common parent (such as the namespace) or renew existing ones"
            )
        self.grants[grant.resource_path] = grant
        self._grants_expire_at = min(self._grants_expire_at, grant.expires_at)
        self.authenticated = True
        return None

    def _drop_expired(self, now: float) -> None:
        if now < self._grants_expire_at:
            return
        self.grants = {path: grant for path, grant in self.grants.items() if grant.expires_at > now}
        self._grants_expire_at = min((grant.expires_at for grant in self.grants.values()), default=float("inf"))

    def _candidates(self, path: str, now: float) -> list[Grant]:
        """The grants whose audience is ``path`` or one of its ancestors (a few dict look-ups): the only ones
        that may reach it; :func:`oncebus.auth.access_denied` judges them."""
        self._drop_expired(now)
        grants = self.grants
        return [g for scope in ancestors(path) if (g := grants.get(scope)) is not None]

    def access_denied(self, path: str, right: str | None, now: float | None = None) -> str | None:
        """None when a token on this connection reaches ``path`` with ``right`` (None: any right); otherwise
        why not, in Azure's words when a token reaches it without the right."""
        if now is None:
            now = self.host.wall_time()
        grants = self._candidates(path, now)
        denied = access_denied(grants, path, right, now, hint="put a token on $cbs")
        host = self.client_hostname if denied is not None else None  # (a transfer's check stays a few look-ups)
        if host is None:
            return denied
        shown = f"sb://{host}/{normalize_path(path)}"  # Azure names the resource by its URI
        return access_denied(grants, path, right, now, shown=shown, hint="put a token on $cbs")

    def check_tokens(self, now: float) -> None:
        """Detach every link whose path no unexpired CBS token covers any more (as Service Bus does).

        A connection that was opened but has put no valid token within ``auth_timeout`` is closed: before
        its first token a client can do nothing but hold a socket.
        """
        if self.closed:
            return
        if (
            not self.authenticated
            and self.opened_at is not None
            and self.loop.time() - self.opened_at > self.limits.auth_timeout
        ):
            self.protocol_error(
                UNAUTHORIZED_ACCESS,
                f"no valid token was put on $cbs within {self.limits.auth_timeout:g} s of the open",
            )
            return
        for link in self._links():
            handler = self.handlers.get(link)
            path = handler.covered_path() if handler is not None else None
            if path is None:
                continue
            if self.access_denied(path, None, now) is None:
                link.token_covered = True
                continue
            if link.token_covered:
                why = f"the token that covered {normalize_path(path)!r} expired and no new one was put on $cbs"
            else:
                why = f"no token covers {normalize_path(path)!r}: put a token for it (or a parent) on $cbs"
            self.close_link(
                link,
                proton.Condition(
                    LINK_DETACH_FORCED,
                    f"The link {link.name!r} is force detached. Code: RenewToken. Details: Unauthorized access: {why}",
                    {TRACKING_ID: str(uuid.uuid4())},
                ),
            )

    # --- the engine ------------------------------------------------------------------------------
    def spawn(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run broker work on the loop; the connection pumps when it ends."""
        task = self.loop.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            _LOG.error("connection task failed", exc_info=task.exception())
        self.pump()

    def pump(self) -> None:
        """Dispatch proton's events and write what proton has to say."""
        if self.closed:
            return
        if self._pumping:
            self._pump_again = True
            return
        self._pumping = True
        events = self.collector.events
        try:
            while True:
                self._pump_again = False
                if events:  # (nothing to dispatch: the usual pump after an outcome, one call less)
                    self._dispatch()
                self._write()
                if not self._pump_again:
                    break
        finally:
            self._pumping = False
        if self._tick_handle is not None or self.connection.remote_idle_timeout > 0:
            self._schedule_tick()  # (no heartbeats to keep: nothing to tick)

    def _write(self) -> None:
        # the engine writes every performative whole and keeps the client's delivery ids: nothing to scan or map
        data = self.connection.take_output()
        if data:
            if self.socket is not None:
                self.socket.write(data)
                self.connection.last_output = self.loop.time()
            if self.connection.sent_close and self._linger_timer is None and self.socket is not None:
                self._linger_timer = self.loop.call_later(self.limits.close_flush_timeout, self.socket.abort)
        if self.connection.head_closed:
            self._shutdown(drain=True)

    def _schedule_tick(self) -> None:
        if self.closed:
            return
        connection = self.connection
        if connection.remote_idle_timeout <= 0 and self._tick_handle is None:
            return  # no heartbeats to keep (the Python SDK asks for none): nothing to tick, on every pump
        deadline = connection.tick(self.loop.time())
        if connection.has_output():  # a heartbeat is due now
            self._write()
        handle = self._tick_handle
        if handle is not None and deadline > 0 and handle.when() <= deadline:
            return  # the timer set fires first: it ticks then and sets the next (not one timer per pump)
        if handle is not None:
            handle.cancel()
            self._tick_handle = None
        if deadline > 0:
            self._tick_handle = self.loop.call_at(deadline, self._tick)

    def _tick(self) -> None:
        self._tick_handle = None
        self.pump()

    def _dispatch(self) -> None:
        collector = self.collector
        while True:
            event = collector.peek()
            if event is None:
                return
            try:
                self._handle(event)
            except Exception:
                _LOG.exception("error handling %s", type(event).__name__)
                self.connection.condition = proton.Condition(
                    "amqp:internal-error", "oncebus failed; see its log", {TRACKING_ID: str(uuid.uuid4())}
                )
                self.connection.close()
            collector.pop()

    def _handle(self, event: Event) -> None:
        if self.refused is not None:  # closing at its open: nothing the client asks for is done
            return
        match event:
            case DeliveryChanged(delivery):
                handler = self.handlers.get(delivery.link)
                if handler is not None:
                    handler.on_delivery(delivery)
                elif (
                    delivery.link.is_receiver
                    and not delivery.partial
                    and not delivery.notes.done
                    and not delivery.notes.refused
                ):
                    delivery.notes.done = True  # nobody reads it (a link refused or closed): drop it
                    # settled with an outcome (a bare settle reads as state null, which rhea cannot read)
                    delivery.local.condition = proton.Condition(
                        LINK_DETACH_FORCED,
                        f"link {delivery.link.name!r} was refused or closed: nothing sent on it is read",
                        {TRACKING_ID: str(uuid.uuid4())},
                    )
                    delivery.update(engine.REJECTED)
                    delivery.settle()
            case LinkFlow(link):
                handler = self.handlers.get(link)
                if handler is not None:
                    handler.on_flow()
            case LinkAttached(link):
                self.host.attach(self, link)
            case LinkDetached(link, closed):
                self._link_gone(link)
                if link.state & engine.LOCAL_ACTIVE:
                    if closed:
                        link.close()
                    else:
                        link.detach()
            case SessionBegun(session):
                session.open()
            case SessionEnded(session):
                self.scopes.pop(session.key, None)
                if session.state & engine.LOCAL_ACTIVE:
                    session.close()
            case ConnectionOpened():
                self.connection.open()
            case ConnectionClosed():
                if self.connection.state & engine.LOCAL_ACTIVE:
                    self.connection.close()
            case TransportClosed():
                self._write()
                self._shutdown()

    def _link_gone(self, link: engine.Link) -> None:
        handler = self.handlers.pop(link, None)
        if handler is not None:
            handler.on_closed()
        if link.is_receiver:
            self.scanner.forget(link.name)
        for key, links in list(self.response_links.items()):
            if link in links:
                links.remove(link)
                if not links:  # (a session's key does not outlive it)
                    del self.response_links[key]

    # --- helpers for the link handlers --------------------------------------------------------
    def serve(self, link: engine.Link, handler: LinkHandler) -> None:
        """``handler`` gets the events of ``link`` from now on (until the link or the connection ends)."""
        self.handlers[link] = handler

    def authorized(self, path: str, right: str | None = None) -> bool:
        return self.access_denied(path, right) is None

    def add_response_link(self, link: engine.Link, address: str) -> None:
        self.response_links.setdefault((session_key(link), address.lower()), []).append(link)

    def response_link(self, request_link: engine.Link, reply_to: str | None, node: str) -> engine.Link | None:
        """The client's receiver link that a reply to a request on ``request_link`` goes to."""
        key = session_key(request_link)
        for address in (reply_to, node):
            if not address:
                continue
            links = self.response_links.get((key, address.lower()))
            if links:
                return links[-1]
        for (_, address), links in self.response_links.items():
            if links and address in ((reply_to or "").lower(), node.lower()):
                return links[-1]
        return None
