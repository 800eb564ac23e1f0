"""A data directory: the store file, the lock that makes one process its owner, and the server's address.

``oncebus serve`` holds the lock for as long as it runs and writes
``server.json`` (control port, token, AMQP address). CLI commands that find
the lock held go through that server; they never open the store behind its
back.

The lock is taken on the directory itself (and on its ``lock`` file, which
holds the owner's pid), so deleting the directory's files does not free it;
while the lock is held, a ``lock`` or ``server.json`` file that disappears is
written again within a second, so other commands still find the server.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any, TextIO

from oncebus.core.errors import DataDirBusyError as DataDirBusyError

_LOG = logging.getLogger("oncebus.datadir")
WATCH_SECONDS = 1.0

DATA_DIR_ENV = "ONCEBUS_DATA_DIR"
DEFAULT_DATA_DIR = ".oncebus"
STORE_FILE = "oncebus.db"
TIER_FILE = "tier"  # the namespace's tier, as the last serve or command on it chose it (one word)
PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def resolve_data_dir(flag: str | None, from_settings: Path | None = None) -> Path:
    """``--data-dir``, else ``ONCEBUS_DATA_DIR`` (``Settings.data_dir``), else ``.oncebus``."""
    return Path(flag or from_settings or DEFAULT_DATA_DIR).expanduser().resolve()


class DataDir:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock_file: TextIO | None = None
        self._dir_fd: int | None = None
        self._server_info: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    @property
    def store_path(self) -> Path:
        return self.path / STORE_FILE

    @property
    def server_file(self) -> Path:
        return self.path / "server.json"

    def try_lock(self) -> bool:
        """Take the exclusive lock; False when another process holds it. The directory is made private (0700) and
        its store files (0600) before anything is written: they hold message bodies."""
        self.path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
        dir_fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(dir_fd)
            return False
        handle = self._open_lock_file()
        if handle is None:  # a process that locks only the file holds it
            fcntl.flock(dir_fd, fcntl.LOCK_UN)
            os.close(dir_fd)
            return False
        self._dir_fd = dir_fd
        self._lock_file = handle
        self._make_private()
        self._stop.clear()
        self._watcher = threading.Thread(target=self._watch, name="oncebus-datadir-watch", daemon=True)
        self._watcher.start()
        return True

    def _make_private(self) -> None:
        """The directory 0700; the store and its WAL and shared-memory files 0600 (SQLite gives the WAL and SHM
        files the mode of the database file, so an empty database file is created 0600 first)."""
        try:
            os.chmod(self.path, PRIVATE_DIR)
        except OSError as exc:  # a directory another user owns: say so, and go on as it is
            _LOG.warning("cannot make %s private (%s); other users may read its messages", self.path, exc)
        with contextlib.suppress(OSError):  # exists already (a file, or something the store will name)
            os.close(os.open(self.store_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE))
        for suffix in ("", "-wal", "-shm", "-journal"):
            path = Path(f"{self.store_path}{suffix}")
            if path.is_file() and not path.is_symlink():
                with contextlib.suppress(OSError):
                    os.chmod(path, PRIVATE_FILE)

    def _open_lock_file(self) -> TextIO | None:
        handle = open(self.path / "lock", "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        return handle

    def _watch(self) -> None:
        """While locked: write the lock file and server.json again if someone deletes them."""
        while not self._stop.wait(WATCH_SECONDS):
            with contextlib.suppress(OSError):
                self._restore()

    def _restore(self) -> None:
        handle = self._lock_file
        if handle is None:
            return
        try:
            current = os.stat(self.path / "lock")
            mine = os.fstat(handle.fileno())
            lost = (current.st_dev, current.st_ino) != (mine.st_dev, mine.st_ino)
        except FileNotFoundError:
            lost = True
        if lost:
            self.path.mkdir(parents=True, exist_ok=True)
            fresh = self._open_lock_file()
            if fresh is not None:
                self._lock_file = fresh
                handle.close()
                _LOG.warning("the lock file of %s was deleted; wrote it again (pid %d)", self.path, os.getpid())
        info = self._server_info
        if info is not None and not self.server_file.exists():
            self._write_server_file(info)
            _LOG.warning("%s was deleted; wrote it again", self.server_file)

    def owner_pid(self) -> str:
        with contextlib.suppress(OSError):
            return (self.path / "lock").read_text().strip() or "?"
        return "?"

    def unlock(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join()
            self._watcher = None
        self._server_info = None
        if self._lock_file is not None:
            with contextlib.suppress(OSError):
                self.server_file.unlink()
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()
            self._lock_file = None
        if self._dir_fd is not None:
            fcntl.flock(self._dir_fd, fcntl.LOCK_UN)
            os.close(self._dir_fd)
            self._dir_fd = None

    def write_server_info(self, info: dict[str, Any]) -> None:
        self._write_server_file(info)
        self._server_info = dict(info)

    def _write_server_file(self, info: dict[str, Any]) -> None:
        tmp = self.server_file.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(info, handle)
        os.replace(tmp, self.server_file)

    @property
    def tier_file(self) -> Path:
        return self.path / TIER_FILE

    def read_tier(self) -> str | None:
        """The tier stored with this data directory (None: never chosen, or the file is unreadable)."""
        try:
            text = self.tier_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            return None
        return text or None

    def write_tier(self, tier: str) -> None:
        """Store ``tier`` (replaced atomically, fsynced: a crash leaves the old or the new one)."""
        if self.read_tier() == tier:
            return
        tmp = self.tier_file.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(tier + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.tier_file)

    def read_server_info(self) -> dict[str, Any] | None:
        try:
            return dict(json.loads(self.server_file.read_text()))
        except (OSError, ValueError):
            return None
