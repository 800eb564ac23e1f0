"""Faults on cue: failures a test arms on a running broker (a lost acknowledgement, a busy server, a dropped
connection, a lost lock, a slow broker), so it can check what its own code does when they happen.

The book only decides *when* a fault fires; the front end that meets the operation applies it (the AMQP
adapter: ``oncebus.amqp.faults``). A fault is scoped to an entity (its subscriptions and dead-letter queues
included) or to every entity; it fires on the next ``count`` matching operations (after letting ``after`` of
them through), or on every one for ``duration`` seconds of the broker's clock; ``delay`` seconds after it
was armed at the earliest. Each firing is logged (logger
``oncebus.broker.faults``, WARNING) and counted (``/metrics``: ``oncebus_faults_fired``).

Kinds, and the operations they fire on:

==================== ============================== ===================================================
kind                 fires on                       what the client meets
==================== ============================== ===================================================
``lost-ack``         a send, once it is committed   the connection cut (``how="drop"``), closed with
                                                    ``amqp:connection:forced`` (``"close"``) or the link
                                                    detached with ``amqp:link:detach-forced``
                                                    (``"detach"``) before the acknowledgement goes out
``server-busy``      a send or a settlement         ``com.microsoft:server-busy`` (nothing done)
``drop-connection``  a send (before it is judged)   the connection cut: a send is not stored, a
                     or a delivery                  delivered message stays locked until its lock expires
``detach-link``      a send or a delivery           the link detached (``amqp:link:detach-forced``)
``lock-lost``        a message delivered (peek-lock) its lock lost at once: settling it fails with
                                                    ``com.microsoft:message-lock-lost``
``session-lock-lost`` a message delivered from a    the session's lock lost: settling fails with
                     session                        ``com.microsoft:session-lock-lost``
``slow-ack``         a send, once it is committed   its acknowledgement held back ``seconds``
``slow-delivery``    a message about to be          its delivery held back ``seconds``
                     delivered
==================== ============================== ===================================================

Arming is refused (:class:`FaultsDisabledError`) on a broker serving beyond loopback unless it was started with
``--allow-faults``: a fault is a denial of service on cue.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from oncebus.core.errors import InvalidArgumentError, UnauthorizedError

__all__ = ["FAULT_KINDS", "ArmedFault", "FaultBook", "FaultSpec", "FaultsDisabledError"]

_LOG = logging.getLogger(__name__)

FAULT_KINDS = (
    "lost-ack",
    "server-busy",
    "drop-connection",
    "detach-link",
    "lock-lost",
    "session-lock-lost",
    "slow-ack",
    "slow-delivery",
)
LOST_ACK_HOW = ("drop", "close", "detach")
MAX_COUNT = 1_000_000
MAX_SECONDS = 7 * 24 * 3600.0  # a duration, a delay: at most a week
MAX_ARMED = 1000
_FIELDS = ("kind", "entity", "count", "duration", "after", "delay", "seconds", "how")


class FaultsDisabledError(UnauthorizedError):
    """Arming faults is switched off on this broker (it serves beyond loopback without ``--allow-faults``): the key
    is fine, the broker forbids it (403)."""

    condition = "amqp:unauthorized-access"
    status = 403


def _number(data: Mapping[str, Any], name: str, *, integer: bool, low: float, high: float) -> Any:
    value = data.get(name)
    if value is None:
        return None
    number_ok = (
        isinstance(value, int | float) and not isinstance(value, bool) and (isinstance(value, int) or not integer)
    )
    if not number_ok or not math.isfinite(value) or not low <= value <= high:
        what = "a whole number" if integer else "a number of seconds"
        raise InvalidArgumentError(f"fault {name} must be {what} from {low:g} to {high:g}, not {value!r}")
    return int(value) if integer else float(value)


@dataclass(frozen=True)
class FaultSpec:
    """What to arm. ``count`` (default 1) and ``duration`` exclude each other; ``after``: matching operations let
    through first; ``delay``: seconds before the fault is live (a timed one runs from then); ``seconds`` is how
    long the ``slow-*`` kinds hold each one back (required there, refused elsewhere); ``how`` is for
    ``lost-ack`` only."""

    kind: str
    entity: str | None = None
    count: int | None = None
    duration: float | None = None
    after: int = 0
    delay: float = 0.0
    seconds: float | None = None
    how: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FaultSpec:
        """A spec from JSON (the control socket, ``POST /$faults``); a bad one is an error naming what is wrong."""
        if not isinstance(data, Mapping):
            raise InvalidArgumentError(f"a fault is a JSON object with {', '.join(_FIELDS)}, not {data!r}")
        unknown = sorted(str(k) for k in data if k not in _FIELDS)
        if unknown:
            raise InvalidArgumentError(f"unknown fault field(s) {', '.join(unknown)}; known: {', '.join(_FIELDS)}")
        kind = data.get("kind")
        if kind not in FAULT_KINDS:
            raise InvalidArgumentError(f"unknown fault kind {kind!r}; use one of {', '.join(FAULT_KINDS)}")
        entity = data.get("entity")
        if entity is not None and (not isinstance(entity, str) or not entity.strip("/")):
            raise InvalidArgumentError(f"fault entity must be an entity name (or absent for all), not {entity!r}")
        count = _number(data, "count", integer=True, low=1, high=MAX_COUNT)
        duration = _number(data, "duration", integer=False, low=0.001, high=MAX_SECONDS)
        if count is not None and duration is not None:
            raise InvalidArgumentError("a fault is counted (count) or timed (duration), not both")
        after = _number(data, "after", integer=True, low=0, high=MAX_COUNT) or 0
        delay = _number(data, "delay", integer=False, low=0, high=MAX_SECONDS) or 0.0
        seconds = _number(data, "seconds", integer=False, low=0, high=MAX_SECONDS)
        if kind.startswith("slow-") and seconds is None:
            raise InvalidArgumentError(f"fault {kind} needs seconds: how long to hold back each one")
        if not kind.startswith("slow-") and seconds is not None:
            raise InvalidArgumentError(f"seconds is the delay of slow-ack and slow-delivery, not of {kind}")
        how = data.get("how")
        if how is not None and (kind != "lost-ack" or how not in LOST_ACK_HOW):
            raise InvalidArgumentError(
                f"how is for lost-ack only, one of {', '.join(LOST_ACK_HOW)} (not {how!r} for {kind})"
            )
        return cls(
            kind=kind,
            entity=None if entity is None else entity.strip("/"),
            count=count,
            duration=duration,
            after=after,
            delay=delay,
            seconds=seconds,
            how=how if how is not None else ("drop" if kind == "lost-ack" else None),
        )


@dataclass
class ArmedFault:
    """A fault in the book: ``remaining`` firings left (None: timed, until ``expires_at_us``)."""

    fault_id: str
    spec: FaultSpec
    armed_at_us: int
    live_from_us: int
    remaining: int | None
    expires_at_us: int | None
    to_skip: int
    fired: int = 0

    def covers(self, path: str) -> bool:
        entity = self.spec.entity
        if entity is None:
            return True
        path, entity = path.lower(), entity.lower()
        return path == entity or path.startswith(entity + "/")

    def to_dict(self) -> dict[str, Any]:
        spec = self.spec
        return {
            "id": self.fault_id,
            "kind": spec.kind,
            "entity": spec.entity,
            "count": spec.count,
            "duration": spec.duration,
            "after": spec.after,
            "delay": spec.delay,
            "seconds": spec.seconds,
            "how": spec.how,
            "remaining": self.remaining,
            "expires_at_us": self.expires_at_us,
            "fired": self.fired,
        }


class FaultBook:
    """The faults armed on one namespace, consulted by the front ends on each operation (O(1) when none)."""

    def __init__(self, now_us: Callable[[], int]) -> None:
        self._now_us = now_us
        self._armed: dict[str, ArmedFault] = {}
        self._ids = itertools.count(1)
        self.refusal: str | None = None  # why arming is refused on this broker (None: allowed)
        self.fired: Counter[tuple[str, str]] = Counter()  # (kind, path) -> firings, for /metrics

    @property
    def armed(self) -> bool:
        """True when any fault is armed (the front ends' fast path: nothing else is looked at otherwise)."""
        return bool(self._armed)

    def arm(self, spec: FaultSpec | Mapping[str, Any]) -> ArmedFault:
        if self.refusal is not None:
            raise FaultsDisabledError(self.refusal)
        if not isinstance(spec, FaultSpec):
            spec = FaultSpec.from_dict(spec)
        self._expire()
        if len(self._armed) >= MAX_ARMED:
            raise InvalidArgumentError(f"at most {MAX_ARMED} faults can be armed at once; clear some")
        now = self._now_us()
        live = now + round(spec.delay * 1e6)
        fault = ArmedFault(
            fault_id=f"f{next(self._ids)}",
            spec=spec,
            armed_at_us=now,
            live_from_us=live,
            remaining=None if spec.duration is not None else (spec.count or 1),
            expires_at_us=None if spec.duration is None else live + round(spec.duration * 1e6),
            to_skip=spec.after,
        )
        self._armed[fault.fault_id] = fault
        _LOG.info(
            "fault %s armed: %s on %s",
            fault.fault_id,
            spec.kind,
            spec.entity or "every entity",
            extra={"fault": fault.fault_id, "kind": spec.kind, "entity": spec.entity},
        )
        return fault

    def list(self) -> list[ArmedFault]:
        self._expire()
        return list(self._armed.values())

    def clear(self, fault_id: str | None = None) -> int:
        """Disarm one fault (by id) or all of them; how many were disarmed. An unknown id is an error."""
        if fault_id is None:
            count = len(self._armed)
            self._armed.clear()
            return count
        if self._armed.pop(fault_id, None) is None:
            known = ", ".join(self._armed) or "none"
            raise InvalidArgumentError(f"no fault {fault_id!r} is armed (armed: {known})")
        return 1

    def _expire(self) -> None:
        now = self._now_us()
        for fault_id, fault in list(self._armed.items()):
            if fault.expires_at_us is not None and fault.expires_at_us <= now:
                del self._armed[fault_id]

    def fire(self, kind: str, path: str) -> ArmedFault | None:
        """The fault of ``kind`` that fires on this operation on ``path``, if one does (it is counted and logged)."""
        if not self._armed:
            return None
        now = self._now_us()
        for fault_id, fault in list(self._armed.items()):
            if fault.spec.kind != kind or not fault.covers(path):
                continue
            if fault.expires_at_us is not None and fault.expires_at_us <= now:
                del self._armed[fault_id]
                continue
            if now < fault.live_from_us:
                continue
            if fault.to_skip > 0:
                fault.to_skip -= 1
                continue
            fault.fired += 1
            if fault.remaining is not None:
                fault.remaining -= 1
                if fault.remaining <= 0:
                    del self._armed[fault_id]
            self.fired[(kind, path.lower())] += 1
            _LOG.warning(
                "fault %s (%s) fired on %s",
                fault_id,
                kind,
                path,
                extra={"fault": fault_id, "kind": kind, "entity": path},
            )
            return fault
        return None
