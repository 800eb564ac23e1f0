"""One settings object: every ``ONCEBUS_*`` variable read in ``oncebus.server.settings``, typed, checked with an
error naming it and what it allows, and listed once in ``docs/configuration.md`` (made from the same list)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
from pathlib import Path

import pytest

import oncebus
from oncebus.amqp.limits import AmqpLimits
from oncebus.broker import recovery
from oncebus.core.errors import InvalidArgumentError
from oncebus.core.tiers import STANDARD, Tier
from oncebus.http.server import HttpLimits
from oncebus.server.settings import VARIABLES, Settings, SettingsError, markdown_table
from tests.cli_support import ONCEBUS, assert_one_line_error

PACKAGE = Path(oncebus.__file__).parent
DOCS = Path(__file__).parent.parent / "docs"
KNOWN = {v.name for v in VARIABLES}
FAMILIES = ("ONCEBUS_AMQP_", "ONCEBUS_HTTP_", "ONCEBUS_LISTEN_", "ONCEBUS_QUOTA_")
# Not settings: the pytest plugin's channel to the server process it starts (never set by a user).
INTERNAL = {"ONCEBUS_TESTING_WORK_DIR"}
# Not settings of the server: the build's switches (compiled or pure Python), read by oncebus._compiled alone, at
# install (setup.py loads that module by path) and at ``import oncebus``, before any settings can be read;
# CONTRIBUTING.md documents them.
BUILD = {"_compiled.py": {"ONCEBUS_NO_COMPILE", "ONCEBUS_PURE_PYTHON"}}
# Still read where they are used, waiting for the change that removes them (the checks below want each to still be
# read, so the list only shrinks): none left (the checkpoint bounds go through Namespace.open; the AMQP engine
# choice, ONCEBUS_AMQP_ENGINE, went with proton's engine: issue 34 item 1).
NOT_YET: dict[str, set[str]] = {}


def test_unset_means_the_defaults() -> None:
    settings = Settings.from_environ({"PATH": "/bin", "ONCEBUS_CONNECTION_STRING": "not a setting"})
    assert settings == Settings()
    assert settings.amqp == AmqpLimits() and settings.http == HttpLimits() and settings.quotas() == STANDARD


def test_values_are_read_typed() -> None:
    settings = Settings.from_environ(
        {
            "ONCEBUS_DATA_DIR": "/srv/bus",
            "ONCEBUS_STORE": "postgresql://h/db",
            "ONCEBUS_SAS_KEYS": "app:Send=k1;ops=k2",
            "ONCEBUS_MAX_NAMESPACES": "7",
            "ONCEBUS_CHECKPOINT_KEYS": "200",
            "ONCEBUS_CHECKPOINT_SECONDS": "0",
            "ONCEBUS_HTTP_ALLOWED_HOSTS": "Bus.example, .svc.example,",
            "ONCEBUS_DEBUG": "1",
            "ONCEBUS_AMQP_HANDSHAKE_TIMEOUT": "0.5",
            "ONCEBUS_AMQP_MAX_CONNECTIONS": "3",
            "ONCEBUS_HTTP_MAX_CONNECTIONS": "64",
            "ONCEBUS_LISTEN_MAX_PENDING": "512",
            "ONCEBUS_LISTEN_SNIFF_TIMEOUT": "2.5",
            "ONCEBUS_EVENT_LOOP": "AsyncIO",
        }
    )
    assert settings.event_loop == "asyncio"
    assert settings.data_dir == Path("/srv/bus") and settings.store == "postgresql://h/db"
    assert settings.keys is not None and [k.name for k in settings.keys.entries()] == ["app", "ops"]
    assert (settings.max_namespaces, settings.checkpoint_keys, settings.checkpoint_seconds) == (7, 200, 0.0)
    assert settings.allowed_hosts == ("bus.example", ".svc.example") and settings.debug
    assert (settings.amqp.handshake_timeout, settings.amqp.max_connections) == (0.5, 3)
    assert settings.http.max_connections == 64
    assert settings.listen == {"max_pending": 512, "sniff_timeout": 2.5}
    assert isinstance(settings.listen["max_pending"], int) and isinstance(settings.amqp.handshake_timeout, float)


def test_the_tier_comes_from_the_option_then_the_environment_then_the_data_directory() -> None:
    assert Settings.from_environ({}).quotas(stored="premium").tier is Tier.PREMIUM
    assert Settings.from_environ({"ONCEBUS_TIER": "Premium"}).quotas(stored="standard").tier is Tier.PREMIUM
    assert Settings.from_environ({"ONCEBUS_TIER": "premium"}).quotas(tier="standard").tier is Tier.STANDARD
    premium = Settings.from_environ({"ONCEBUS_TIER": "premium", "ONCEBUS_MESSAGING_UNITS": "8"}).quotas()
    assert premium.max_entities == 8_000
    changed = Settings.from_environ(
        {"ONCEBUS_QUOTA_MAX_ENTITIES": "3", "ONCEBUS_QUOTA_MAX_CONCURRENT_RECEIVES": "0"}
    ).quotas()
    assert (changed.max_entities, changed.max_concurrent_receives, changed.tier) == (3, 0, Tier.STANDARD)


BAD = {  # one value each variable does not allow (the families: every member is checked below)
    "ONCEBUS_SAS_KEYS": "app:Sned=k",
    "ONCEBUS_TIER": "basic",
    "ONCEBUS_MESSAGING_UNITS": "3",
    "ONCEBUS_MAX_NAMESPACES": "0",
    "ONCEBUS_CHECKPOINT_KEYS": "many",
    "ONCEBUS_CHECKPOINT_SECONDS": "-1",
    "ONCEBUS_EVENT_LOOP": "tokio",
}
UNCHECKED = {"ONCEBUS_DATA_DIR", "ONCEBUS_STORE", "ONCEBUS_HTTP_ALLOWED_HOSTS", "ONCEBUS_DEBUG", "ONCEBUS_CLOCK_FILE"}


def _bad_values(name: str) -> list[str]:
    if name in BAD:
        return [BAD[name]]
    floor = "0 or more" if name.startswith("ONCEBUS_QUOTA_") else "above 0"
    return ["x", "-1", "nan", "1e400"] + (["0"] if floor == "above 0" else []) + ["1.5"] * ("whole" in _allowed(name))


def _allowed(name: str) -> str:
    return next(v.allowed for v in VARIABLES if v.name == name)


@pytest.mark.parametrize("name", sorted(KNOWN - UNCHECKED))
def test_a_value_not_allowed_is_an_error_naming_the_variable_and_what_it_allows(name: str) -> None:
    for value in _bad_values(name):
        with pytest.raises(SettingsError) as caught:
            Settings.from_environ({name: value})
        message = str(caught.value)
        assert name in message and "\n" not in message, message
        if name != "ONCEBUS_SAS_KEYS":  # names the wrong right instead of echoing the key
            assert f"{name}={value!r} is not allowed: give {_allowed(name)}" in message, message


def test_bounds_that_depend_on_each_other_are_named() -> None:
    with pytest.raises(SettingsError, match="ONCEBUS_AMQP_HANDSHAKE_FRAME_SIZE: handshake_frame_size must be at least"):
        Settings.from_environ({"ONCEBUS_AMQP_HANDSHAKE_FRAME_SIZE": "100"})
    assert issubclass(SettingsError, InvalidArgumentError)


def test_the_checkpoint_defaults_are_the_brokers() -> None:
    defaults = {v.name: v.default for v in VARIABLES}
    assert int(defaults["ONCEBUS_CHECKPOINT_KEYS"]) == recovery.CHECKPOINT_KEYS
    assert float(defaults["ONCEBUS_CHECKPOINT_SECONDS"]) == recovery.CHECKPOINT_MIN_SECONDS


def test_the_docs_list_every_variable_once_as_the_settings_say() -> None:
    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    generated = re.search(r"<!-- generated by [^\n]*-->\n(.*?)<!-- end of generated table -->", text, re.S)
    assert generated is not None
    assert generated.group(1) == markdown_table(), "run: python -m oncebus.server.settings, paste into the doc"
    for name in KNOWN:
        assert len(re.findall(rf"`{name}`", text)) == 1, name


def _environ_reads(path: Path) -> set[str]:
    """The ``ONCEBUS_*`` names (or prefixes) a module names in a string, if it reads a variable from the environment
    (``os.environ.get``, ``os.getenv``, ``os.environ[...]``, ``... in os.environ``; copying it for a child is not
    reading it)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))

    def environ(node: ast.AST) -> bool:
        return ast.unparse(node) in ("os.environ", "environ")

    reads = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("os.environ.get", "os.getenv", "getenv"):
            reads = True
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and environ(node.value):
            reads = True
        elif isinstance(node, ast.Compare) and any(environ(c) for c in node.comparators):
            reads = True
    if not reads:
        return set()
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    return {m for s in strings for m in re.findall(r"ONCEBUS_[A-Z_]+", s)}


def test_the_reads_check_sees_a_read(tmp_path: Path) -> None:
    for text in (
        'import os\nx = os.environ.get("ONCEBUS_X")\n',
        'import os\nx = os.getenv("ONCEBUS_X")\n',
        'import os\nNAME = "ONCEBUS_X"\nx = os.environ[NAME]\n',
        'import os\nx = "ONCEBUS_X" in os.environ\n',
    ):
        (tmp_path / "m.py").write_text(text)
        assert _environ_reads(tmp_path / "m.py") == {"ONCEBUS_X"}, text
    (tmp_path / "m.py").write_text('import os\nenv = dict(os.environ, ONCEBUS_X="1")\n')
    assert _environ_reads(tmp_path / "m.py") == set()


def test_only_the_settings_module_reads_oncebus_variables_from_the_environment() -> None:
    readers = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(PACKAGE))
        names = _environ_reads(path) - INTERNAL - BUILD.get(where, set())
        if names and where != "server/settings.py":
            readers[where] = names
    waiting = {where: names for where, names in readers.items() if where in NOT_YET}
    assert {k: v for k, v in readers.items() if k not in NOT_YET} == {}, "read these through Settings"
    for where, names in NOT_YET.items():  # still there (else take it off the list)
        assert any(n.startswith(tuple(names)) for n in waiting.get(where, ())), where


def _build_switch(name: str, where: set[str]) -> bool:
    """A build switch, named only where the build reads it (and in the comment where ``import oncebus`` calls it)."""
    return name in BUILD["_compiled.py"] and where <= {"_compiled.py", "__init__.py"}


def test_every_oncebus_variable_named_in_the_code_is_a_setting() -> None:
    named: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for name in re.findall(r"ONCEBUS_[A-Z_]*[A-Z]", path.read_text(encoding="utf-8")):
            named.setdefault(name, set()).add(str(path.relative_to(PACKAGE)))
    unknown = {
        name: sorted(where)
        for name, where in named.items()
        if name not in KNOWN | INTERNAL and name + "_" not in FAMILIES and not _build_switch(name, where)
    }
    assert unknown == {}, "add them to oncebus.server.settings.VARIABLES (and docs/configuration.md)"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("ONCEBUS_HTTP_MAX_CONNECTIONS", "x"),
        ("ONCEBUS_LISTEN_MAX_PENDING", "-5"),
        ("ONCEBUS_AMQP_MAX_CONNECTIONS", "lots"),
        ("ONCEBUS_MAX_NAMESPACES", "0"),
        ("ONCEBUS_CHECKPOINT_SECONDS", "soon"),
        ("ONCEBUS_MESSAGING_UNITS", "3"),
        ("ONCEBUS_EVENT_LOOP", "trio"),
    ],
)
def test_serve_stops_with_one_line_naming_a_bad_variable(tmp_path: Path, name: str, value: str) -> None:
    """Before anything starts (no data directory made), exit 2 as for a bad option, no traceback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEBUS_")}
    env[name] = value
    done = subprocess.run(
        [*ONCEBUS, "--data-dir", str(tmp_path / "data"), "serve", "--port", "0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    line = assert_one_line_error(done, codes=(2,))
    assert f"{name}={value!r} is not allowed: give " in line, line
    assert not (tmp_path / "data").exists()
