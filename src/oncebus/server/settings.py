"""Every ``ONCEBUS_*`` environment variable oncebus reads, read in one place: :class:`Settings`.

``Settings.from_environ()`` reads the environment once, when ``oncebus`` starts (or ``run()`` when a program
serves in a thread without giving settings), checks every value and keeps it typed; the process then passes
the object down (the listeners' bounds, the tier's quotas, the data directory, ...), and no other module reads
the environment. A value that is not allowed stops the start with one line naming the variable, the value and
what is allowed (:class:`SettingsError`).

:data:`VARIABLES` lists every variable with what it allows and its default; ``docs/configuration.md`` is made
from it (``python -m oncebus.server.settings``) and checked against it by ``tests/test_settings.py``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oncebus.amqp.limits import AmqpLimits
from oncebus.auth import KEYS_ENV, KeyRing, parse_keys
from oncebus.core.errors import InvalidArgumentError
from oncebus.core.tiers import MESSAGING_UNITS, Tier, TierQuotas
from oncebus.http.server import HttpLimits
from oncebus.server.listener import Doors
from oncebus.server.loop import EVENT_LOOPS, EventLoop, available

__all__ = ["VARIABLES", "Settings", "SettingsError", "Variable", "markdown_table"]


class SettingsError(InvalidArgumentError):
    """An ``ONCEBUS_*`` variable holds a value that is not allowed; the message names it and what is allowed.

    Raised before anything is served (the CLI exits 2); declared like the bad input it is should a door meet it."""

    condition = "com.microsoft:argument-error"
    status = 400


@dataclass(frozen=True)
class Variable:
    name: str
    allowed: str  # what a value may be, in words
    default: str  # what unset means
    purpose: str


def _number_fields(cls: type[Any], skip: tuple[str, ...] = ()) -> list[tuple[str, int | float]]:
    """The number fields of a dataclass with a default, and the default (``Doors``'s protocols left out)."""
    out = []
    for f in dataclasses.fields(cls):
        default = f.default
        if f.name in skip or isinstance(default, bool) or not isinstance(default, int | float):
            continue
        out.append((f.name, default))
    return out


AMQP_PREFIX, HTTP_PREFIX = "ONCEBUS_AMQP_", "ONCEBUS_HTTP_"
LISTEN_PREFIX, QUOTA_PREFIX = "ONCEBUS_LISTEN_", "ONCEBUS_QUOTA_"
_QUOTA_SKIP = ("tier", "messaging_units")


def _family(
    prefix: str, cls: type[Any], purpose: str, skip: tuple[str, ...] = (), floor: str = "above 0"
) -> list[Variable]:
    rows = []
    for name, default in _number_fields(cls, skip):
        kind = "a whole number" if isinstance(default, int) else "a number of seconds"
        rows.append(Variable(prefix + name.upper(), f"{kind}, {floor}", str(default), purpose))
    return rows


VARIABLES: list[Variable] = [
    Variable("ONCEBUS_DATA_DIR", "a directory path", ".oncebus", "the data directory when --data-dir is not given"),
    Variable(
        "ONCEBUS_STORE",
        "a postgresql:// URL, or sqlite",
        "sqlite (oncebus.db in the data directory)",
        "the store when --store is not given",
    ),
    Variable(
        KEYS_ENV,
        "name=key or name:Rights=key, separated by ; or newlines",
        "the emulator's default key",
        "SAS keys, added to --key and --keys-file",
    ),
    Variable("ONCEBUS_TIER", "standard or premium", "the data directory's, else standard", "the namespace's tier"),
    Variable("ONCEBUS_MESSAGING_UNITS", "1, 2, 4, 8 or 16", "1", "a Premium namespace's messaging units"),
    Variable("ONCEBUS_MAX_NAMESPACES", "a whole number, 1 or more", "1000", "namespaces created at run time at once"),
    Variable(
        "ONCEBUS_CHECKPOINT_KEYS",
        "a whole number, 1 or more",
        "100000",
        "dedup keys accepted between two dedup checkpoints",
    ),
    Variable(
        "ONCEBUS_CHECKPOINT_SECONDS", "a number of seconds, 0 or more", "10", "the least time between two checkpoints"
    ),
    Variable(
        "ONCEBUS_HTTP_ALLOWED_HOSTS",
        "host names separated by commas (.example.org: a domain; *: any)",
        "loopback, --host and this machine's name",
        "the names the HTTP doors answer to",
    ),
    Variable(
        "ONCEBUS_EVENT_LOOP",
        "uvloop or asyncio",
        "uvloop where installed (Linux, macOS), else asyncio",
        "the event loop serve runs on",
    ),
    Variable("ONCEBUS_DEBUG", "1 (any non-empty value)", "unset", "the CLI prints the traceback of an internal error"),
    Variable("ONCEBUS_CLOCK_FILE", "a file path", "unset (the system clock)", "tests only: time read from a file"),
    *_family(AMQP_PREFIX, AmqpLimits, "an AMQP bound (docs/limits.md)"),
    *_family(HTTP_PREFIX, HttpLimits, "an HTTP bound (docs/limits.md)"),
    *_family(LISTEN_PREFIX, Doors, "a bound on connections not yet AMQP or HTTP (docs/limits.md)"),
    *_family(QUOTA_PREFIX, TierQuotas, "a tier quota, for tests (docs/limits.md)", _QUOTA_SKIP, floor="0 or more"),
]
KNOWN = {v.name: v for v in VARIABLES}


def _error(name: str, text: str) -> SettingsError:
    return SettingsError(f"{name}={text!r} is not allowed: give {KNOWN[name].allowed}, or unset it")


def _whole(environ: Mapping[str, str], name: str, default: int, least: int = 1) -> int:
    text = environ.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise _error(name, text) from None
    if value < least:
        raise _error(name, text)
    return value


def _seconds(environ: Mapping[str, str], name: str, default: float, *, zero: bool) -> float:
    text = environ.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise _error(name, text) from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise _error(name, text)
    return value


def _event_loop(environ: Mapping[str, str]) -> EventLoop | None:
    text = environ.get("ONCEBUS_EVENT_LOOP", "").strip()
    if not text:
        return None
    name = next((loop for loop in EVENT_LOOPS if loop == text.lower()), None)
    if name is None:
        raise _error("ONCEBUS_EVENT_LOOP", text)
    if not available(name):
        raise SettingsError(
            f"ONCEBUS_EVENT_LOOP={text!r}: {name} is not installed here (it is not built for this platform); "
            "give asyncio, or unset it"
        )
    return name


def _overrides(
    environ: Mapping[str, str], prefix: str, cls: type[Any], skip: tuple[str, ...] = (), least: int = 1
) -> dict[str, int | float]:
    changes: dict[str, int | float] = {}
    for name, default in _number_fields(cls, skip):
        variable = prefix + name.upper()
        if variable not in environ:
            continue
        if isinstance(default, int):
            changes[name] = _whole(environ, variable, default, least)
        else:
            changes[name] = _seconds(environ, variable, float(default), zero=False)
    return changes


@dataclass(frozen=True)
class Settings:
    """What the environment says, typed and checked (see :data:`VARIABLES`); every field has the default an
    unset variable means, so ``Settings()`` is a process with no ``ONCEBUS_*`` variable set."""

    data_dir: Path | None = None
    store: str | None = None  # as given (store_spec checks it, with --store)
    keys: KeyRing | None = None
    tier: Tier | None = None
    messaging_units: int = 1
    quota_changes: Mapping[str, int] = field(default_factory=dict)
    max_namespaces: int = 1000
    checkpoint_keys: int | None = None  # None: the broker's default
    checkpoint_seconds: float | None = None
    allowed_hosts: tuple[str, ...] = ()
    debug: bool = False
    clock_file: str | None = None
    amqp: AmqpLimits = field(default_factory=AmqpLimits)
    http: HttpLimits = field(default_factory=HttpLimits)
    listen: Mapping[str, int | float] = field(default_factory=dict)  # changes to Doors' bounds
    event_loop: EventLoop | None = None  # None: uvloop where installed (server/loop.py)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read and check every ``ONCEBUS_*`` variable (``environ``: ``os.environ``)."""
        env = dict(os.environ if environ is None else environ)
        env = {name: value for name, value in env.items() if name.startswith("ONCEBUS_")}
        keys = None
        if (text := env.get(KEYS_ENV, "")).strip():
            try:
                keys = parse_keys(text)
            except ValueError as exc:
                raise SettingsError(f"{KEYS_ENV}: {exc}") from None
        tier = None
        if (text := env.get("ONCEBUS_TIER", "")).strip():
            try:
                tier = Tier.parse(text)
            except InvalidArgumentError:
                raise _error("ONCEBUS_TIER", text) from None
        units = _whole(env, "ONCEBUS_MESSAGING_UNITS", 1)
        if units not in MESSAGING_UNITS:
            raise _error("ONCEBUS_MESSAGING_UNITS", env["ONCEBUS_MESSAGING_UNITS"])
        quota_changes = {
            name: int(value) for name, value in _overrides(env, QUOTA_PREFIX, TierQuotas, _QUOTA_SKIP, 0).items()
        }
        amqp_changes = _overrides(env, AMQP_PREFIX, AmqpLimits)
        try:
            amqp = AmqpLimits(**amqp_changes)  # type: ignore[arg-type]
        except ValueError as exc:  # the bounds that depend on each other (frame sizes)
            names = ", ".join(f"{AMQP_PREFIX}{name.upper()}" for name in amqp_changes)
            raise SettingsError(f"{names}: {exc}") from None
        checkpoint_keys = _whole(env, "ONCEBUS_CHECKPOINT_KEYS", 0) if "ONCEBUS_CHECKPOINT_KEYS" in env else None
        checkpoint_seconds = None
        if "ONCEBUS_CHECKPOINT_SECONDS" in env:
            checkpoint_seconds = _seconds(env, "ONCEBUS_CHECKPOINT_SECONDS", 0.0, zero=True)
        data_dir = env.get("ONCEBUS_DATA_DIR") or None
        return cls(
            event_loop=_event_loop(env),
            data_dir=None if data_dir is None else Path(data_dir),
            store=env.get("ONCEBUS_STORE"),
            keys=keys,
            tier=tier,
            messaging_units=units,
            quota_changes=quota_changes,
            max_namespaces=_whole(env, "ONCEBUS_MAX_NAMESPACES", 1000),
            checkpoint_keys=checkpoint_keys,
            checkpoint_seconds=checkpoint_seconds,
            allowed_hosts=tuple(
                n.strip().lower() for n in env.get("ONCEBUS_HTTP_ALLOWED_HOSTS", "").split(",") if n.strip()
            ),
            debug=bool(env.get("ONCEBUS_DEBUG")),
            clock_file=env.get("ONCEBUS_CLOCK_FILE") or None,
            amqp=amqp,
            http=HttpLimits(**_overrides(env, HTTP_PREFIX, HttpLimits)),  # type: ignore[arg-type]
            listen=_overrides(env, LISTEN_PREFIX, Doors),
        )

    def quotas(self, tier: str | None = None, stored: str | None = None) -> TierQuotas:
        """The tier's quotas: ``tier`` (``--tier``), else ``ONCEBUS_TIER``, else ``stored`` (the data directory's),
        else Standard; with the messaging units and the ``ONCEBUS_QUOTA_*`` changes."""
        chosen = Tier.parse(tier) if tier is not None else self.tier or Tier.parse(stored or Tier.STANDARD.value)
        return TierQuotas.of(chosen, self.messaging_units, **self.quota_changes)


def markdown_table() -> str:
    """The table ``docs/configuration.md`` holds (between its generated markers)."""
    lines = ["| Variable | Allowed | Unset | What it sets |", "|---|---|---|---|"]
    for v in VARIABLES:
        lines.append(f"| `{v.name}` | {v.allowed} | {v.default} | {v.purpose} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover - prints the table for docs/configuration.md
    sys.stdout.write(markdown_table())
