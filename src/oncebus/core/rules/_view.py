"""A read-only view of one message's properties, as rules see them.

Rules read two scopes: ``sys.`` (the broker properties of a Service Bus
message, named as in the SQL filter reference: ``sys.MessageId``,
``sys.Label``...) and ``user.`` (the application properties). Names are
case-insensitive in both. A view is built once per message and shared by every
subscription's rules; it copies what it needs and never changes the message.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from oncebus.core.errors import InvalidArgumentError
from oncebus.core.properties import BROKER_PROPERTIES, SENDER_PROPERTIES
from oncebus.core.timeutil import us_to_datetime


@dataclass(frozen=True)
class SystemProperty:
    name: str  # as written in the Service Bus documentation
    field: str | None  # the Message field a SET changes (None: read-only)
    type: type  # what a SET must assign (str, timedelta, datetime)

    @property
    def settable(self) -> bool:
        return self.field is not None


def _props() -> dict[str, SystemProperty]:
    out: dict[str, SystemProperty] = {}
    for prop in SENDER_PROPERTIES:
        for name in (prop.name, *prop.aliases):
            out[name.lower()] = SystemProperty(name, prop.field, prop.kind)
    for prop in BROKER_PROPERTIES:
        out[prop.name.lower()] = SystemProperty(prop.name, None, prop.kind)
    return out


SYSTEM_PROPERTIES: dict[str, SystemProperty] = _props()
"""Every ``sys.`` name a rule may use, by lower-case name. Any other ``sys.`` name is refused."""

_FIELD_TO_SYSTEM = {p.field: key for key, p in SYSTEM_PROPERTIES.items() if p.field and key != "subject"}
_FIELD_TO_SYSTEM_ITEMS = tuple(_FIELD_TO_SYSTEM.items())
_EMPTY_SYSTEM: dict[str, Any] = dict.fromkeys(SYSTEM_PROPERTIES)


class _LazySize:
    """sys.Size of a view, computed when first read (Message.size encodes the properties)."""

    __slots__ = ("compute",)

    def __init__(self, compute: Any) -> None:
        self.compute = compute


def system_property(name: str) -> SystemProperty | None:
    return SYSTEM_PROPERTIES.get(name.lower())


class MessageView:
    """The system and application properties of one message, looked up by case-insensitive name.

    ``system`` maps lower-case system property names (``"messageid"``,
    ``"label"``...) to values; ``user`` maps lower-case application property
    names to values (when two names differ only by case, the first wins);
    ``application_properties`` keeps the original names.
    """

    __slots__ = ("application_properties", "system", "user")

    def __init__(
        self,
        system: Mapping[str, Any] | None = None,
        application_properties: Mapping[str, Any] | None = None,
    ) -> None:
        values: dict[str, Any] = dict.fromkeys(SYSTEM_PROPERTIES)
        for name, value in (system or {}).items():
            if name.lower() not in SYSTEM_PROPERTIES:
                raise InvalidArgumentError(
                    f"{name!r} is not a Service Bus system property; known: "
                    + ", ".join(sorted(p.name for p in SYSTEM_PROPERTIES.values()))
                )
            values[name.lower()] = value
        if values["subject"] is None:
            values["subject"] = values["label"]
        values["label"] = values["subject"]
        self.system = values
        self.application_properties: dict[str, Any] = dict(application_properties or {})
        self.user = _lower_keys(self.application_properties)

    @classmethod
    def of(cls, message: Any) -> MessageView:
        """The view of a :class:`~oncebus.core.messages.Message` or :class:`~oncebus.core.messages.StoredMessage`.

        Reads only public fields, by name: a stored message contributes its
        sequence number, enqueued and expiry times, delivery count; a message
        being sent has none of those yet (they read as null). ``sys.Size`` is
        computed only if a rule reads it.
        """
        system = _EMPTY_SYSTEM.copy()
        for field, key in _FIELD_TO_SYSTEM_ITEMS:
            system[key] = getattr(message, field, None)
        system["subject"] = system["label"]
        if hasattr(message, "time_to_live_us"):  # a StoredMessage: times in microseconds
            ttl_us, scheduled_us = message.time_to_live_us, message.scheduled_enqueue_time_us
            system["timetolive"] = None if ttl_us is None else timedelta(microseconds=ttl_us)
            system["scheduledenqueuetimeutc"] = None if scheduled_us is None else us_to_datetime(scheduled_us)
            enqueued, expires = message.enqueued_time_us, message.expires_at_us
            system["enqueuedtimeutc"] = None if enqueued is None else us_to_datetime(enqueued)
            system["expiresatutc"] = None if expires is None else us_to_datetime(expires)
            system["sequencenumber"] = message.sequence_number
            system["deliverycount"] = message.delivery_count
            system["deadlettersource"] = message.dead_letter_source
            system["size"] = _LazySize(lambda: _stored_size(message))
        else:
            system["size"] = _LazySize(lambda: getattr(message, "size", None))
        view = cls.__new__(cls)
        view.system = system
        view.application_properties = dict(getattr(message, "application_properties", None) or {})
        view.user = _lower_keys(view.application_properties)
        return view

    def system_value(self, key: str) -> Any:
        """A system property by lower-case name (read ``sys.Size`` through here: it is computed on first use)."""
        value = self.system.get(key)
        if type(value) is _LazySize:
            value = self.system[key] = value.compute()
        return value

    def copy(self) -> MessageView:
        """A copy an action may change (the view itself is never changed)."""
        view = MessageView.__new__(MessageView)
        view.system = dict(self.system)
        view.application_properties = dict(self.application_properties)
        view.user = dict(self.user)
        return view

    def user_key(self, lower: str) -> str | None:
        """The original name of the application property whose lower-case name is ``lower``."""
        for key in self.application_properties:
            if key.lower() == lower:
                return key
        return None

    def set_user(self, name: str, value: Any) -> None:
        lower = name.lower()
        key = self.user_key(lower) or name
        self.application_properties[key] = value
        self.user[lower] = value

    def remove_user(self, name: str) -> None:
        lower = name.lower()
        for key in [k for k in self.application_properties if k.lower() == lower]:
            del self.application_properties[key]
        self.user.pop(lower, None)

    def set_system(self, key: str, value: Any) -> None:
        self.system[key] = value
        if key in ("label", "subject"):
            self.system["label"] = self.system["subject"] = value

    def __iter__(self) -> Iterator[str]:  # pragma: no cover - convenience for debugging
        return iter(self.application_properties)

    def __repr__(self) -> str:
        system = {
            SYSTEM_PROPERTIES[k].name: self.system_value(k)
            for k, v in self.system.items()
            if v is not None and k != "label" and self.system_value(k) is not None
        }
        return f"MessageView(system={system!r}, application_properties={self.application_properties!r})"


def _lower_keys(properties: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in properties.items():
        if type(key) is not str:
            continue
        out.setdefault(key.lower(), value)
    return out


def _stored_size(message: Any) -> int:
    # the same count as Message.size: the wire bytes when kept, else body plus properties
    wire = getattr(message, "wire", None)
    if wire is not None:
        return len(wire)
    props = getattr(message, "application_properties", None) or {}
    text = json.dumps(props, default=str) if props else ""
    return len(getattr(message, "body", None) or b"") + len(text.encode())
