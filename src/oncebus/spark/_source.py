"""The ``oncebus`` stream reader: a queue or subscription, plain or session-enabled.

Messages are received in PEEK_LOCK by the driver-side reader (the one Python
process that answers Spark's ``latestOffset``, ``partitions`` and ``commit``
calls, so it holds the receivers and their locks), kept locked while Spark
processes the micro-batch that carries them (message locks, or session locks,
renewed by a thread), and completed in ``commit``. Spark calls ``commit`` for a
batch only when it constructs the next one, after the batch is in the
checkpoint's commit log; when the queue has gone quiet, ``latestOffset``
moves the offset without a new message (``settle``) while a batch that ran
still holds messages, so one empty micro-batch follows and commits it. If the
query dies the locks lapse and the broker delivers the messages again
(at-least-once; exactly-once through ``deduplicate_stream``).

``Trigger.AvailableNow``: micro-batches of the read limit until a round of
receives finds nothing or a message enqueued after the run began (senders that
never pause do not keep the run going), then the settling batch, then the
query stops with every message it read completed.

Sessions (option ``sessions``): ``*`` accepts up to ``maxSessions`` available
sessions at a time (a session that has nothing more to give and nothing left
to settle is released, so others get their turn; sessions are accepted by a
background thread, so a micro-batch never waits for one to become available),
or a comma-separated list
names the sessions to read. Each session is one receiver holding the session
lock; its messages are settled through it, and each micro-batch puts one
session's rows in one partition, in sequence order.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from oncebus.spark._options import _Options

_ANY_SESSION = "*"


@dataclass(eq=False)
class _Link:
    """One receiver: the entity itself, or one session of it."""

    receiver: Any
    session_id: str | None
    pending: set[int] = field(default_factory=set)  # buffered, not yet settled
    drained: bool = False  # the last receive got nothing


@dataclass
class _BufferedMessage:
    row: tuple[Any, ...]
    message: Any  # azure.servicebus.ServiceBusReceivedMessage, only in the driver-side reader
    lock_span: float  # seconds the broker's lock lasted when the message arrived
    link: _Link


class _RowsPartition(InputPartition):
    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        super().__init__(len(rows))
        self.rows = rows


def _to_row(message: Any) -> tuple[Any, ...]:
    body = b"".join(message.body) if not isinstance(message.body, bytes | bytearray) else bytes(message.body)
    properties = {
        (k.decode() if isinstance(k, bytes) else str(k)): (v.decode() if isinstance(v, bytes) else str(v))
        for k, v in (message.application_properties or {}).items()
    }
    enqueued = message.enqueued_time_utc
    if enqueued is not None and enqueued.tzinfo is None:
        enqueued = enqueued.replace(tzinfo=UTC)
    return (
        message.message_id,
        body,
        message.partition_key,
        message.session_id,
        enqueued,
        message.sequence_number,
        message.delivery_count,
        message.subject,
        message.content_type,
        message.correlation_id,
        properties,
    )


class OncebusStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are ``{"run": <reader run id>, "n": <messages received in that run>}``, and ``"settle": <k>``
    on the offsets of the empty micro-batches that commit a batch of a quiet queue."""

    def __init__(self, options: _Options) -> None:
        self.options = options
        self.run = uuid.uuid4().hex
        self._received = 0
        self._buffer: dict[int, _BufferedMessage] = {}
        self._client: Any = None
        self._links: list[_Link] = []
        self._renewer: threading.Thread | None = None
        self._stopping = threading.Event()
        self._lock = threading.RLock()
        self._accepting: threading.Thread | None = None  # sessions mode '*': accepts sessions in the background
        self._accepted: list[_Link] = []  # sessions it accepted, taken into _links by the next latestOffset
        self._available_since: datetime | None = None  # Trigger.AvailableNow: when the run began
        self._caught_up = False  # Trigger.AvailableNow: nothing more to receive in this run

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "run": self.run}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]
        self.run = state["run"]

    # -- receivers -----------------------------------------------------------------------------
    def _open(self, session_id: str | None, wait: float | None = None) -> _Link | None:
        """A receiver for the entity, one named session, or the next available session (None if none)."""
        from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusReceiveMode
        from azure.servicebus.exceptions import OperationTimeoutError, SessionCannotBeLockedError

        kwargs: dict[str, Any] = {"receive_mode": ServiceBusReceiveMode.PEEK_LOCK}
        if session_id is not None:
            kwargs["session_id"] = NEXT_AVAILABLE_SESSION if session_id == _ANY_SESSION else session_id
            if wait is not None:
                kwargs["max_wait_time"] = wait
        if self.options.subscription is None:
            receiver = self._client.get_queue_receiver(self.options.entity, **kwargs)
        else:
            receiver = self._client.get_subscription_receiver(self.options.entity, self.options.subscription, **kwargs)
        try:
            receiver.__enter__()
        except (OperationTimeoutError, SessionCannotBeLockedError):
            receiver.close()
            return None  # no session available now (or another consumer holds it)
        name = receiver.session.session_id if session_id is not None else None
        return _Link(receiver, name)

    def _connect(self) -> None:
        if self._client is not None:
            return
        from azure.servicebus import ServiceBusClient

        self._client = ServiceBusClient.from_connection_string(self.options.connection_string)
        sessions = self.options.sessions
        if sessions is None:
            link = self._open(None)
            assert link is not None
            self._links.append(link)
        elif sessions != (_ANY_SESSION,):
            for session_id in sessions:
                link = self._open(session_id, wait=self.options.receive_wait_seconds)
                if link is not None:
                    self._links.append(link)
        self._stopping.clear()
        self._renewer = threading.Thread(target=self._renew_locks, name="oncebus-lock-renewal", daemon=True)
        self._renewer.start()

    def _accept_sessions(self) -> None:
        """Sessions mode '*': take available sessions up to maxSessions; named sessions not yet held, retried."""
        sessions = self.options.sessions
        if sessions is None:
            return
        if sessions == (_ANY_SESSION,):
            # accepting the next available session waits until one is (the broker's wait, 65 s as Azure's,
            # when the client names none): done in a thread, so the sessions held go on being read meanwhile
            self._links += self._accepted
            self._accepted = []
            if len(self._links) < self.options.max_sessions and (
                self._accepting is None or not self._accepting.is_alive()
            ):
                self._accepting = threading.Thread(target=self._accept_any, name="oncebus-session-accept", daemon=True)
                self._accepting.start()
        else:
            held = {link.session_id for link in self._links}
            for session_id in sessions:
                if session_id not in held:
                    link = self._open(session_id, wait=0.2)
                    if link is not None:
                        self._links.append(link)

    def _accept_any(self) -> None:
        """Accept available sessions until ``maxSessions`` are held or none is available (a thread)."""
        while not self._stopping.is_set():
            with self._lock:
                if self._client is None or len(self._links) + len(self._accepted) >= self.options.max_sessions:
                    return
            try:
                link = self._open(_ANY_SESSION, wait=min(self.options.receive_wait_seconds, 1.0))
            except Exception:  # the reader stopped meanwhile (client closed), or the connection failed: retried later
                return
            if link is None:
                return
            with self._lock:
                if self._stopping.is_set() or self._client is None:
                    link.receiver.close()
                    return
                self._accepted.append(link)

    def _release_idle_sessions(self) -> None:
        """Mode '*': a session with nothing more to give and nothing to settle is released for others."""
        if self.options.sessions != (_ANY_SESSION,):
            return
        for link in [link for link in self._links if link.drained and not link.pending]:
            self._links.remove(link)
            link.receiver.close()

    def _renew_locks(self) -> None:
        """Keep the locks of received, not yet committed messages (or their sessions) alive. The SDK's
        receivers are not thread-safe, so every use of them holds ``_lock``."""
        from azure.servicebus.exceptions import ServiceBusError

        while not self._stopping.wait(1.0):
            now = datetime.now(UTC)
            with self._lock:
                for link in self._links + self._accepted:
                    if link.session_id is not None:
                        session = link.receiver.session
                        left = (session.locked_until_utc - now).total_seconds() if session.locked_until_utc else 0
                        if left < 10:
                            try:
                                session.renew_lock()
                            except ServiceBusError:
                                pass  # session lost: its messages are delivered again
                due = [
                    b
                    for b in self._buffer.values()
                    if b.link.session_id is None
                    and b.message.locked_until_utc is not None
                    and (b.message.locked_until_utc - now).total_seconds() < max(2.0, b.lock_span / 2)
                ]
                for buffered in due:
                    try:
                        buffered.link.receiver.renew_message_lock(buffered.message)
                    except ServiceBusError:
                        pass  # lock already lost: the broker will deliver the message again

    # -- Spark's reader API --------------------------------------------------------------------
    def initialOffset(self) -> dict[str, Any]:
        return {"run": self.run, "n": 0}

    def getDefaultReadLimit(self) -> Any:
        from pyspark.sql.streaming.datasource import ReadMaxRows

        return ReadMaxRows(self.options.max_messages_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        """``Trigger.AvailableNow``: read what the entity holds now, in micro-batches of the read limit, then stop."""
        self._available_since = datetime.now(UTC)
        self._caught_up = False

    def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, Any]:
        from pyspark.sql.streaming.datasource import ReadMaxRows

        wanted = limit.max_rows if isinstance(limit, ReadMaxRows) else self.options.max_messages_per_batch
        with self._lock:
            self._connect()
            self._accept_sessions()
            got = [] if self._caught_up else self._receive(wanted)
            now = datetime.now(UTC)
            for message, link in got:
                locked = message.locked_until_utc
                span = (locked - now).total_seconds() if locked else 60.0
                self._received += 1
                self._buffer[self._received] = _BufferedMessage(_to_row(message), message, span, link)
                link.pending.add(self._received)
            self._release_idle_sessions()
            if self._available_since is not None and (not got or self._arrived_later(got, self._available_since)):
                self._caught_up = True  # an available-now run ends with what it holds
            awaiting_commit = start.get("run") == self.run and any(i <= int(start["n"]) for i in self._buffer)
        if got or start.get("run") != self.run:
            return {"run": self.run, "n": self._received}
        if awaiting_commit:
            # Spark commits a batch only while it constructs the next one, and a quiet queue gives it none: the
            # messages of the batch that ended at ``start`` would stay locked. An offset that moves without a new
            # message makes one empty micro-batch, whose construction commits that batch (see ``commit``).
            return {"run": self.run, "n": int(start["n"]), "settle": int(start.get("settle", 0)) + 1}
        return start

    def _receive(self, wanted: int) -> list[tuple[Any, _Link]]:
        """Up to ``wanted`` messages from the links held; waits ``receiveWaitSeconds`` only for the first."""
        got: list[tuple[Any, _Link]] = []
        for link in list(self._links):
            link.drained = False
            first = True
            while len(got) < wanted:
                wait = self.options.receive_wait_seconds if first and not got else 0.2
                chunk = link.receiver.receive_messages(
                    max_message_count=min(wanted - len(got), 500), max_wait_time=wait
                )
                first = False
                if not chunk:
                    link.drained = True
                    break
                got += [(message, link) for message in chunk]
        return got

    @staticmethod
    def _arrived_later(got: list[tuple[Any, _Link]], since: datetime) -> bool:
        """Whether a message was enqueued after ``since``: an available-now run that meets one has read the
        entity's backlog (and a little more), so it stops receiving even while senders go on."""
        for message, _ in got:
            enqueued = message.enqueued_time_utc
            if enqueued is not None and (enqueued if enqueued.tzinfo else enqueued.replace(tzinfo=UTC)) > since:
                return True
        return False

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        if end.get("run") != self.run:
            # a batch planned by an earlier run of the query: its messages were never completed,
            # their locks lapse and the broker delivers them again in a later batch
            return []
        first = int(start["n"]) + 1 if start.get("run") == self.run else 1
        with self._lock:
            chosen = [self._buffer[i] for i in range(first, int(end["n"]) + 1) if i in self._buffer]
        if not chosen:
            return []
        if self.options.sessions is not None:  # one partition per session, in sequence order
            by_session: dict[str | None, list[tuple[Any, ...]]] = {}
            for buffered in chosen:
                by_session.setdefault(buffered.link.session_id, []).append(buffered.row)
            return [_RowsPartition(rows) for rows in by_session.values()]
        rows = [b.row for b in chosen]
        count = max(1, min(self.options.partitions, len(rows)))
        size = -(-len(rows) // count)
        return [_RowsPartition(rows[i : i + size]) for i in range(0, len(rows), size)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, _RowsPartition)
        yield from partition.rows

    def commit(self, end: dict[str, Any]) -> None:
        """Spark committed every batch up to ``end``: settle their messages now, each through its receiver."""
        if end.get("run") != self.run or self._client is None:
            return
        from azure.servicebus.exceptions import ServiceBusError

        upto = int(end["n"])
        with self._lock:
            for i in sorted(i for i in self._buffer if i <= upto):
                buffered = self._buffer.pop(i)
                buffered.link.pending.discard(i)
                try:
                    buffered.link.receiver.complete_message(buffered.message)
                except ServiceBusError:
                    pass  # lock (or session) lost: delivered again later; deduplicate drops the copy
            self._release_idle_sessions()

    def stop(self) -> None:
        self._stopping.set()
        if self._renewer is not None:
            self._renewer.join(5)
        with self._lock:
            for link in self._links + self._accepted:
                link.receiver.close()
            self._links, self._accepted = [], []
            if self._client is not None:
                self._client.close()
            self._client = self._renewer = None
