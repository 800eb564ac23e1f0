"""``oncebus token``: a SAS token for the REST data plane, signed by the running server with its keys (Azure's REST
API takes SAS tokens, not Basic); and ``oncebus serve --data-dir DIR``, the order people type."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli_support import ONCEBUS, Serve, assert_one_line_error, oncebus


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    base = tmp_path_factory.mktemp("token")
    keys = base / "keys"
    keys.write_text("owner=owner-secret\nsender:Send=send-secret\n")
    data_dir = base / "data"
    serve = Serve(data_dir)  # --data-dir after the command: failed before with "unrecognized arguments"
    serve.command = [*ONCEBUS, "serve", "--data-dir", str(data_dir), "--port", "0", "--keys-file", str(keys)]
    serve.start()
    for entity in ("orders", "other"):
        assert oncebus("queue", "create", entity, data_dir=data_dir).returncode == 0
    yield serve
    serve.stop()


def _post(serve: Serve, entity: str, token: str) -> int:
    port = serve.info()["http_port"]
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/{entity}/messages", data=b"hello", method="POST", headers={"Authorization": token}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_a_token_for_an_entity_sends_over_rest_and_only_there(server: Serve) -> None:
    made = oncebus("token", "orders", data_dir=server.data_dir)
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert token.startswith("SharedAccessSignature ") and "skn=owner" in token and "owner-secret" not in token
    assert _post(server, "orders", token) == 201
    assert _post(server, "other", token) == 401  # the token names orders
    stats = json.loads(oncebus("stats", "orders", "--json", data_dir=server.data_dir).stdout)
    assert stats[0]["active_message_count"] == 1


def test_a_namespace_token_with_a_send_key(server: Serve) -> None:
    made = oncebus("token", "--key-name", "sender", "--ttl", "60", "--json", data_dir=server.data_dir)
    assert made.returncode == 0, made.stderr
    result = json.loads(made.stdout)
    assert result["rights"] == ["Send"] and "skn=sender" in result["token"]
    assert _post(server, "other", result["token"]) == 201


def test_refusals_are_one_line(server: Serve, tmp_path: Path) -> None:
    unknown = assert_one_line_error(oncebus("token", "--key-name", "nobody", data_dir=server.data_dir))
    assert "nobody" in unknown and "owner" in unknown and "sender" in unknown
    ttl = assert_one_line_error(oncebus("token", "--ttl", "0", data_dir=server.data_dir))
    assert "ttl" in ttl
    no_server = assert_one_line_error(oncebus("token", data_dir=tmp_path / "none"), codes=(3,))
    assert "oncebus serve" in no_server


def test_data_dir_after_the_command_wins(server: Serve, tmp_path: Path) -> None:
    listed = oncebus("queue", "list", "--json", "--data-dir", str(server.data_dir), data_dir=tmp_path / "elsewhere")
    assert listed.returncode == 0, listed.stderr
    assert {q["name"] for q in json.loads(listed.stdout)} >= {"orders", "other"}
