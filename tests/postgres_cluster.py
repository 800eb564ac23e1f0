"""A throwaway PostgreSQL cluster for the tests: ``initdb`` and ``pg_ctl start`` in a temporary directory.

It listens on 127.0.0.1 on a free port (and on a unix socket in its directory), trusts local connections,
and runs as an unprivileged user: PostgreSQL refuses to run as root, so when the tests run as root (CI) the
server runs as ``postgres`` if that user exists (Debian's package makes it), else as ``nobody``. The binaries
are looked for on PATH, then in /usr/lib/postgresql/<version>/bin; if they are missing the tests that need
them FAIL, saying what to install (they never skip: .ci/run installs Debian's ``postgresql``).

Each test gets a schema of its own (``fresh_url``): the store creates its tables in the URL's search_path.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

import psycopg
import pytest

SUPERUSER = "oncebus"
DEBIAN_BINARIES = Path("/usr/lib/postgresql")  # Debian's postgresql package: <version>/bin


def find_binaries() -> Path:
    """The directory holding initdb, pg_ctl and postgres (the newest version found)."""
    candidates = []
    on_path = shutil.which("initdb")
    if on_path is not None:
        candidates.append(Path(on_path).resolve().parent)
    versions = [p for p in DEBIAN_BINARIES.glob("*/bin") if p.parent.name.isdigit()]
    candidates += sorted(versions, key=lambda p: int(p.parent.name), reverse=True)
    for folder in candidates:
        if all((folder / name).exists() for name in ("initdb", "pg_ctl", "postgres")):
            return folder
    pytest.fail(
        "PostgreSQL's initdb, pg_ctl and postgres were not found (on PATH or in /usr/lib/postgresql/*/bin): "
        "install Debian's postgresql package (apt-get install postgresql), as .ci/run does",
        pytrace=False,
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _server_user() -> str | None:
    """Who runs the server: None (this user) unless this is root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    pytest.fail("running as root, and neither the user postgres nor nobody exists to run PostgreSQL as", pytrace=False)


class PostgresCluster:
    def __init__(self) -> None:
        self.bin = find_binaries()
        self.user = _server_user()
        self.dir = Path(tempfile.mkdtemp(prefix="oncebus-pg-"))  # short: the unix socket's path is limited
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.port = _free_port()
        if self.user is not None:
            record = pwd.getpwnam(self.user)
            os.chown(self.dir, record.pw_uid, record.pw_gid)
        self.started = False

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin / args[0]), *args[1:]]
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        result = subprocess.run(command, cwd=self.dir, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr}\n{log}")
        return result

    def start(self) -> None:
        if not self.data.exists():
            self._run(
                "initdb", "-D", str(self.data), "-U", SUPERUSER, "--auth=trust", "--encoding=UTF8", "--locale=C",
                "--no-sync",
            )  # fmt: skip
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c shared_buffers=32MB "
            "-c max_connections=200 -c max_wal_size=256MB"
        )
        self._run("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data), "-l", str(self.log), "-o", options)
        self.started = True

    def stop(self, mode: str = "fast") -> None:
        if self.started:
            self._run("pg_ctl", "stop", "-w", "-D", str(self.data), "-m", mode)
            self.started = False

    def remove(self) -> None:
        try:
            self.stop("immediate")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def url(self, database: str = "postgres", schema: str | None = None) -> str:
        url = f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"
        return url if schema is None else f"{url}?options=-csearch_path%3D{schema}"

    def fresh_url(self) -> str:
        """A URL whose tables land in a new, empty schema."""
        schema = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url(), autocommit=True) as db:
            db.execute(f"CREATE SCHEMA {schema}")
        return self.url(schema=schema)
