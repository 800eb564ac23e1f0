"""A namespace of its own on a shared broker: :meth:`OncebusServer.create_namespace` and the plugin's
``oncebus_isolated_namespace`` fixture (``oncebus.server.namespaces`` serves them)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Protocol

from oncebus.core.timeutil import us_to_datetime
from oncebus.testing._calls import ControlCalls


class Broker(Protocol):
    """What a namespace needs of the broker it lives on (``OncebusServer`` is one)."""

    host: str
    port: int

    def control(self, op: str, **args: Any) -> Any: ...


class IsolatedNamespace(ControlCalls):
    """A namespace created on a running broker: its own entities, messages, dedup history, faults and clock.

    ``connection_string`` is the broker's with ``@<name>`` appended to the key name: give it to any SDK.
    It lives in the broker's memory until :meth:`delete` (or the broker stops)."""

    def __init__(self, server: Broker, info: dict[str, Any]) -> None:
        self.server = server
        self.name: str = info["name"]
        self.connection_string: str = info["connection_string"]

    def __repr__(self) -> str:
        return f"<IsolatedNamespace {self.name!r} on {self.server.host}:{self.server.port}>"

    def control(self, op: str, **args: Any) -> Any:
        """One control operation run on this namespace (``oncebus.server.control``)."""
        return self.server.control(op, namespace=self.name, **args)

    # ------------------------------------------------------------------------------ faults, its own clock
    def arm_fault(self, kind: str, entity: str | None = None, **spec: Any) -> str:
        """As :meth:`OncebusServer.arm_fault`, on this namespace only."""
        fault: dict[str, Any] = {"kind": kind, "entity": entity}
        for key, value in spec.items():
            fault[key] = value.total_seconds() if isinstance(value, timedelta) else value
        return str(self.control("fault.arm", fault={k: v for k, v in fault.items() if v is not None})["id"])

    def advance(self, delta: timedelta | float) -> datetime:
        """Move this namespace's time forward (no other namespace's) and apply what falls due, without sleeping."""
        step = delta if isinstance(delta, timedelta) else timedelta(seconds=delta)
        if step < timedelta(0):
            raise ValueError(f"advance({delta!r}): a namespace's time only moves forward")
        us = step // timedelta(microseconds=1)
        return us_to_datetime(self.server.control("namespaces.advance", name=self.name, us=us)["now_us"])

    def delete(self) -> None:
        """Remove the namespace with everything in it (connections bound to it are closed)."""
        self.server.control("namespaces.delete", name=self.name)
