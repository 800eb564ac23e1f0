"""Entity properties with Service Bus names, defaults and validation.

Names follow ``azure.servicebus.management`` (``QueueProperties`` and friends)
so users recognise them. Durations are ``timedelta``; ISO-8601 text is accepted
wherever a duration is given.
"""

from __future__ import annotations

import base64
import dataclasses
import re
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar
from urllib.parse import urlsplit

from oncebus.core.durations import TIMESPAN_MAX, format_duration, parse_duration
from oncebus.core.errors import (
    ArgumentOutOfRangeError,
    ImmutablePropertyError,
    InvalidArgumentError,
)

MIN_DUPLICATE_WINDOW = timedelta(seconds=20)
MAX_DUPLICATE_WINDOW = timedelta(days=7)
DEFAULT_DUPLICATE_WINDOW = timedelta(minutes=10)
WINDOW_RANGE_TEXT = "The value supplied must be between 00:00:20 and 7.00:00:00."

MIN_AUTO_DELETE_ON_IDLE = timedelta(minutes=5)

MIN_LOCK_DURATION = timedelta(seconds=5)
MAX_LOCK_DURATION = timedelta(minutes=5)
MAX_MESSAGE_SIZE_KB = 102_400
MAX_SIZE_MB = 81_920

_ENTITY_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._/-]{0,258}[A-Za-z0-9])?")
_SUBSCRIPTION_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,48}[A-Za-z0-9])?")
_RESERVED = ("$", "subscriptions", "rules")


def validate_entity_name(name: str, *, kind: str = "queue") -> str:
    """Queue and topic names: 1-260 letters, digits, '.', '-', '_', '/'; start and end alphanumeric."""
    if not isinstance(name, str) or not _ENTITY_NAME.fullmatch(name) or "//" in name:
        raise InvalidArgumentError(
            f"{kind} name {name!r} is not valid: use 1 to 260 letters, digits, '.', '-', '_' or '/', "
            "starting and ending with a letter or digit"
        )
    if any(part.lower() in _RESERVED for part in name.split("/")):
        raise InvalidArgumentError(f"{kind} name {name!r} uses a reserved word ($, Subscriptions, Rules)")
    return name


def entity_of_path(path: str) -> str:
    """The queue or topic a path belongs to: ``orders/$DeadLetterQueue`` -> ``orders``, ``a/b/$management`` ->
    ``a/b``, ``t/Subscriptions/s/Rules/r`` -> ``t``; ``$Resources/Queues`` -> ``""`` (no entity). No entity name
    holds ``$`` or a segment ``Subscriptions`` or ``Rules``, so the first such segment ends the entity's name and
    every other segment belongs to it: ``a/b`` names the queue or topic ``a/b``, never a part of ``a``."""
    parts = path.strip("/").split("/")
    for end, part in enumerate(parts):
        if part.startswith("$") or part.lower() in _RESERVED:
            return "/".join(parts[:end])
    return "/".join(parts)


def validate_subscription_name(name: str) -> str:
    """Subscription names: 1-50 letters, digits, '.', '-', '_'; start and end alphanumeric."""
    if not isinstance(name, str) or not _SUBSCRIPTION_NAME.fullmatch(name):
        raise InvalidArgumentError(
            f"subscription name {name!r} is not valid: use 1 to 50 letters, digits, '.', '-' or '_', "
            "starting and ending with a letter or digit"
        )
    return name


def validate_duplicate_window(value: Any) -> timedelta:
    window = parse_duration(value, name="duplicate_detection_history_time_window")
    if not MIN_DUPLICATE_WINDOW <= window <= MAX_DUPLICATE_WINDOW:
        raise ArgumentOutOfRangeError(
            f"duplicate_detection_history_time_window {format_duration(window)}: {WINDOW_RANGE_TEXT}"
        )
    return window


def _lock_duration(value: Any) -> timedelta:
    duration = parse_duration(value, name="lock_duration")
    if not MIN_LOCK_DURATION <= duration <= MAX_LOCK_DURATION:
        raise ArgumentOutOfRangeError(
            f"lock_duration {format_duration(duration)} is out of range: "
            "it must be between 5 seconds (PT5S) and 5 minutes (PT5M)"
        )
    return duration


def _ttl(value: Any) -> timedelta:
    ttl = parse_duration(value, name="default_message_time_to_live")
    if ttl < timedelta(seconds=1):
        raise ArgumentOutOfRangeError(
            f"default_message_time_to_live {format_duration(ttl)} is too short: it must be at least 1 second (PT1S)"
        )
    return ttl


def _positive_int(name: str, upper: int) -> Any:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= upper:
            raise ArgumentOutOfRangeError(f"{name} {value!r} is out of range: it must be an integer from 1 to {upper}")
        return int(value)

    return check


def _flag(name: str) -> Any:
    def check(value: Any) -> bool:
        if not isinstance(value, bool):
            raise InvalidArgumentError(f"{name} must be true or false, not {value!r}")
        return value

    return check


def _text_or_none(name: str) -> Any:
    def check(value: Any) -> str | None:
        if value is not None and not isinstance(value, str):
            raise InvalidArgumentError(f"{name} must be text, not {value!r}")
        if value is not None and len(value) > 1024:
            raise InvalidArgumentError(f"{name} is {len(value)} characters; at most 1024 are allowed")
        return value

    return check


def _auto_delete_on_idle(value: Any) -> timedelta:
    idle = parse_duration(value, name="auto_delete_on_idle")
    if idle < MIN_AUTO_DELETE_ON_IDLE:
        raise ArgumentOutOfRangeError(
            f"auto_delete_on_idle {format_duration(idle)} is out of range: it must be at least 5 minutes (PT5M), "
            f"or {format_duration(TIMESPAN_MAX)} (never)"
        )
    return idle


def forward_target(value: Any, name: str = "forward_to") -> str | None:
    """A forwarding destination: a queue or topic name, or its URL (``sb://host/name``, as the SDK sends it).

    Empty text means no forwarding. The destination's existence is checked by the namespace.
    """
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{name} must be the name of a queue or topic, not {value!r}")
    text = value.strip()
    if "://" in text:
        text = urlsplit(text).path
    text = text.strip("/")
    if not text:
        return None
    try:
        return validate_entity_name(text, kind=f"{name} destination")
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"{name}: {exc}") from None


ACCESS_RIGHTS = ("Manage", "Send", "Listen")
MAX_AUTHORIZATION_RULES = 12  # per entity, as Azure allows
_KEY_NAME = re.compile(r"[A-Za-z0-9._-]{1,256}")


@dataclass(frozen=True)
class AuthorizationRule:
    """A shared access rule of one queue or topic (its subscriptions included): a token signed with either
    key grants ``rights`` on the entity and below it, never above. Field names follow
    ``azure.servicebus.management.AuthorizationRule``; a key left out is generated, as Azure does."""

    key_name: str
    primary_key: str
    secondary_key: str
    rights: tuple[str, ...]  # of Manage, Send, Listen, in that order; Manage implies the other two

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _new_key() -> str:
    return base64.b64encode(secrets.token_bytes(32)).decode("ascii")


def _rule_value(item: Any, name: str) -> Any:
    """A field of a rule given as this model, the SDK's object, or a mapping (snake_case or Service Bus names)."""
    if isinstance(item, dict):
        for key in (name, service_bus_name(name)):
            if key in item:
                return item[key]
        return None
    return getattr(item, name, None)


def _authorization_rule(item: Any, where: str) -> AuthorizationRule:
    key_name = _rule_value(item, "key_name")
    if not isinstance(key_name, str) or not _KEY_NAME.fullmatch(key_name):
        raise InvalidArgumentError(
            f"{where}: key_name {key_name!r} is not valid: use 1 to 256 letters, digits, '.', '-' or '_'"
        )
    keys = []
    for field in ("primary_key", "secondary_key"):
        key = _rule_value(item, field)
        if key is None or key == "":
            key = _new_key()
        if not isinstance(key, str) or len(key) > 256:
            raise InvalidArgumentError(f"{where}: {field} must be text of at most 256 characters")
        keys.append(key)
    given = _rule_value(item, "rights")
    if isinstance(given, str):
        given = [given]
    if not isinstance(given, list | tuple) or not given:
        raise InvalidArgumentError(f"{where}: rights must list at least one of {', '.join(ACCESS_RIGHTS)}")
    rights: set[str] = set()
    for right in given:
        text = str(getattr(right, "value", right))  # the SDK's AccessRights enum, or text
        match = [r for r in ACCESS_RIGHTS if r.lower() == text.strip().lower()]
        if not match:
            raise InvalidArgumentError(f"{where}: {text!r} is not a right; use {', '.join(ACCESS_RIGHTS)}")
        rights.add(match[0])
    if "Manage" in rights and not {"Send", "Listen"} <= rights:
        raise InvalidArgumentError(f"{where}: a rule with Manage must also have Send and Listen (as Azure requires)")
    return AuthorizationRule(key_name, keys[0], keys[1], tuple(r for r in ACCESS_RIGHTS if r in rights))


def _authorization_rules(value: Any) -> tuple[AuthorizationRule, ...]:
    if not isinstance(value, list | tuple):
        raise InvalidArgumentError(f"authorization_rules must be a list of rules, not {type(value).__name__}")
    if len(value) > MAX_AUTHORIZATION_RULES:
        raise InvalidArgumentError(
            f"authorization_rules: {len(value)} rules; an entity has at most {MAX_AUTHORIZATION_RULES}"
        )
    rules = tuple(_authorization_rule(item, f"authorization rule {i + 1}") for i, item in enumerate(value))
    names = [rule.key_name for rule in rules]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise InvalidArgumentError(f"authorization_rules: the key name {twice[0]!r} is given twice")
    return rules


STATUSES = ("Active", "Disabled", "SendDisabled", "ReceiveDisabled")


def _status(value: Any) -> str:
    """An entity status as Service Bus spells it (any case accepted); which apply to which kind: each class's."""
    match = [s for s in STATUSES if isinstance(value, str) and s.lower() == value.strip().lower()]
    if not match:
        raise InvalidArgumentError(f"status {value!r} is not one of {', '.join(STATUSES)}")
    return match[0]


_VALIDATORS: dict[str, Any] = {
    "status": _status,
    "authorization_rules": _authorization_rules,
    "lock_duration": _lock_duration,
    "max_size_in_megabytes": _positive_int("max_size_in_megabytes", MAX_SIZE_MB),
    "requires_duplicate_detection": _flag("requires_duplicate_detection"),
    "requires_session": _flag("requires_session"),
    "default_message_time_to_live": _ttl,
    "dead_lettering_on_message_expiration": _flag("dead_lettering_on_message_expiration"),
    "duplicate_detection_history_time_window": validate_duplicate_window,
    "max_delivery_count": _positive_int("max_delivery_count", 2_147_483_647),
    "enable_batched_operations": _flag("enable_batched_operations"),
    "enable_express": _flag("enable_express"),
    "enable_partitioning": _flag("enable_partitioning"),
    "max_message_size_in_kilobytes": _positive_int("max_message_size_in_kilobytes", MAX_MESSAGE_SIZE_KB),
    "support_ordering": _flag("support_ordering"),
    "user_metadata": _text_or_none("user_metadata"),
    "auto_delete_on_idle": _auto_delete_on_idle,
    "forward_to": forward_target,
    "forward_dead_lettered_messages_to": lambda v: forward_target(v, "forward_dead_lettered_messages_to"),
    "dead_lettering_on_filter_evaluation_exceptions": _flag("dead_lettering_on_filter_evaluation_exceptions"),
}


STAMPS = ("created_at_us", "updated_at_us", "accessed_at_us")
_NOT_SETTABLE = ("name", *STAMPS)


@dataclass(frozen=True)
class _EntityProperties:
    """Shared behaviour: validated construction, immutable-at-creation checks, dict round trip."""

    kind: ClassVar[str] = "entity"
    immutable: ClassVar[tuple[str, ...]] = ()
    statuses: ClassVar[tuple[str, ...]] = STATUSES

    name: str
    # when the entity was created and last changed (µs since the epoch; None: written by a release before 0.2),
    # kept by the broker, never set by a caller, not compared
    created_at_us: int | None = dataclasses.field(default=None, compare=False)
    updated_at_us: int | None = dataclasses.field(default=None, compare=False)
    # when it was last sent to, received from or managed, as a clean stop stored it (so that auto_delete_on_idle
    # counts across a restart); read at a start, never written by to_dict (broker.upkeep.Activity writes it)
    accessed_at_us: int | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self) -> None:
        status = getattr(self, "status", "Active")
        if status not in self.statuses:
            raise InvalidArgumentError(
                f"status {status!r} does not apply to a {self.kind}: use {', '.join(self.statuses)}"
            )

    @classmethod
    def create(cls, name: str, **values: Any) -> Any:
        return cls._create(name, values)

    @classmethod
    def _create(cls, name: str, values: dict[str, Any]) -> Any:
        unknown = sorted(set(values) - cls.settable())
        if unknown:
            raise InvalidArgumentError(
                f"unknown {cls.kind} propert{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; "
                f"allowed: {', '.join(sorted(cls.settable()))}"
            )
        checked = {key: _VALIDATORS[key](value) for key, value in values.items() if value is not None}
        return cls(name=name, **checked)

    @property
    def forwards(self) -> bool:
        """Whether messages arriving here go on to another entity (``forward_to``)."""
        return getattr(self, "forward_to", None) is not None

    @classmethod
    def settable(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls) if f.name not in _NOT_SETTABLE}

    def stamped(self, now_us: int, *, created: bool = False) -> Any:
        """A copy changed at ``now_us`` (and created then, if ``created``)."""
        return dataclasses.replace(self, created_at_us=now_us if created else self.created_at_us, updated_at_us=now_us)

    def updated(self, **changes: Any) -> Any:
        """A copy with ``changes`` applied; properties fixed at creation may only be repeated."""
        unknown = sorted(set(changes) - self.settable())
        if unknown:
            raise InvalidArgumentError(
                f"unknown {self.kind} propert{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; "
                f"allowed: {', '.join(sorted(self.settable()))}"
            )
        checked = {key: _VALIDATORS[key](value) for key, value in changes.items() if value is not None}
        for key in ("forward_to", "forward_dead_lettered_messages_to"):  # "" (or None given explicitly) clears it
            if key in changes and key in self.settable() and checked.get(key) is None:
                checked[key] = None
        for key in self.immutable:
            if key in checked and checked[key] != getattr(self, key):
                raise ImmutablePropertyError(
                    f"{key} of {self.kind} {self.name!r} cannot be changed after creation "
                    f"(it is {getattr(self, key)}); delete and recreate the {self.kind} to change it. "
                    "SubCode=40000"
                )
        return dataclasses.replace(self, **checked)

    def to_dict(self) -> dict[str, Any]:
        """The properties as JSON values (the times only once the broker has set them)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if (f.name in STAMPS and value is None) or f.name == "accessed_at_us":
                continue
            if f.name == "authorization_rules":
                value = [rule.to_dict() for rule in value]
            out[f.name] = format_duration(value) if isinstance(value, timedelta) else value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Any:
        values = dict(data)
        name = values.pop("name")
        stamps = {key: values.pop(key) for key in STAMPS if key in values}
        return dataclasses.replace(cls._create(name, values), **stamps)


@dataclass(frozen=True)
class QueueProperties(_EntityProperties):
    kind: ClassVar[str] = "queue"
    immutable: ClassVar[tuple[str, ...]] = ("requires_duplicate_detection", "enable_partitioning", "requires_session")

    lock_duration: timedelta = timedelta(minutes=1)
    max_size_in_megabytes: int = 1024
    requires_duplicate_detection: bool = False
    requires_session: bool = False
    default_message_time_to_live: timedelta = TIMESPAN_MAX
    dead_lettering_on_message_expiration: bool = False
    duplicate_detection_history_time_window: timedelta = DEFAULT_DUPLICATE_WINDOW
    max_delivery_count: int = 10
    enable_batched_operations: bool = True
    enable_partitioning: bool = False
    max_message_size_in_kilobytes: int = 256
    user_metadata: str | None = None
    auto_delete_on_idle: timedelta = TIMESPAN_MAX
    forward_to: str | None = None
    forward_dead_lettered_messages_to: str | None = None
    status: str = "Active"
    authorization_rules: tuple[AuthorizationRule, ...] = ()
    # Azure keeps an express entity's messages in memory before it writes them; oncebus takes the setting and
    # stores every message before it answers, as for any entity
    enable_express: bool = False


@dataclass(frozen=True)
class TopicProperties(_EntityProperties):
    kind: ClassVar[str] = "topic"
    immutable: ClassVar[tuple[str, ...]] = ("requires_duplicate_detection", "enable_partitioning")
    statuses: ClassVar[tuple[str, ...]] = ("Active", "Disabled", "SendDisabled")

    max_size_in_megabytes: int = 1024
    requires_duplicate_detection: bool = False
    default_message_time_to_live: timedelta = TIMESPAN_MAX
    duplicate_detection_history_time_window: timedelta = DEFAULT_DUPLICATE_WINDOW
    enable_batched_operations: bool = True
    support_ordering: bool = False
    enable_partitioning: bool = False
    max_message_size_in_kilobytes: int = 256
    user_metadata: str | None = None
    auto_delete_on_idle: timedelta = TIMESPAN_MAX
    status: str = "Active"
    authorization_rules: tuple[AuthorizationRule, ...] = ()
    enable_express: bool = False  # accepted and kept; stored durably as any topic (see QueueProperties)


@dataclass(frozen=True)
class SubscriptionProperties(_EntityProperties):
    kind: ClassVar[str] = "subscription"
    immutable: ClassVar[tuple[str, ...]] = ("requires_session",)
    statuses: ClassVar[tuple[str, ...]] = ("Active", "Disabled", "ReceiveDisabled")

    lock_duration: timedelta = timedelta(minutes=1)
    requires_session: bool = False
    default_message_time_to_live: timedelta = TIMESPAN_MAX
    dead_lettering_on_message_expiration: bool = False
    max_delivery_count: int = 10
    enable_batched_operations: bool = True
    user_metadata: str | None = None
    auto_delete_on_idle: timedelta = TIMESPAN_MAX
    forward_to: str | None = None
    forward_dead_lettered_messages_to: str | None = None
    dead_lettering_on_filter_evaluation_exceptions: bool = True
    status: str = "Active"


# ---------------------------------------------------------------------------------------------- the schema
ENTITY_CLASSES: dict[str, type[_EntityProperties]] = {
    "queue": QueueProperties,
    "topic": TopicProperties,
    "subscription": SubscriptionProperties,
}


def service_bus_name(field: str) -> str:
    """A property's Service Bus name, as the REST API's XML and the emulator's config write it
    (``max_size_in_megabytes`` -> ``MaxSizeInMegabytes``)."""
    return "".join(part.capitalize() for part in field.split("_"))


def field_name(service_bus: str) -> str:
    """The property a Service Bus name means (``MaxSizeInMegabytes`` -> ``max_size_in_megabytes``)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", service_bus).lower()


def property_kinds(kind: str) -> dict[str, str]:
    """The settable properties of an entity kind and each one's value kind: ``duration``, ``flag``, ``count``,
    ``text``, ``status`` or ``rules``. Every door that reads or writes entity properties (the administration API's XML,
    the topology file, the CLI) takes the names and kinds from here."""
    cls = ENTITY_CLASSES[kind]
    settable = cls.settable()
    out: dict[str, str] = {}
    for f in dataclasses.fields(cls):
        if f.name not in settable:
            continue
        declared = str(f.type)
        if f.name == "status":
            out[f.name] = "status"
        elif f.name == "authorization_rules":
            out[f.name] = "rules"
        elif declared == "timedelta":
            out[f.name] = "duration"
        elif declared == "bool":
            out[f.name] = "flag"
        elif declared == "int":
            out[f.name] = "count"
        elif declared in ("str", "str | None"):
            out[f.name] = "text"
        else:  # pragma: no cover - a new field of a new type needs a kind here and a converter at each door
            raise TypeError(f"{cls.__name__}.{f.name}: no value kind for {declared}")
    return out
