"""``oncebus serve``'s keys, as a user gives them: --key NAME[:RIGHTS]=KEY, --keys-file, ONCEBUS_SAS_KEYS.
Bad input is one error line naming what is wrong and what is allowed, never echoing a key."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.cli_support import ONCEBUS, assert_one_line_error


def serve(tmp_path: Path, *args: str, env_keys: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ONCEBUS_DATA_DIR": str(tmp_path / "data")}
    env.pop("ONCEBUS_CLOCK_FILE", None)
    env.pop("ONCEBUS_SAS_KEYS", None)
    if env_keys is not None:
        env["ONCEBUS_SAS_KEYS"] = env_keys
    return subprocess.run(
        [*ONCEBUS, "serve", "--port", "0", *args], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("args", "env_keys", "wanted"),
    [
        (("--key", "justakey-topsecret"), None, "--key: a SAS key without '=' is not of the form NAME=KEY"),
        (("--key", "app:Read=topsecret"), None, "'Read' is not a right; use a comma-separated list of Send, Listen"),
        (("--key", "a=topsecret", "--key", "a=other"), None, "'a' is given twice"),
        (("--keys-file", "/nonexistent/keys"), None, "cannot read the keys file '/nonexistent/keys'"),
        ((), "app:Sned=topsecret", "ONCEBUS_SAS_KEYS: 'Sned' is not a right"),
    ],
)
def test_bad_keys_are_one_clear_line_without_the_key(
    tmp_path: Path, args: tuple[str, ...], env_keys: str | None, wanted: str | None
) -> None:
    if wanted is None:
        return
    result = serve(tmp_path, *args, env_keys=env_keys)
    line = assert_one_line_error(result, codes=(2,))
    assert wanted in line, line
    assert "topsecret" not in line


def test_a_keys_file_line_that_is_wrong_is_named(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# comment\nok=fine\nbroken line topsecret\n")
    line = assert_one_line_error(serve(tmp_path, "--keys-file", str(keys)), codes=(2,))
    assert f"keys file '{keys}'" in line and "NAME=KEY or NAME:RIGHTS=KEY" in line


def test_the_default_key_beyond_loopback_is_refused_but_own_keys_are_not_checked_as_public(tmp_path: Path) -> None:
    line = assert_one_line_error(serve(tmp_path, "--host", "0.0.0.0", env_keys="mine=SAS_KEY_VALUE"))
    assert "public" in line and "--allow-default-key" in line  # the public key under another name is refused too
