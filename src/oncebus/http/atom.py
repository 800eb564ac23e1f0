"""The Service Bus ATOM/XML documents: entity descriptions in and out, feeds, errors.

Elements are written in the order ``azure-servicebus`` writes them
(``management/_model_workaround.MODEL_CLASS_ATTRIBUTES``, which is Azure's), with
the XML types its generated models parse: durations as ISO-8601, booleans
``true``/``false``, times as ISO-8601 UTC. Incoming bodies are parsed with
``defusedxml`` (no DTDs, no entity expansion) and matched by local element
name, so the SDK's ``ns1:`` prefixes, its default-namespace workaround and hand
written bodies all read the same.

This module only converts text to Python values; the values are validated
where every door validates them, in ``oncebus.core.entities`` (through the
Namespace).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from xml.etree.ElementTree import Element
from xml.sax.saxutils import escape, quoteattr

import defusedxml.ElementTree as SafeET
from defusedxml import DefusedXmlException

from oncebus.broker import RuntimeProperties
from oncebus.core.durations import TIMESPAN_MAX, format_duration, parse_duration
from oncebus.core.entities import (
    ENTITY_CLASSES,
    AuthorizationRule,
    QueueProperties,
    SubscriptionProperties,
    TopicProperties,
    property_kinds,
    service_bus_name,
)
from oncebus.core.errors import InvalidArgumentError

ATOM_NS = "http://www.w3.org/2005/Atom"
SB_NS = "http://schemas.microsoft.com/netservices/2010/10/servicebus/connect"
SB_COUNTS_NS = "http://schemas.microsoft.com/netservices/2011/06/servicebus"
XSI_NS = "http://www.w3.org/2001/XMLSchema-instance"

ATOM_ENTRY = "application/atom+xml;type=entry;charset=utf-8"
ATOM_FEED = "application/atom+xml;type=feed;charset=utf-8"
XML = "application/xml; charset=utf-8"

# The SDK turns TimeSpan.MaxValue into P10675199DT2H48M5.477539S on its way back (a float round trip):
# anything this close to the maximum is the maximum.
_MAX_SLACK = timedelta(milliseconds=1)


# ----------------------------------------------------------------------------------------- writing
def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, timedelta):
        return format_duration(value)
    if isinstance(value, datetime):
        return format_time(value)
    return str(value)


def format_time(value: datetime) -> str:
    value = value.astimezone(UTC)
    if value.year == 1:
        return "0001-01-01T00:00:00Z"
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond:06d}0Z"


def _elements(fields: Iterable[tuple[str, Any]]) -> str:
    out = []
    for name, value in fields:
        if value is None:
            continue
        if isinstance(value, _Raw):
            out.append(value.xml)
        else:
            out.append(f"<{name}>{escape(_text(value))}</{name}>")
    return "".join(out)


@dataclass(frozen=True)
class _Raw:
    xml: str


def _counts(rt: RuntimeProperties) -> _Raw:
    parts = [
        ("ActiveMessageCount", rt.active_message_count),
        ("DeadLetterMessageCount", rt.dead_letter_message_count),
        ("ScheduledMessageCount", rt.scheduled_message_count),
        ("TransferMessageCount", rt.transfer_message_count),
        ("TransferDeadLetterMessageCount", rt.transfer_dead_letter_message_count),
    ]
    inner = "".join(f"<d2p1:{n}>{v}</d2p1:{n}>" for n, v in parts)
    return _Raw(f'<CountDetails xmlns:d2p1="{SB_COUNTS_NS}">{inner}</CountDetails>')


def _description(tag: str, fields: Sequence[tuple[str, Any]]) -> str:
    return f'<{tag} xmlns="{SB_NS}" xmlns:i="{XSI_NS}">{_elements(fields)}</{tag}>'


def forward_url(name: str | None, base: str) -> str | None:
    """A forwarding destination as Service Bus shows it: ``sb://<host>/<name>`` (``base`` is the request's host)."""
    if name is None:
        return None
    return f"sb://{base}/{name}" if base else name


def queue_description(props: QueueProperties, rt: RuntimeProperties, api_version: str, base: str = "") -> str:
    return _description(
        "QueueDescription",
        [
            ("LockDuration", props.lock_duration),
            ("MaxSizeInMegabytes", props.max_size_in_megabytes),
            ("RequiresDuplicateDetection", props.requires_duplicate_detection),
            ("RequiresSession", props.requires_session),
            ("DefaultMessageTimeToLive", props.default_message_time_to_live),
            ("DeadLetteringOnMessageExpiration", props.dead_lettering_on_message_expiration),
            ("DuplicateDetectionHistoryTimeWindow", props.duplicate_detection_history_time_window),
            ("MaxDeliveryCount", props.max_delivery_count),
            ("EnableBatchedOperations", props.enable_batched_operations),
            ("SizeInBytes", rt.size_in_bytes),
            ("MessageCount", rt.total_message_count),
            ("IsAnonymousAccessible", False),
            ("AuthorizationRules", _authorization_rules_xml(props.authorization_rules)),
            ("Status", props.status),
            ("CreatedAt", rt.created_at_utc),
            ("UpdatedAt", rt.updated_at_utc),
            ("AccessedAt", rt.accessed_at_utc),
            ("SupportOrdering", True),
            ("CountDetails", _counts(rt)),
            ("AutoDeleteOnIdle", props.auto_delete_on_idle),
            ("EnablePartitioning", props.enable_partitioning),
            ("EntityAvailabilityStatus", "Available"),
            ("EnableExpress", props.enable_express),
            ("ForwardTo", forward_url(props.forward_to, base)),
            ("UserMetadata", props.user_metadata),
            ("ForwardDeadLetteredMessagesTo", forward_url(props.forward_dead_lettered_messages_to, base)),
            ("MaxMessageSizeInKilobytes", None if api_version == "2017-04" else props.max_message_size_in_kilobytes),
        ],
    )


def topic_description(props: TopicProperties, rt: RuntimeProperties, api_version: str) -> str:
    return _description(
        "TopicDescription",
        [
            ("DefaultMessageTimeToLive", props.default_message_time_to_live),
            ("MaxSizeInMegabytes", props.max_size_in_megabytes),
            ("RequiresDuplicateDetection", props.requires_duplicate_detection),
            ("DuplicateDetectionHistoryTimeWindow", props.duplicate_detection_history_time_window),
            ("EnableBatchedOperations", props.enable_batched_operations),
            ("SizeInBytes", rt.size_in_bytes),
            ("FilteringMessagesBeforePublishing", False),
            ("IsAnonymousAccessible", False),
            ("AuthorizationRules", _authorization_rules_xml(props.authorization_rules)),
            ("Status", props.status),
            ("CreatedAt", rt.created_at_utc),
            ("UpdatedAt", rt.updated_at_utc),
            ("AccessedAt", rt.accessed_at_utc),
            ("SupportOrdering", props.support_ordering),
            ("CountDetails", _counts(rt)),
            ("SubscriptionCount", rt.subscription_count),
            ("SqlFilterCount", rt.sql_filter_count),
            ("CorrelationFilterCount", rt.correlation_filter_count),
            ("AutoDeleteOnIdle", props.auto_delete_on_idle),
            ("EnablePartitioning", props.enable_partitioning),
            ("EntityAvailabilityStatus", "Available"),
            ("EnableSubscriptionPartitioning", False),
            ("EnableExpress", props.enable_express),
            ("UserMetadata", props.user_metadata),
            ("MaxMessageSizeInKilobytes", None if api_version == "2017-04" else props.max_message_size_in_kilobytes),
        ],
    )


def subscription_description(props: SubscriptionProperties, rt: RuntimeProperties, base: str = "") -> str:
    return _description(
        "SubscriptionDescription",
        [
            ("LockDuration", props.lock_duration),
            ("RequiresSession", props.requires_session),
            ("DefaultMessageTimeToLive", props.default_message_time_to_live),
            ("DeadLetteringOnMessageExpiration", props.dead_lettering_on_message_expiration),
            ("DeadLetteringOnFilterEvaluationExceptions", props.dead_lettering_on_filter_evaluation_exceptions),
            ("MessageCount", rt.total_message_count),
            ("MaxDeliveryCount", props.max_delivery_count),
            ("EnableBatchedOperations", props.enable_batched_operations),
            ("Status", props.status),
            ("ForwardTo", forward_url(props.forward_to, base)),
            ("CreatedAt", rt.created_at_utc),
            ("UpdatedAt", rt.updated_at_utc),
            ("AccessedAt", rt.accessed_at_utc),
            ("CountDetails", _counts(rt)),
            ("ForwardDeadLetteredMessagesTo", forward_url(props.forward_dead_lettered_messages_to, base)),
            ("AutoDeleteOnIdle", props.auto_delete_on_idle),
            ("EntityAvailabilityStatus", "Available"),
            ("UserMetadata", props.user_metadata),
        ],
    )


@dataclass(frozen=True)
class RuleView:
    """A subscription rule as the administration API shows it (the rules engine will supply these)."""

    name: str
    filter_xml: str  # a complete <Filter i:type="..."> element
    action_xml: str  # a complete <Action i:type="..."> element
    created_at: datetime


TRUE_FILTER_XML = (
    '<Filter i:type="TrueFilter"><SqlExpression>1=1</SqlExpression><CompatibilityLevel>20</CompatibilityLevel></Filter>'
)
EMPTY_ACTION_XML = '<Action i:type="EmptyRuleAction"/>'


def rule_description(rule: RuleView) -> str:
    return _description(
        "RuleDescription",
        [
            ("Filter", _Raw(rule.filter_xml)),
            ("Action", _Raw(rule.action_xml)),
            ("CreatedAt", rule.created_at),
            ("Name", rule.name),
        ],
    )


def namespace_info(
    name: str, created: datetime, modified: datetime, tier: str = "Standard", messaging_units: int | None = None
) -> str:
    """``tier``: Standard or Premium (``MessagingSKU``); a Premium namespace reports its ``MessagingUnits``."""
    return _description(
        "NamespaceInfo",
        [
            ("CreatedTime", created),
            ("MessagingSKU", tier),
            ("MessagingUnits", messaging_units),
            ("ModifiedTime", modified),
            ("Name", name),
            ("NamespaceType", "Messaging"),
        ],
    )


def entry(base: str, title: str, content: str, *, published: datetime, updated: datetime, author: str) -> str:
    """One ``<entry>`` (a document of its own when ``base`` is given to :func:`document`)."""
    return (
        f"<entry xml:base={quoteattr(base)}>"
        f"<id>{escape(base)}</id>"
        f'<title type="text">{escape(title)}</title>'
        f"<published>{format_time(published)}</published>"
        f"<updated>{format_time(updated)}</updated>"
        f"<author><name>{escape(author)}</name></author>"
        f'<link rel="self" href={quoteattr(base)}/>'
        f'<content type="application/xml">{content}</content>'
        "</entry>"
    )


def entry_document(entry_xml: str) -> bytes:
    body = entry_xml.replace("<entry ", f'<entry xmlns="{ATOM_NS}" ', 1)
    return ('<?xml version="1.0" encoding="utf-8"?>' + body).encode("utf-8")


def feed_document(
    self_href: str, title: str, entries: Sequence[str], next_href: str | None, updated: datetime
) -> bytes:
    links = f'<link rel="self" href={quoteattr(self_href)}/>'
    if next_href is not None:
        links += f'<link rel="next" href={quoteattr(next_href)}/>'
    body = (
        f'<feed xmlns="{ATOM_NS}">'
        f'<title type="text">{escape(title)}</title>'
        f"<id>{escape(self_href)}</id>"
        f"<updated>{format_time(updated)}</updated>"
        f"{links}{''.join(entries)}</feed>"
    )
    return ('<?xml version="1.0" encoding="utf-8"?>' + body).encode("utf-8")


def error_document(status: int, detail: str) -> bytes:
    return f"<Error><Code>{status}</Code><Detail>{escape(detail)}</Detail></Error>".encode()


# ----------------------------------------------------------------------------------------- reading
@dataclass(frozen=True)
class Description:
    """An incoming description: its kind (Queue, Topic, Subscription, Rule) and its elements by local name."""

    kind: str
    fields: dict[str, Element]
    element: Element


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def parse_description(body: bytes) -> Description:
    """The ``<XxxDescription>`` inside an ATOM entry (or given bare)."""
    if not body.strip():
        raise InvalidArgumentError(
            "the request has no body: send an ATOM entry with a QueueDescription, TopicDescription, "
            "SubscriptionDescription or RuleDescription"
        )
    try:
        root = SafeET.fromstring(body)
    except DefusedXmlException as exc:
        raise InvalidArgumentError(
            f"the XML body uses a forbidden construct ({exc}): DTDs and entities are refused"
        ) from None
    except SafeET.ParseError as exc:
        raise InvalidArgumentError(f"the body is not well-formed XML: {exc}") from None
    found = None
    for element in root.iter():
        name = _local(element.tag)
        if name.endswith("Description") and name[: -len("Description")] in ("Queue", "Topic", "Subscription", "Rule"):
            found = element
            break
    if found is None:
        raise InvalidArgumentError(
            "the body has no QueueDescription, TopicDescription, SubscriptionDescription or RuleDescription"
        )
    fields: dict[str, Element] = {}
    for child in found:
        name = _local(child.tag)
        if name in fields:
            raise InvalidArgumentError(f"the element {name} appears twice in the description")
        fields[name] = child
    return Description(_local(found.tag)[: -len("Description")], fields, found)


def _bool(name: str, element: Element) -> bool:
    text = (element.text or "").strip().lower()
    if text not in ("true", "false"):
        raise InvalidArgumentError(f"{name} must be true or false, not {element.text!r}")
    return text == "true"


def _int(name: str, element: Element) -> int:
    text = (element.text or "").strip()
    try:
        return int(text)
    except ValueError:
        raise InvalidArgumentError(f"{name} must be a whole number, not {element.text!r}") from None


def _duration(name: str, element: Element) -> timedelta:
    value = parse_duration((element.text or "").strip(), name=name)
    if abs(value - TIMESPAN_MAX) <= _MAX_SLACK:
        return TIMESPAN_MAX
    return value


def _str(name: str, element: Element) -> str:
    return element.text or ""


def _status_text(name: str, element: Element) -> str | None:
    return (element.text or "").strip() or None  # empty: unchanged (core checks the value and the kind)


def _authorization_rules(name: str, element: Element) -> list[dict[str, Any]]:
    """``<AuthorizationRules>`` as the SDKs write it: each ``AuthorizationRule`` with its ``KeyName``, keys and
    ``Rights`` (``AccessRights`` items); the claim type and times are Azure's own, ignored. Core validates."""
    rules: list[dict[str, Any]] = []
    for rule in element:
        if _local(rule.tag) != "AuthorizationRule":
            raise InvalidArgumentError(f"{name} holds {_local(rule.tag)!r}; it holds AuthorizationRule elements")
        fields = {_local(child.tag): child for child in rule}
        rights = fields.get("Rights")
        rules.append(
            {
                "key_name": (fields["KeyName"].text or "").strip() if "KeyName" in fields else None,
                "primary_key": (fields["PrimaryKey"].text or "").strip() if "PrimaryKey" in fields else None,
                "secondary_key": (fields["SecondaryKey"].text or "").strip() if "SecondaryKey" in fields else None,
                "rights": [] if rights is None else [(item.text or "").strip() for item in rights],
            }
        )
    return rules


def _authorization_rules_xml(rules: Sequence[AuthorizationRule]) -> _Raw:
    items = []
    for rule in rules:
        rights = "".join(f"<AccessRights>{right}</AccessRights>" for right in rule.rights)
        items.append(
            '<AuthorizationRule i:type="SharedAccessAuthorizationRule">'
            "<ClaimType>SharedAccessKey</ClaimType><ClaimValue>None</ClaimValue>"
            f"<Rights>{rights}</Rights>"
            f"<KeyName>{escape(rule.key_name)}</KeyName><PrimaryKey>{escape(rule.primary_key)}</PrimaryKey>"
            f"<SecondaryKey>{escape(rule.secondary_key)}</SecondaryKey></AuthorizationRule>"
        )
    return _Raw("<AuthorizationRules>" + "".join(items) + "</AuthorizationRules>")


_CONVERTERS: dict[str, Any] = {
    "duration": _duration,
    "count": _int,
    "flag": _bool,
    "text": _str,
    "status": _status_text,
    "rules": _authorization_rules,
}
# settable elements: XML name -> (core property, converter), from core's schema
_SETTABLE: dict[str, dict[str, tuple[str, Any]]] = {
    kind.capitalize(): {
        service_bus_name(field): (field, _CONVERTERS[value_kind]) for field, value_kind in property_kinds(kind).items()
    }
    for kind in ENTITY_CLASSES
}

# read-only elements the SDK sends back on update (it echoes what it read): ignored
_READ_ONLY = {
    "SizeInBytes",
    "MessageCount",
    "CreatedAt",
    "UpdatedAt",
    "AccessedAt",
    "CountDetails",
    "MessageCountDetails",
    "EntityAvailabilityStatus",
    "SubscriptionCount",
    "SqlFilterCount",
    "CorrelationFilterCount",
}


# Service Bus features oncebus does not have: accepted only with the value that means "not used".
_DEFAULT_ONLY: dict[str, tuple[Any, str]] = {
    "IsAnonymousAccessible": (lambda n, e: not _bool(n, e), "anonymous access is not supported; it must be false"),
    "FilteringMessagesBeforePublishing": (lambda n, e: not _bool(n, e), "it must be false"),
    "EnableSubscriptionPartitioning": (lambda n, e: not _bool(n, e), "it must be false"),
}


# optional elements an update clears when it leaves them out (the SDK writes None as an absent element, and
# Service Bus reads an update's description whole: forward_to = None on an update stops the forwarding)
_CLEARED_WHEN_ABSENT = ("ForwardTo", "ForwardDeadLetteredMessagesTo")


def entity_changes(description: Description, kind: str, *, update: bool = False) -> dict[str, Any]:
    """The core properties an incoming description sets (validated later, by core, through the Namespace)."""
    settable = _SETTABLE[kind]
    changes: dict[str, Any] = {}
    if update:
        for name in _CLEARED_WHEN_ABSENT:
            if name in settable and name not in description.fields:
                changes[settable[name][0]] = None
    for name, element in description.fields.items():
        if name in settable:
            prop, convert = settable[name]
            changes[prop] = convert(name, element)
        elif name in _READ_ONLY or (kind == "Queue" and name == "SupportOrdering"):
            continue
        elif name in _DEFAULT_ONLY:
            check, why = _DEFAULT_ONLY[name]
            if not check(name, element):
                raise InvalidArgumentError(f"{name} {(element.text or '').strip()!r} is not supported: {why}")
        elif kind == "Subscription" and name == "DefaultRuleDescription":
            continue  # checked by the rules seam (see admin.py)
        else:
            allowed = sorted([*settable, *_DEFAULT_ONLY])
            raise InvalidArgumentError(
                f"unknown {kind}Description element {name}; known: {', '.join(allowed)} (and read-only runtime fields)"
            )
    return changes
