"""The options of the ``oncebus`` Spark data source, parsed once for the reader and the writers."""

from __future__ import annotations

from dataclasses import dataclass

from oncebus.core.errors import InvalidArgumentError


class OncebusOptionError(InvalidArgumentError):
    """An option of format("oncebus") that is missing or wrong (a ValueError, under OncebusError)."""

    condition = "com.microsoft:argument-error"
    status = 400


@dataclass(frozen=True)
class _Options:
    connection_string: str
    entity: str  # where to send (queue or topic), or the queue to read
    kind: str  # "queue" | "topic"
    subscription: str | None
    max_messages_per_batch: int
    receive_wait_seconds: float
    partitions: int
    message_id_column: str | None
    message_id_prefix: str | None
    send_batch_size: int
    sessions: tuple[str, ...] | None = None  # None: not a session entity; ("*",): any available session
    max_sessions: int = 2

    @classmethod
    def parse(cls, options: dict[str, str], *, reading: bool) -> _Options:
        lowered = {k.lower(): v for k, v in options.items()}
        conn = lowered.get("connectionstring") or lowered.get("connection_string")
        if not conn:
            raise OncebusOptionError(
                "the oncebus data source needs option 'connectionString' "
                "(Endpoint=sb://...;SharedAccessKeyName=...;SharedAccessKey=...)"
            )
        queue, topic = lowered.get("queue"), lowered.get("topic")
        subscription = lowered.get("subscription")
        if reading:
            if bool(queue) == bool(topic and subscription):
                raise OncebusOptionError("reading needs either option 'queue', or options 'topic' and 'subscription'")
        elif bool(queue) == bool(topic):
            raise OncebusOptionError("writing needs exactly one of the options 'queue' or 'topic'")

        def number(name: str, default: int, low: int = 1) -> int:
            raw = lowered.get(name.lower())
            if raw is None:
                return default
            try:
                value = int(raw)
            except ValueError:
                raise OncebusOptionError(f"option {name!r} must be an integer, not {raw!r}") from None
            if value < low:
                raise OncebusOptionError(f"option {name!r} must be at least {low}, not {value}")
            return value

        return cls(
            connection_string=conn,
            entity=str(queue or topic),
            kind="queue" if queue else "topic",
            subscription=subscription if not queue else None,
            max_messages_per_batch=number("maxMessagesPerBatch", 1000),
            receive_wait_seconds=float(lowered.get("receivewaitseconds", "1")),
            partitions=number("numPartitions", 2),
            message_id_column=lowered.get("messageidcolumn"),
            message_id_prefix=lowered.get("messageidprefix"),
            send_batch_size=number("sendBatchSize", 100),
            sessions=_sessions(lowered.get("sessions")) if reading else None,
            max_sessions=number("maxSessions", 2),
        )


def _sessions(raw: str | None) -> tuple[str, ...] | None:
    if raw is None:
        return None
    names = tuple(name.strip() for name in raw.split(",") if name.strip())
    if not names or ("*" in names and len(names) > 1):
        raise OncebusOptionError(
            f"option 'sessions' must be '*' (any available session) or a comma-separated list of session ids, "
            f"not {raw!r}"
        )
    return names
