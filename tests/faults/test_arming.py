"""Arming faults: from Python (``oncebus.testing``), the command line and ``/$faults`` over HTTP with a Manage
key; refused without one, and on a broker serving beyond loopback unless it was started with --allow-faults."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oncebus.auth import make_token
from oncebus.broker import FaultsDisabledError
from oncebus.cli import main as cli_main
from oncebus.core.errors import InvalidArgumentError
from oncebus.server import ServeOptions, run
from oncebus.testing import OncebusServer, serve

KEYS = {"root": "root-secret", "sender:Send": "send-secret"}


@pytest.fixture(scope="module")
def broker() -> Iterator[OncebusServer]:
    with serve(keys=KEYS) as server:
        yield server


@pytest.fixture
def server(broker: OncebusServer) -> OncebusServer:
    broker.reset()
    return broker


def _sas(port: int, name: str, key: str) -> str:
    return make_token(f"sb://127.0.0.1:{port}/", name, key, int(time.time()) + 600)


def http(port: int, method: str, path: str, body: Any = None, authorization: str | None = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    if authorization is not None:
        request.add_header("Authorization", authorization)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_http_arms_lists_and_clears_faults_with_a_manage_key(server: OncebusServer) -> None:
    port = server.http_port
    assert port is not None
    token = _sas(port, "root", "root-secret")
    status, fault = http(port, "POST", "/$faults", {"kind": "lost-ack", "entity": "orders", "after": 2}, token)
    assert status == 201
    assert (fault["kind"], fault["entity"], fault["after"], fault["remaining"], fault["how"]) == (
        "lost-ack", "orders", 2, 1, "drop"
    )  # fmt: skip
    basic = "Basic " + base64.b64encode(b"root:root-secret").decode()  # curl -u root:root-secret
    status, timed = http(port, "POST", "/$faults", {"kind": "server-busy", "duration": 30}, basic)
    assert status == 201 and timed["remaining"] is None and timed["expires_at_us"] is not None
    assert [f["id"] for f in http(port, "GET", "/$faults", None, token)[1]] == [fault["id"], timed["id"]]
    assert [f["id"] for f in server.faults()] == [fault["id"], timed["id"]]  # the same book
    assert http(port, "DELETE", f"/$faults/{fault['id']}", None, token) == (200, {"cleared": 1})
    assert http(port, "DELETE", f"/$faults/{fault['id']}", None, token)[0] == 404
    assert http(port, "DELETE", "/$faults", None, token) == (200, {"cleared": 1})
    assert server.faults() == []


@pytest.mark.parametrize(
    "authorization",
    [None, "send-token", "Basic " + base64.b64encode(b"sender:send-secret").decode(), "wrong-key"],
    ids=["none", "send-token", "send-basic", "wrong-key"],
)
def test_http_refuses_to_arm_without_a_manage_key(server: OncebusServer, authorization: str | None) -> None:
    port = server.http_port
    assert port is not None
    if authorization == "send-token":
        authorization = _sas(port, "sender", "send-secret")
    elif authorization == "wrong-key":
        authorization = _sas(port, "root", "not-the-key")
    status, answer = http(port, "POST", "/$faults", {"kind": "server-busy"}, authorization)
    assert status == 401, answer
    assert "Manage" in answer["error"] or "signature" in answer["error"].lower()
    assert http(port, "GET", "/$faults", None, authorization)[0] == 401
    assert server.faults() == []


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ({"kind": "lost-acks"}, "unknown fault kind 'lost-acks'; use one of lost-ack, server-busy"),
        ({"kind": "lost-ack", "count": 2, "duration": 5}, "counted (count) or timed (duration), not both"),
        ({"kind": "slow-ack"}, "slow-ack needs seconds"),
        ({"kind": "server-busy", "count": 0}, "count must be a whole number from 1"),
        ({"kind": "server-busy", "how": "drop"}, "how is for lost-ack only"),
        ({"kind": "server-busy", "entity": "orders", "colour": "red"}, "unknown fault field(s) colour"),
    ],
)
def test_a_bad_fault_is_refused_naming_what_is_wrong(server: OncebusServer, spec: Any, named: str) -> None:
    port = server.http_port
    assert port is not None
    status, answer = http(port, "POST", "/$faults", spec, _sas(port, "root", "root-secret"))
    assert status == 400 and named in answer["error"]
    with pytest.raises(InvalidArgumentError, match=named.replace("(", r"\(").replace(")", r"\)")):
        server.control("fault.arm", fault=spec)
    assert server.faults() == []


def test_the_command_line_arms_lists_and_clears(server: OncebusServer, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--data-dir", str(server.data_dir), "fault"]
    assert cli_main([*base, "arm", "lost-ack", "--entity", "orders", "--after", "2", "--how", "detach"]) == 0
    armed = re.fullmatch(
        r"armed (f\d+): lost-ack on orders \(detach\) after 2 operation\(s\) 1 more time\(s\)\n",
        capsys.readouterr().out,
    )
    assert armed is not None
    assert cli_main([*base, "arm", "slow-ack", "--seconds", "0.5", "--duration", "60", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["seconds"] == 0.5
    assert cli_main([*base, "list", "--json"]) == 0
    assert [f["kind"] for f in json.loads(capsys.readouterr().out)] == ["lost-ack", "slow-ack"]
    assert cli_main([*base, "clear", armed.group(1)]) == 0
    assert capsys.readouterr().out == "cleared 1 fault(s)\n"
    assert cli_main([*base, "arm", "slow-ack"]) == 1  # no --seconds
    assert "slow-ack needs seconds" in capsys.readouterr().err
    assert [f["kind"] for f in server.faults()] == ["slow-ack"]


def test_without_a_server_the_command_line_says_faults_need_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["--data-dir", str(tmp_path / "data"), "fault", "list"]) == 1
    assert "faults are armed on a running oncebus serve" in capsys.readouterr().err


class _Served:
    """``oncebus.server.run`` in a thread (a broker of the test's own, here listening on every interface)."""

    def __init__(self, options: ServeOptions) -> None:
        self.options = options
        self.info: dict[str, Any] = {}
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        await run(self.options, stop=self._stop, ready=self._on_ready, say=lambda line: None)

    def _on_ready(self, info: dict[str, Any]) -> None:
        self.info = info
        self._ready.set()

    def __enter__(self) -> _Served:
        self._thread.start()
        assert self._ready.wait(30), "the broker did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(15)


@pytest.mark.parametrize("allow_faults", [False, True], ids=["refused", "allowed"])
def test_beyond_loopback_faults_need_allow_faults(tmp_path: Path, allow_faults: bool) -> None:
    options = ServeOptions(
        data_dir=tmp_path / "data", host="0.0.0.0", port=0, keys={"root": "root-secret"}, allow_faults=allow_faults
    )
    with _Served(options) as served:
        port = int(served.info["http_port"])
        status, answer = http(port, "POST", "/$faults", {"kind": "server-busy"}, _sas(port, "root", "root-secret"))
        if allow_faults:
            assert status == 201
        else:
            assert status == 403 and "--allow-faults" in answer["error"]
            assert http(port, "GET", "/$faults", None, _sas(port, "root", "root-secret")) == (200, [])


def test_beyond_loopback_oncebus_testing_meets_the_refusal_too() -> None:
    with serve(mode="thread", host="0.0.0.0", keys={"root": "root-secret"}) as server:
        with pytest.raises(FaultsDisabledError, match="--allow-faults"):
            server.arm_fault("lost-ack")


def test_a_thread_broker_cannot_crash_on_its_own() -> None:
    with serve(mode="thread") as server, pytest.raises(RuntimeError, match="mode='subprocess'"):
        server.crash()


def test_a_fresh_namespace_has_no_fault_armed(server: OncebusServer) -> None:
    server.arm_fault("lost-ack", "orders", count=3)
    server.reset()  # what the plugin's oncebus_namespace does before each test
    assert server.faults() == []
