"""Many isolated namespaces in one broker: the registry the serve process keeps, ``{name: namespace}``.

The default namespace (the data directory's) is the one a key name without ``@`` reaches, as always. A
namespace created at run time (``PUT /$namespaces/<name>`` with a Manage key of the default namespace, or
``oncebus.testing``) has its own entities, messages, duplicate-detection history, faults and clock, lives in
memory (a :class:`~oncebus.store.memory.MemoryStore`: it does not survive a restart) and accepts the default
namespace's keys under the key name ``<key name>@<namespace>``: a client reaches it with the default connection
string and ``@<namespace>`` appended to ``SharedAccessKeyName``, every SDK unchanged.

Each created namespace's clock is the system time plus an offset of its own (:class:`OffsetClock`), moved
forward by :meth:`Namespaces.advance` (``oncebus.testing``'s ``Namespace.advance()``), so advancing one
namespace's time never moves another's. At most :data:`MAX_NAMESPACES` exist at once (``ONCEBUS_MAX_NAMESPACES``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from oncebus.auth import KeyRing
from oncebus.broker import Namespace
from oncebus.core.errors import (
    EntityAlreadyExistsError,
    EntityNotFoundError,
    InvalidArgumentError,
    OncebusError,
    QuotaExceededError,
)
from oncebus.core.tiers import TierQuotas
from oncebus.store.memory import MemoryStore

__all__ = [
    "MAX_NAMESPACES",
    "MAX_NAMESPACES_ENV",
    "NAME_RULE",
    "NamedNamespace",
    "Namespaces",
    "OffsetClock",
    "check_namespace_name",
]

_LOG = logging.getLogger(__name__)

MAX_NAMESPACES = 1000
MAX_NAMESPACES_ENV = "ONCEBUS_MAX_NAMESPACES"
_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
NAME_RULE = "1 to 63 characters: lower-case letters, digits and '-', starting with a letter or digit"


def check_namespace_name(name: object) -> str:
    """``name`` if it is a valid namespace name, else :class:`InvalidArgumentError` saying what is allowed."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        shown = repr(name)[:80]
        raise InvalidArgumentError(f"{shown} is not a namespace name: use {NAME_RULE}")
    return name


class OffsetClock:
    """The system time plus an offset that only grows (:meth:`advance`); never runs backwards."""

    def __init__(self) -> None:
        self.offset_us = 0
        self._last = 0
        self._lock = threading.Lock()

    def now_us(self) -> int:
        now = time.time_ns() // 1_000 + self.offset_us
        with self._lock:
            if now < self._last:
                return self._last
            self._last = now
            return now

    def advance(self, us: int) -> int:
        if us < 0:
            raise InvalidArgumentError(f"a namespace's time only moves forward; {us} µs is negative")
        with self._lock:
            self.offset_us += us
        return self.now_us()


@dataclass
class NamedNamespace:
    """One created namespace: its engine, clock and keys (the default namespace's, with its own entity rules)."""

    name: str
    namespace: Namespace
    clock: OffsetClock
    keys: KeyRing
    created_us: int
    extras: dict[str, Any] = field(default_factory=dict)  # what a front end builds for it once (HTTP apps)


class Namespaces:
    """The serve process's namespaces: the default one and those created at run time (all on one event loop)."""

    def __init__(
        self,
        default: Namespace,
        keys: KeyRing,
        *,
        quotas: TierQuotas | None = None,
        max_namespaces: int = MAX_NAMESPACES,  # Settings.max_namespaces (ONCEBUS_MAX_NAMESPACES)
    ) -> None:
        self.default = default
        self.keys = keys
        self.quotas = quotas if quotas is not None else default.quotas
        self.max_namespaces = max_namespaces
        self.fault_refusal: str | None = default.faults.refusal
        self.connection_string: str | None = None  # the default one, once the listeners are up
        self._named: dict[str, NamedNamespace] = {}
        self._deleted: list[Callable[[str], None]] = []
        self._ticking: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------------------ reading
    def __contains__(self, name: object) -> bool:
        return name in self._named

    def __len__(self) -> int:
        return len(self._named)

    def names(self) -> list[str]:
        return sorted(self._named)

    def get(self, name: str) -> NamedNamespace:
        """The created namespace ``name``; :class:`EntityNotFoundError` naming it and how to create it."""
        entry = self._named.get(name)
        if entry is None:
            raise EntityNotFoundError(unknown_text(name))
        return entry

    def resolve(self, name: str | None) -> tuple[Namespace, KeyRing]:
        """The namespace a key name's ``@name`` suffix selects (None: the default one) and the keys to verify with."""
        if name is None:
            return self.default, self.keys
        entry = self.get(name)
        return entry.namespace, entry.keys

    def connection_string_of(self, name: str) -> str | None:
        """The default connection string with ``@name`` appended to its key name (None before the listeners)."""
        if self.connection_string is None:
            return None
        return re.sub(r"(SharedAccessKeyName=[^;]*)", lambda m: f"{m.group(1)}@{name}", self.connection_string, count=1)

    def describe(self, entry: NamedNamespace) -> dict[str, Any]:
        return {
            "name": entry.name,
            "connection_string": self.connection_string_of(entry.name),
            "now_us": entry.clock.now_us(),
            "offset_us": entry.clock.offset_us,
            "entities": len(entry.namespace.entity_names()),
        }

    # ------------------------------------------------------------------------------ changing
    async def create(self, name: str) -> NamedNamespace:
        """A new, empty namespace ``name`` (in memory, with its own clock); refused when it exists or the cap is met."""
        check_namespace_name(name)
        if name in self._named:
            raise EntityAlreadyExistsError(
                f"the namespace {name!r} already exists; delete it first (DELETE /$namespaces/{name}) or use it"
            )
        if len(self._named) >= self.max_namespaces:
            raise QuotaExceededError(
                f"oncebus holds at most {self.max_namespaces} created namespaces at once ({MAX_NAMESPACES_ENV}); "
                "delete some (DELETE /$namespaces/<name>) before creating more"
            )
        clock = OffsetClock()
        namespace = await Namespace.open(MemoryStore(), clock, quotas=self.quotas)
        namespace.faults.refusal = self.fault_refusal
        keys = self.keys.for_namespace(name)
        keys.attach_entity_rules(namespace.authorization_rules)
        entry = NamedNamespace(name, namespace, clock, keys, clock.now_us())
        self._named[name] = entry
        if self._ticking is None or self._ticking.done():
            self._ticking = asyncio.get_running_loop().create_task(self._tick_all())
        return entry

    async def delete(self, name: str) -> None:
        """Remove the created namespace ``name`` with everything in it; connections bound to it are closed."""
        entry = self.get(name)
        del self._named[name]
        for hook in list(self._deleted):
            try:
                hook(name)
            except Exception:  # a front end's clean-up must not keep the namespace alive
                _LOG.exception("closing what was bound to namespace %r failed", name)
        with contextlib.suppress(OncebusError):
            await entry.namespace.close()

    def advance(self, name: str, us: int) -> int:
        """Move ``name``'s clock ``us`` microseconds forward and apply what falls due; its new time (µs)."""
        entry = self.get(name)
        entry.clock.advance(us)
        entry.namespace.tick()
        return entry.clock.now_us()

    def on_delete(self, hook: Callable[[str], None]) -> None:
        """Call ``hook(name)`` when a namespace is deleted (the AMQP server closes the connections bound to it)."""
        self._deleted.append(hook)

    async def close(self) -> None:
        if self._ticking is not None:
            self._ticking.cancel()
        for name in list(self._named):
            with contextlib.suppress(OncebusError):
                await self._named.pop(name).namespace.close()

    async def _tick_all(self, interval: float = 0.5) -> None:
        """The timers of every created namespace (locks, TTLs, schedules, dedup windows), one task for all."""
        while self._named:
            await asyncio.sleep(interval)
            for entry in list(self._named.values()):
                try:
                    entry.namespace.tick()
                except Exception as exc:
                    _LOG.error("the timer tick of namespace %r failed: %s", entry.name, exc)


def unknown_text(name: str) -> str:
    return (
        f"there is no namespace {name!r} on this broker: create it first with PUT /$namespaces/{name} (a Manage key "
        "of the default namespace) or oncebus.testing's create_namespace(); the key name's '@' suffix names it"
    )
