"""The namespace implements the three ports the front ends are typed by, signature for signature."""

from __future__ import annotations

import inspect

import pytest

from oncebus.broker import Administration, Messaging, Namespace, Observation


def _members(port: type) -> dict[str, object]:
    return {name: value for name, value in vars(port).items() if not name.startswith("_")}


@pytest.mark.parametrize("port", [Messaging, Administration, Observation])
def test_namespace_has_every_member_of_the_port_with_the_same_signature(port: type) -> None:
    members = _members(port)
    assert members, port
    for name, declared in members.items():
        real = getattr(Namespace, name)
        assert inspect.iscoroutinefunction(real) == inspect.iscoroutinefunction(declared), name
        want = inspect.signature(declared)
        got = inspect.signature(real)
        assert [(p.name, p.kind, p.default) for p in got.parameters.values()] == [
            (p.name, p.kind, p.default) for p in want.parameters.values()
        ], name
        assert got.return_annotation == want.return_annotation, name
    for name in port.__annotations__:  # attributes (the observer, the clock)
        assert name in Namespace.__init__.__code__.co_names or hasattr(Namespace, name), name


def test_the_ports_do_not_overlap() -> None:
    seen: dict[str, str] = {}
    for port in (Messaging, Administration, Observation):
        for name in _members(port):
            assert name not in seen, f"{name} is in {seen[name]} and {port.__name__}"
            seen[name] = port.__name__
