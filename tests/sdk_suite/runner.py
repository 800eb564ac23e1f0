"""Runs azure-servicebus's own tests (from its source release on PyPI) against ``oncebus serve`` (issue 35).

The release's ``tests`` folder is downloaded with pip (its sha256 checked), extracted into a work folder, and
run there by a pytest subprocess with the stand-ins of ``standins/``: ``devtools_testutils`` (the Azure SDK
repository's test toolkit, not on PyPI) on ``PYTHONPATH``, ``servicebus_preparer.py`` copied over the release's,
and ``suite_conftest.py`` as the work folder's conftest.py. Nothing of Microsoft's is kept in this repository.

``python -m tests.sdk_suite.runner [pytest args]`` runs it by hand (what the tests and the exceptions are:
test_sdk_suite.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.amqp.conftest import ServerProcess

SDK = "azure-servicebus"
SDK_VERSION = "7.15.0"
SDIST = f"azure_servicebus-{SDK_VERSION}.tar.gz"
SDIST_SHA256 = "62c73f3d9efbaf0089a375adc5ef992ffe6d7d0b1218b8462265aa30ad352c3e"
STANDINS = Path(__file__).resolve().parent / "standins"
# namespace keys with fewer rights for ServiceBusNamespaceAuthorizationRulePreparer (oncebus makes none at run time)
RULE_RIGHTS = ("Manage", "Send", "Listen", "Send,Listen")


def obtain_sdist(cache: Path) -> Path:
    """The release's source archive, downloaded with pip into ``cache`` unless already there (checked)."""
    cache.mkdir(parents=True, exist_ok=True)
    archive = cache / SDIST
    if not archive.exists() or _sha256(archive) != SDIST_SHA256:
        archive.unlink(missing_ok=True)
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q"]
        subprocess.run([*command, "-d", str(cache), f"{SDK}=={SDK_VERSION}"], check=True, timeout=600)
    digest = _sha256(archive)
    if digest != SDIST_SHA256:
        raise RuntimeError(f"{archive}: sha256 {digest}, expected {SDIST_SHA256} (the pinned {SDK} {SDK_VERSION})")
    return archive


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def prepare(archive: Path, work: Path) -> Path:
    """The work folder: the release's ``tests`` as ``work/tests``, the stand-ins in place; returns ``work``."""
    prefix = f"azure_servicebus-{SDK_VERSION}/tests/"
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix) and (m.isfile() or m.isdir())]
        for member in members:
            member.name = "tests/" + member.name[len(prefix) :]
        tar.extractall(work, members=members, filter="data")
    shutil.copyfile(STANDINS / "servicebus_preparer.py", work / "tests" / "servicebus_preparer.py")
    shutil.copyfile(STANDINS / "suite_conftest.py", work / "conftest.py")
    (work / "pytest.ini").write_text("[pytest]\ntimeout = 240\nxfail_strict = false\n")
    return work


@dataclass
class Server:
    """``oncebus serve`` on free ports with a fresh root key, and keys with fewer rights."""

    data_dir: Path
    key: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    rule_keys: dict[str, tuple[str, str]] = field(default_factory=dict)
    process: ServerProcess | None = None

    def start(self) -> Server:
        args = ["--key", f"RootManageSharedAccessKey={self.key}"]
        for rights in RULE_RIGHTS:
            name = "suite-" + rights.lower().replace(",", "-")
            self.rule_keys[rights] = (name, secrets.token_urlsafe(32))
            args += ["--key", f"{name}:{rights}={self.rule_keys[rights][1]}"]
        self.process = ServerProcess(self.data_dir, args=tuple(args)).start()
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def printed(self, prefix: str) -> str:
        assert self.process is not None
        line = next(line for line in self.process.output if line.startswith(prefix))
        return line[len(prefix) :].split()[0]

    def environment(self) -> dict[str, str]:
        ca = self.printed("CA certificate: ")
        return {
            "ONCEBUS_SUITE_TLS_PORT": self.printed("TLS on ").rsplit(":", 1)[1],
            "ONCEBUS_SUITE_HTTP_PORT": self.printed("HTTP on ").rsplit(":", 1)[1],
            "ONCEBUS_SUITE_KEY": self.key,
            "ONCEBUS_SUITE_CA": ca,
            "ONCEBUS_SUITE_RULE_KEYS": json.dumps(self.rule_keys),
            "SSL_CERT_FILE": ca,  # aiohttp (the aio administration client)
            "REQUESTS_CA_BUNDLE": ca,  # requests (the administration client)
        }


@dataclass
class Run:
    outcomes: dict[str, dict[str, object]]
    output: str
    seconds: float


def run(
    work: Path,
    server: Server,
    files: list[str],
    workers: int,
    *,
    not_run: dict[str, str] | None = None,
    durations: dict[str, float] | None = None,
    extra: tuple[str, ...] = (),
) -> Run:
    """pytest on ``files`` (relative to ``work/tests``) in a subprocess, ``workers`` at once (each test has its own
    namespace); each test's outcome by node id (``tests/<file>::<class>::<test>``). ``not_run``: node ids skipped
    with their reason; ``durations``: node ids known to take long (seconds), run first."""
    outcomes = work / "outcomes.json"
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("AZURE_", "SERVICEBUS_", "PYTEST_"))}
    environment.update(server.environment())
    environment.update(
        {
            "PYTHONPATH": str(STANDINS),
            "ONCEBUS_SUITE_OUTCOMES": str(outcomes),
            "ONCEBUS_SUITE_NOT_RUN": json.dumps(not_run or {}),
            "ONCEBUS_SUITE_DURATIONS": json.dumps(durations or {}),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
    )
    command = [sys.executable, "-m", "pytest", *(f"tests/{f}" for f in files), "-q", "-rfE", "--no-header"]
    command += ["-p", "no:cacheprovider", "-p", "no:oncebus", "--tb=line"]
    command += ["-n", str(workers), "--dist", "load", "--maxschedchunk", "1"] if workers > 1 else []
    started = time.monotonic()
    result = subprocess.run([*command, *extra], cwd=work, env=environment, capture_output=True, text=True, timeout=1800)
    seconds = time.monotonic() - started
    found = json.loads(outcomes.read_text()) if outcomes.exists() else {}
    (work / "output.txt").write_text(result.stdout + result.stderr)  # the whole run's report, for a failure
    return Run(found, result.stdout + result.stderr, seconds)


def main(argv: list[str]) -> int:
    """By hand: ``[WORKERS=n] python -m tests.sdk_suite.runner [files or node ids] [pytest options]``."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="sdk-suite-"))
    archive = obtain_sdist(Path(os.environ.get("ONCEBUS_SDK_SUITE_CACHE", base / "cache")))
    work = prepare(archive, base / "work")
    server = Server(base / "data").start()
    try:
        files = [a for a in argv if not a.startswith("-")] or ["test_queues.py"]
        options = [a for a in argv if a.startswith("-")]
        outcome = run(work, server, files, int(os.environ.get("WORKERS", "4")), extra=tuple(options))
    finally:
        server.stop()
    (base / "output.txt").write_text(outcome.output)
    print(outcome.output[-5000:])
    counts: dict[str, int] = {}
    for entry in outcome.outcomes.values():
        counts[str(entry["outcome"])] = counts.get(str(entry["outcome"]), 0) + 1
    print(counts, f"{outcome.seconds:.0f} s", base)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
