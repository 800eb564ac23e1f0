"""A message's system properties, declared once: the model's (and the Python SDK's) name, Service Bus's
name, where AMQP carries it, and which correlation filter field matches it.

Every door reads this table instead of keeping its own list: the AMQP codec (decoding a transfer,
re-encoding a rule action's copy), the store (which fields go in a stored message's metadata), the
rules (``sys.`` names in SQL filters and actions, correlation filter fields in the administration
API's XML, the emulator's config and the CLI), and the received message's view.

Two kinds: the **sender's** properties (set by whoever sends; a rule action may change most of them)
and the **broker's** (set by the broker: sequence number, times, state, delivery count, lock,
dead-letter source; read-only to rules and receivers).

Beside them, what an **application property** may hold (:func:`check_application_properties`): the
simple values every door carries, AMQP's application-properties section above all (no lists, maps or
arrays; integers within AMQP's long and ulong). Every send and every abandon that modifies properties
is checked against it once, in core, whichever door it came through.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Final

from oncebus.core.errors import ArgumentOutOfRangeError, InvalidArgumentError

# where AMQP carries a property (the section, then the field index or annotation key)
AMQP_PROPERTIES: Final = "properties"
AMQP_HEADER: Final = "header"
AMQP_ANNOTATIONS: Final = "message-annotations"
AMQP_APPLICATION: Final = "application-properties"


@dataclass(frozen=True, slots=True)
class SystemProperty:
    field: str | None  # the model's attribute, as azure.servicebus names it (None: not a field of its own)
    name: str  # Service Bus's name: SQL filters' sys.<name>, the REST API's BrokerProperties
    kind: type  # the value's type (str, timedelta, datetime, int)
    sender: bool  # set by the sender (True) or by the broker (False)
    amqp: tuple[str, int | str] | None = None  # (section, field index or annotation key); None: not on the wire
    correlation: str | None = None  # the correlation filter's field that matches it (None: none does)
    aliases: tuple[str, ...] = ()  # other names Service Bus accepts for it (Label for Subject)

    @property
    def settable(self) -> bool:
        """A rule action may ``SET`` it."""
        return self.sender and self.field is not None


def _sender(
    field: str,
    name: str,
    kind: type,
    amqp: tuple[str, int | str],
    correlation: str | None = None,
    aliases: tuple[str, ...] = (),
) -> SystemProperty:
    return SystemProperty(field, name, kind, True, amqp, correlation, aliases)


_SCHEDULED = "x-opt-scheduled-enqueue-time"

# in the order the SDK writes a CorrelationFilter's elements (the administration API's XML keeps it)
SENDER_PROPERTIES: Final[tuple[SystemProperty, ...]] = (
    _sender("correlation_id", "CorrelationId", str, (AMQP_PROPERTIES, 5), "correlation_id"),
    _sender("message_id", "MessageId", str, (AMQP_PROPERTIES, 0), "message_id"),
    _sender("to", "To", str, (AMQP_PROPERTIES, 2), "to"),
    _sender("reply_to", "ReplyTo", str, (AMQP_PROPERTIES, 4), "reply_to"),
    _sender("subject", "Subject", str, (AMQP_PROPERTIES, 3), "label", aliases=("Label",)),
    _sender("session_id", "SessionId", str, (AMQP_PROPERTIES, 10), "session_id"),
    _sender("reply_to_session_id", "ReplyToSessionId", str, (AMQP_PROPERTIES, 12), "reply_to_session_id"),
    _sender("content_type", "ContentType", str, (AMQP_PROPERTIES, 6), "content_type"),
    _sender("partition_key", "PartitionKey", str, (AMQP_ANNOTATIONS, "x-opt-partition-key")),
    _sender("time_to_live", "TimeToLive", timedelta, (AMQP_HEADER, 2)),
    _sender(
        "scheduled_enqueue_time_utc",
        "ScheduledEnqueueTimeUtc",
        datetime,
        (AMQP_ANNOTATIONS, "x-opt-scheduled-enqueue-time"),
    ),
)
"""What a sender sets, besides the body and the application properties."""

BROKER_PROPERTIES: Final[tuple[SystemProperty, ...]] = (
    SystemProperty("sequence_number", "SequenceNumber", int, False, (AMQP_ANNOTATIONS, "x-opt-sequence-number")),
    SystemProperty(None, "EnqueuedSequenceNumber", int, False),
    SystemProperty("enqueued_time_utc", "EnqueuedTimeUtc", datetime, False, (AMQP_ANNOTATIONS, "x-opt-enqueued-time")),
    SystemProperty("expires_at_utc", "ExpiresAtUtc", datetime, False),
    SystemProperty("delivery_count", "DeliveryCount", int, False, (AMQP_HEADER, 4)),
    SystemProperty("dead_letter_source", "DeadLetterSource", str, False, (AMQP_ANNOTATIONS, "x-opt-deadletter-source")),
    SystemProperty("lock_token", "LockToken", str, False, ("delivery-annotations", "x-opt-lock-token")),
    SystemProperty("locked_until_utc", "LockedUntilUtc", datetime, False, (AMQP_ANNOTATIONS, "x-opt-locked-until")),
    SystemProperty("state", "State", str, False, (AMQP_ANNOTATIONS, "x-opt-message-state")),
    SystemProperty(None, "Size", int, False),
)
"""What the broker sets: read-only to rules; a receiver gets them in the message annotations and header."""

DEAD_LETTER_PROPERTIES: Final[tuple[tuple[str, str], ...]] = (
    ("dead_letter_reason", "DeadLetterReason"),
    ("dead_letter_error_description", "DeadLetterErrorDescription"),
)
"""A dead-lettered message's reason and description: the model's field, the application property a receiver
reads them from (as Service Bus sends them)."""

TEXT_FIELDS: Final[tuple[str, ...]] = tuple(
    p.field for p in SENDER_PROPERTIES if p.kind is str and p.field is not None and p.field != "message_id"
)
"""The sender's text fields (the message id is typed: text, binary, uuid or ulong)."""

WIRE_PROPERTY_FIELDS: Final[dict[int, str]] = {
    int(p.amqp[1]): p.field for p in SENDER_PROPERTIES if p.amqp and p.amqp[0] == AMQP_PROPERTIES and p.field
}
"""AMQP properties-section field index -> the model's field."""

CORRELATION_FIELDS: Final[dict[str, str]] = {
    p.correlation: p.field for p in SENDER_PROPERTIES if p.correlation is not None and p.field is not None
}
"""A correlation filter's field -> the message field it matches, in the SDK's order."""

CORRELATION_NAMES: Final[dict[str, str]] = {
    p.correlation: (p.aliases[0] if p.aliases else p.name) for p in SENDER_PROPERTIES if p.correlation is not None
}
"""A correlation filter's field -> its Service Bus name (``label`` -> ``Label``), in the SDK's order."""


def annotation_key(field: str) -> str:
    """The message annotation that carries a property on AMQP (``partition_key`` -> ``x-opt-partition-key``)."""
    for prop in (*SENDER_PROPERTIES, *BROKER_PROPERTIES):
        if prop.field == field and prop.amqp is not None and isinstance(prop.amqp[1], str):
            return prop.amqp[1]
    raise KeyError(f"{field!r} is not carried in an annotation")


def correlation_field(name: str) -> str | None:
    """The correlation filter field a name means: ``CorrelationId``, ``correlation_id``, ``correlationid``,
    ``Label`` or ``Subject``... (None: not one; it is then an application property)."""
    key = name.replace("_", "").lower()
    return _CORRELATION_BY_KEY.get(key)


_CORRELATION_BY_KEY: Final[dict[str, str]] = {}
for _p in SENDER_PROPERTIES:
    if _p.correlation is not None:
        for _n in (_p.name, *_p.aliases, _p.correlation):
            _CORRELATION_BY_KEY[_n.replace("_", "").lower()] = _p.correlation
del _p, _n


# ------------------------------------------------------------------------------ application properties
LONG_MIN: Final = -(2**63)
LONG_MAX: Final = 2**63 - 1
ULONG_MAX: Final = 2**64 - 1

APPLICATION_VALUES: Final = (
    "a string, a boolean, null, an integer from -2**63 to 2**64 - 1 (an AMQP long; a ulong above 2**63 - 1), "
    "a floating-point number, binary, a UUID, a time (datetime), a duration (timedelta) or a decimal"
)
"""What an application property's value may be, in words (error messages say it)."""

_SIMPLE: Final = (str, bool, float, bytes, bytearray, memoryview, uuid.UUID, datetime, timedelta, Decimal)


def text_error(value: str) -> str | None:
    """Why ``value`` cannot travel as text (AMQP strings are UTF-8: a lone surrogate has none); None if it can."""
    if value.isascii():
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"holds {value[exc.start]!r} at {exc.start}, a lone UTF-16 surrogate, which is not Unicode text"
    return None


def application_property_error(name: str, value: object) -> InvalidArgumentError | None:
    """The refusal of ``value`` as the application property ``name`` (naming what was wrong and what is allowed),
    or None when every door can carry it."""
    where = f"application property {name!r}"
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        if LONG_MIN <= value <= ULONG_MAX:
            return None
        return ArgumentOutOfRangeError(
            f"{where} is {_shown(value)}, out of range: an integer property must be from -2**63 to "
            f"2**64 - 1 ({LONG_MIN} to {ULONG_MAX}; AMQP carries no larger one); send a larger number as a "
            "string or a floating-point number"
        )
    if isinstance(value, str):
        problem = text_error(value)
        return None if problem is None else InvalidArgumentError(f"{where} {problem}; a string must be Unicode text")
    if isinstance(value, _SIMPLE):
        return None
    kind = "a list" if isinstance(value, list | tuple) else "a map" if isinstance(value, Mapping) else None
    shown = kind or f"a value of type {type(value).__name__}"
    return InvalidArgumentError(f"{where} is {shown}, which is not a property value; a value is {APPLICATION_VALUES}")


def _shown(value: int) -> str:
    if value.bit_length() <= 256:
        return f"the integer {value}"
    digits = int(value.bit_length() * math.log10(2)) + 1  # str() of a huge int is slow, and refused past 4300 digits
    return f"a {'negative ' if value < 0 else ''}{digits}-digit integer"


def check_application_properties(properties: object, *, what: str = "application_properties") -> None:
    """Refuse ``properties`` unless it maps text keys to values every door carries (:data:`APPLICATION_VALUES`)."""
    if not isinstance(properties, dict):
        raise InvalidArgumentError(f"{what} must be a map, not {type(properties).__name__}")
    for key, value in properties.items():
        if not isinstance(key, str):
            raise InvalidArgumentError(f"{what} keys must be text, not {type(key).__name__}")
        problem = text_error(key)
        if problem is not None:
            raise InvalidArgumentError(f"the name of application property {key!r} {problem}; a name is Unicode text")
        refusal = application_property_error(key, value)
        if refusal is not None:
            raise refusal


def carried_properties(properties: Mapping[Any, Any]) -> tuple[dict[str, Any], str] | None:
    """None when every door carries all of ``properties``; else a copy in which each name and value no door carries
    is its text, and what was wrong (the first one). For a message stored before its door refused such values."""
    repaired: dict[str, Any] = {}
    why: str | None = None
    for key, value in properties.items():
        name = key if isinstance(key, str) and text_error(key) is None else _as_text(key)
        refusal = application_property_error(name, value)
        if name is not key and why is None:
            why = f"the name of application property {name!r} is not Unicode text"
        if refusal is not None:
            why = why or str(refusal)
            value = _as_text(value)
        repaired[name] = value
    return None if why is None else (repaired, why)


def _as_text(value: object) -> str:
    if isinstance(value, int) and value.bit_length() > 13_000:  # past str()'s 4300 digits
        return hex(value)
    text = value if isinstance(value, str) else str(value)
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
