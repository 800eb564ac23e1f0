"""A data directory: the store file, the lock that makes one process its owner, and the server's address.

``oncebus serve`` holds the lock for as long as it runs and writes
``server.json`` (control port, token, AMQP address). CLI commands that find
the lock held go through that server; they never open the store behind its
back.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path
from typing import Any, TextIO

DATA_DIR_ENV = "ONCEBUS_DATA_DIR"
DEFAULT_DATA_DIR = ".oncebus"
STORE_FILE = "oncebus.db"


class DataDirBusyError(RuntimeError):
    pass


def resolve_data_dir(flag: str | None) -> Path:
    return Path(flag or os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR).expanduser().resolve()


class DataDir:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock_file: TextIO | None = None

    @property
    def store_path(self) -> Path:
        return self.path / STORE_FILE

    @property
    def server_file(self) -> Path:
        return self.path / "server.json"

    def try_lock(self) -> bool:
        """Take the exclusive lock; False when another process holds it."""
        self.path.mkdir(parents=True, exist_ok=True)
        handle = open(self.path / "lock", "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return False
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._lock_file = handle
        return True

    def owner_pid(self) -> str:
        with contextlib.suppress(OSError):
            return (self.path / "lock").read_text().strip() or "?"
        return "?"

    def unlock(self) -> None:
        if self._lock_file is not None:
            with contextlib.suppress(OSError):
                self.server_file.unlink()
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()
            self._lock_file = None

    def write_server_info(self, info: dict[str, Any]) -> None:
        tmp = self.server_file.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(info, handle)
        os.replace(tmp, self.server_file)

    def read_server_info(self) -> dict[str, Any] | None:
        try:
            return dict(json.loads(self.server_file.read_text()))
        except (OSError, ValueError):
            return None
