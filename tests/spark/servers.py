"""Spark processes the cluster and Connect tests start from the installed pyspark: free ports, temp dirs.

* :class:`ConnectServer`: ``spark-submit --class ...SparkConnectServer`` (the server pyspark 4.3 ships),
  local master, the venv's Python for Python workers.
* :class:`StandaloneCluster`: a standalone master and workers (``bin/spark-class ...Master`` /
  ``...Worker``), each worker one core and a small memory, running the venv's Python.

Both are sized for a shared 2-core machine and stopped (process group killed) when the test ends.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyspark

SPARK_HOME = Path(pyspark.__file__).resolve().parent
START_TIMEOUT = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spark_env(work: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "SPARK_HOME": str(SPARK_HOME),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(work / "logs"),
            "SPARK_PID_DIR": str(work / "pids"),
            "SPARK_WORKER_DIR": str(work / "worker"),
            "SPARK_LOCAL_DIRS": str(work / "local"),
            "SPARK_NO_DAEMONIZE": "1",
        }
    )
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    env.pop("SPARK_CONNECT_MODE_ENABLED", None)
    return env


def _wait_for_port(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"exited with {process.returncode}:\n{log.read_text()[-4000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise RuntimeError(f"port {port} never opened:\n{log.read_text()[-4000:]}")


def _start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(process: subprocess.Popen[bytes] | None) -> None:
    if process is None or process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass


def is_executor(pid: int) -> bool:
    try:
        return b"CoarseGrainedExecutorBackend" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


class ConnectServer:
    def __init__(self, work: Path, *, master: str = "local[2]", memory: str = "1g") -> None:
        self.work = work
        self.port = free_port()
        self.master = master
        self.memory = memory
        self.process: subprocess.Popen[bytes] | None = None
        self.log = work / "connect.log"

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def start(self) -> ConnectServer:
        command = [
            str(SPARK_HOME / "bin" / "spark-submit"),
            "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--master",
            self.master,
            "--driver-memory",
            self.memory,
            "--conf",
            f"spark.connect.grpc.binding.port={self.port}",
            "--conf",
            "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.sql.shuffle.partitions=2",
            "--conf",
            "spark.default.parallelism=2",
            "--conf",
            "spark.sql.session.timeZone=UTC",
            "--conf",
            "spark.driver.host=127.0.0.1",
            "--conf",
            "spark.driver.bindAddress=127.0.0.1",
            "--conf",
            "spark.sql.parquet.outputTimestampType=TIMESTAMP_MICROS",
            "--conf",
            f"spark.local.dir={self.work / 'local'}",
        ]
        self.process = _start(command, spark_env(self.work), self.log)
        _wait_for_port(self.port, self.process, self.log)
        return self

    def stop(self) -> None:
        _stop(self.process)
        self.process = None


class StandaloneCluster:
    """A standalone master and ``workers`` workers of one core each."""

    def __init__(self, work: Path, *, workers: int = 2, worker_memory: str = "1g") -> None:
        self.work = work
        self.master_port = free_port()
        self.workers = workers
        self.worker_memory = worker_memory
        self.master: subprocess.Popen[bytes] | None = None
        self.worker_processes: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    def start(self) -> StandaloneCluster:
        env = spark_env(self.work)
        spark_class = str(SPARK_HOME / "bin" / "spark-class")
        self.master = _start(
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.master_port),
                "--webui-port",
                str(free_port()),
            ],
            dict(env, SPARK_DAEMON_MEMORY="256m"),
            self.work / "logs" / "master.log",
        )
        _wait_for_port(self.master_port, self.master, self.work / "logs" / "master.log")
        for i in range(self.workers):
            work_dir = self.work / f"worker-{i}"
            work_dir.mkdir(parents=True, exist_ok=True)
            port = free_port()
            log = self.work / "logs" / f"worker-{i}.log"
            process = _start(
                [
                    spark_class,
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--webui-port",
                    str(free_port()),
                    "--cores",
                    "1",
                    "--memory",
                    self.worker_memory,
                    "--work-dir",
                    str(work_dir),
                    self.url,
                ],
                dict(env, SPARK_DAEMON_MEMORY="256m", SPARK_WORKER_DIR=str(work_dir)),
                log,
            )
            self.worker_processes.append(process)
            _wait_for_port(port, process, log)
        return self

    def wait_registered(self, timeout: float = START_TIMEOUT) -> None:
        """Until every worker has registered with the master (its log says so)."""
        deadline = time.monotonic() + timeout
        log = self.work / "logs" / "master.log"
        while time.monotonic() < deadline:
            if log.read_text().count("Registering worker") >= self.workers:
                return
            time.sleep(0.3)
        raise RuntimeError(f"workers never registered:\n{log.read_text()[-4000:]}")

    def executor_pids(self) -> list[int]:
        """Process ids of the executors (CoarseGrainedExecutorBackend JVMs) the workers launched."""
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                children.setdefault(ppid, []).append(int(entry.name))
        found: list[int] = []
        stack = [p.pid for p in self.worker_processes]
        while stack:
            pid = stack.pop()
            for child in children.get(pid, []):
                if is_executor(child):
                    found.append(child)
                stack.append(child)
        return sorted(found)

    def stop(self) -> None:
        for process in self.worker_processes:
            _stop(process)
        self.worker_processes = []
        _stop(self.master)
        self.master = None
