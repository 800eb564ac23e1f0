"""A stored message's AMQP encoding after a rule action changed its copy (``SET``/``REMOVE``).

A subscription's copy keeps its sender's encoding (``wire``) so a receiver
gets back exactly what was sent. When a rule action changes the copy's
properties, the broker keeps the encoding and names the changed fields
(``StoredMessage.rewritten``); the delivery encoder (``outgoing.encode_received``)
calls :func:`reencode` when it sends the copy: the properties, application-properties, header (time to live)
and message-annotations (partition key) sections are rewritten from the
copy's fields; every other section (the body above all: data, value or
sequence) is kept byte for byte. Application properties the action left alone
keep their AMQP types (an ``int32`` stays an ``int32``); a changed number keeps
the type of the property it replaces when it fits, as .NET converts it.
"""

from __future__ import annotations

import datetime
from collections.abc import Collection, Mapping
from decimal import Decimal
from typing import Any, Protocol

import proton

from oncebus.amqp.codec import (
    APPLICATION_PROPERTIES,
    HEADER,
    MESSAGE_ANNOTATIONS,
    PARTITION_KEY,
    PROPERTIES,
    _json_safe,
    encode_section,
    split_sections,
)
from oncebus.amqp.values import text as _text
from oncebus.core.properties import LONG_MAX, WIRE_PROPERTY_FIELDS
from oncebus.core.timeutil import datetime_to_us


class Rewritten(Protocol):
    """A message whose fields a rule action changed: a stored copy, or the view a receiver gets of it."""

    @property
    def application_properties(self) -> Mapping[str, Any]: ...

    @property
    def time_to_live_us(self) -> int | None: ...

    @property
    def partition_key(self) -> str | None: ...


_PROPERTY_FIELDS = WIRE_PROPERTY_FIELDS  # properties-section field index -> StoredMessage field
_INT_TYPES = {
    proton.byte: (-(2**7), 2**7 - 1),
    proton.short: (-(2**15), 2**15 - 1),
    proton.int32: (-(2**31), 2**31 - 1),
    proton.ubyte: (0, 2**8 - 1),
    proton.ushort: (0, 2**16 - 1),
    proton.uint: (0, 2**32 - 1),
    proton.ulong: (0, 2**64 - 1),
}


def amqp_value(new: Any, old: Any = None) -> Any:
    """An application property's value as proton encodes it: in the type of the value it replaces (``old``, when
    an action set it) where that holds it; an integer past a long's range as a ulong; times and durations as
    Service Bus carries them."""
    if isinstance(new, bool):
        return new
    if isinstance(new, int):
        bounds = _INT_TYPES.get(type(old))
        if bounds is not None and bounds[0] <= new <= bounds[1]:
            return type(old)(new)
        return proton.ulong(new) if new > LONG_MAX else int(new)
    if isinstance(new, float):
        return proton.float32(new) if isinstance(old, proton.float32) else new
    if isinstance(new, datetime.datetime):
        return proton.timestamp(datetime_to_us(new) // 1000)
    if isinstance(new, datetime.timedelta):  # Service Bus's TimeSpan on the wire: 100-ns ticks
        return proton.Described(
            proton.symbol("com.microsoft:timespan"), int(new / datetime.timedelta(microseconds=1)) * 10
        )
    if isinstance(new, Decimal):
        return str(new)
    return new


def _application_properties(original: Mapping[Any, Any], wanted: Mapping[str, Any]) -> dict[Any, Any]:
    by_name = {str(k): (k, v) for k, v in original.items()}
    out: dict[Any, Any] = {}
    for name, value in wanted.items():
        kept = by_name.get(name)
        if kept is not None and _json_safe(kept[1]) == value and type(_json_safe(kept[1])) is type(value):
            out[kept[0]] = kept[1]  # untouched: its original AMQP type
        else:
            out[name] = amqp_value(value, None if kept is None else kept[1])
    return out


def _properties_value(current: list[Any] | None, copy: Rewritten, changed: Collection[str]) -> list[Any]:
    fields: list[Any] = list(current or [])
    fields += [None] * (13 - len(fields))
    for index, name in _PROPERTY_FIELDS.items():
        if name not in changed:
            continue
        value = getattr(copy, name)
        old = fields[index]
        if value is None:
            fields[index] = None
        elif index == 6:
            fields[index] = proton.symbol(value)
        elif index == 0 and not isinstance(value, str):
            fields[index] = old if old is not None else value  # a typed message id is never changed by an action
        elif _text(old) != value:
            fields[index] = value
    while fields and fields[-1] is None:
        fields.pop()
    return fields


def reencode(wire: bytes, copy: Rewritten, changed: Collection[str]) -> bytes:
    """``wire`` with the application properties of ``copy``, and the ``changed`` fields of ``copy``.

    ``changed`` names the :class:`~oncebus.core.messages.Message` fields an action set or removed
    (``to``, ``subject``, ``time_to_live``, ``partition_key``...); the others keep their encoding.
    """
    sections = split_sections(wire)
    out: list[bytes] = []
    have = {s.code for s in sections}

    def properties() -> bytes:
        current = next((s.value() for s in sections if s.code == PROPERTIES), None)
        return encode_section(PROPERTIES, _properties_value(current, copy, changed))

    def application() -> bytes:
        current = next((s.value() for s in sections if s.code == APPLICATION_PROPERTIES), None) or {}
        # string keys, as AMQP wants them there (proton's PropertyDict would make them symbols)
        return encode_section(APPLICATION_PROPERTIES, _application_properties(current, copy.application_properties))

    for section in sections:
        if section.code == HEADER and "time_to_live" in changed:
            header = list(section.value() or [])
            header += [None] * (5 - len(header))
            header[2] = (
                None if copy.time_to_live_us is None else proton.uint(min(copy.time_to_live_us // 1000, 2**32 - 1))
            )
            out.append(encode_section(HEADER, header))
        elif section.code == MESSAGE_ANNOTATIONS and "partition_key" in changed:
            annotations = dict(section.value() or {})
            if copy.partition_key is None:
                annotations.pop(PARTITION_KEY, None)
            else:
                annotations[PARTITION_KEY] = copy.partition_key
            out.append(encode_section(MESSAGE_ANNOTATIONS, proton.AnnotationDict(annotations)))
        elif section.code == PROPERTIES:
            out.append(properties() if changed else section.raw)
        elif section.code == APPLICATION_PROPERTIES:
            out.append(application())
        else:
            if section.code > APPLICATION_PROPERTIES:  # sections missing before the body are added in their place
                if PROPERTIES not in have and changed:
                    out.append(properties())
                    have.add(PROPERTIES)
                if APPLICATION_PROPERTIES not in have and copy.application_properties:
                    out.append(application())
                    have.add(APPLICATION_PROPERTIES)
            out.append(section.raw)
    return b"".join(out)
