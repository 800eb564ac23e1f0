"""The oncebus pytest plugin (entry point ``pytest11``; active once oncebus is installed).

Fixtures:

- ``oncebus_server`` (session): one ``oncebus serve`` for the test session (with
  pytest-xdist, one per worker), an :class:`oncebus.testing.OncebusServer`.
- ``oncebus_namespace`` (function): the same server on a fresh namespace: every
  entity, message and dedup key of the previous test deleted and the test clock
  back to the real time, then the declared entities created. No new process.
- ``oncebus_isolated_namespace`` (function): a namespace of the test's own, created on the session's broker
  (:class:`oncebus.testing.IsolatedNamespace`: its ``connection_string``, entity helpers, ``advance()``), with the
  declared entities, deleted after the test. Tests running at once (threads, asyncio, other languages' suites
  driving the same broker) do not see each other's entities, messages, dedup keys or clock.
- ``oncebus_config`` (session): entities every fresh namespace starts with; ``None``
  unless the ``oncebus_config`` ini option names an emulator-format config.json.
  Override it in a conftest.py to return a config dict.

Marker: ``@pytest.mark.oncebus_entities(config=None, *, queues=None, topics=None)``
declares the entities a test's namespace starts with (on a test, class or module):
an emulator-format config (dict or path), and/or ``queues={"orders":
{"requires_duplicate_detection": True}}``, ``topics={"events": {"subscriptions":
["audit"]}}`` (names alone are fine: ``queues=["orders"]``).

Options: ``--oncebus-mode subprocess|thread`` (ini ``oncebus_mode``; default subprocess).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest

if TYPE_CHECKING:
    from oncebus.server.topology import Topology
    from oncebus.testing import IsolatedNamespace, OncebusServer

MARKER = "oncebus_entities"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("oncebus", "oncebus: a local Service Bus for the tests")
    group.addoption(
        "--oncebus-mode",
        choices=("subprocess", "thread"),
        default=None,
        help="run the oncebus_server broker in a subprocess (default) or in a thread of the test process",
    )
    parser.addini("oncebus_mode", "oncebus_server broker: subprocess (default) or thread", default="subprocess")
    parser.addini(
        "oncebus_config",
        "emulator-format config.json (relative to the ini file) with the entities of every oncebus_namespace",
        default="",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(config=None, *, queues=None, topics=None): entities the oncebus_namespace fixture creates "
        "(an emulator-format config dict or path; queues={name: properties}; topics={name: {..., "
        "'subscriptions': [names] or {name: properties}}})",
    )


@pytest.fixture(scope="session")
def oncebus_server(pytestconfig: pytest.Config) -> Iterator[OncebusServer]:
    """One oncebus broker for the session (per xdist worker), on a free port and a temporary data directory."""
    from oncebus.testing import MODES, Mode, serve

    mode = pytestconfig.getoption("oncebus_mode") or pytestconfig.getini("oncebus_mode") or "subprocess"
    if mode not in MODES:
        raise pytest.UsageError(f"oncebus_mode {mode!r} is not one of {', '.join(MODES)}")
    with serve(mode=cast(Mode, mode)) as server:
        yield server


@pytest.fixture(scope="session")
def oncebus_config(pytestconfig: pytest.Config) -> Any:
    """Entities every fresh namespace starts with: an emulator-format config (dict or path), or None."""
    value = str(pytestconfig.getini("oncebus_config") or "")
    if not value:
        return None
    base = pytestconfig.inipath.parent if pytestconfig.inipath is not None else pytestconfig.rootpath
    return base / Path(value)


@pytest.fixture
def oncebus_namespace(
    request: pytest.FixtureRequest, oncebus_server: OncebusServer, oncebus_config: Any
) -> OncebusServer:
    """The session's broker on a fresh namespace, with the entities ``oncebus_config`` and the
    ``oncebus_entities`` markers declare."""
    from oncebus.testing._entities import config_topology, merged

    topologies = [] if oncebus_config is None else [config_topology(oncebus_config)]
    # closest last, so a test's own marker overrides its class's and module's
    topologies += [_marker_topology(m) for m in reversed(list(request.node.iter_markers(MARKER)))]
    oncebus_server.reset()
    oncebus_server.create_topology(merged(*topologies))
    return oncebus_server


@pytest.fixture
def oncebus_isolated_namespace(
    request: pytest.FixtureRequest, oncebus_server: OncebusServer, oncebus_config: Any
) -> Iterator[IsolatedNamespace]:
    """A namespace of this test's own on the session's broker (no reset of anyone else's), with the entities
    ``oncebus_config`` and the ``oncebus_entities`` markers declare; deleted after the test."""
    from oncebus.testing._entities import config_topology, merged

    topologies = [] if oncebus_config is None else [config_topology(oncebus_config)]
    topologies += [_marker_topology(m) for m in reversed(list(request.node.iter_markers(MARKER)))]
    namespace = oncebus_server.create_namespace()
    try:
        namespace.create_topology(merged(*topologies))
        yield namespace
    finally:
        if oncebus_server.alive:
            namespace.delete()


def _marker_topology(marker: pytest.Mark) -> Topology:
    from oncebus.testing._entities import config_topology, declared_topology, merged

    def parse(config: Any = None, *, queues: Any = None, topics: Any = None) -> Topology:
        parts = [] if config is None else [config_topology(config)]
        return merged(*parts, declared_topology(queues, topics))

    try:
        return parse(*marker.args, **marker.kwargs)
    except TypeError as exc:
        raise pytest.UsageError(f"@pytest.mark.{MARKER}(config=None, *, queues=None, topics=None): {exc}") from exc
