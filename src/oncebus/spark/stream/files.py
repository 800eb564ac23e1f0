"""Small files (batch manifests) and folders under the state path, from the driver.

State lives under a path the user gives. A local path (no scheme, or
``file:``) is handled with plain Python file access, which works the same in a
classic session, in a Spark Connect session (``foreachBatch`` runs on the
Connect server's host, beside the driver) and on a cluster whose workers
reach the same path (a shared mount). Any other scheme (HDFS, S3A, ABFS...)
goes through Spark's own Hadoop FileSystem, which needs the classic JVM
gateway; under Spark Connect such a path is refused with a clear error.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from pyspark.sql import SparkSession

from oncebus.core.errors import InvalidArgumentError


class StateFiles(Protocol):
    root: str

    def path(self, relative: str) -> str: ...
    def list_names(self, relative: str) -> list[str]: ...
    def read_text(self, relative: str) -> str: ...
    def write_text(self, relative: str, text: str) -> None: ...
    def delete(self, relative: str) -> None: ...
    def size(self, relative: str) -> int: ...


def local_directory(root: str) -> Path | None:
    """The local directory a state path names, or None when it has another scheme."""
    parsed = urlparse(root)
    if parsed.scheme == "" or (len(parsed.scheme) == 1 and root[1:3] in (":\\", ":/")):
        return Path(root)
    if parsed.scheme == "file":
        return Path(parsed.path)
    return None


def state_files(spark: SparkSession, root: str) -> StateFiles:
    directory = local_directory(root)
    if directory is not None:
        return LocalFiles(root, directory)
    return HadoopFiles(spark, root)


class LocalFiles:
    def __init__(self, root: str, directory: Path) -> None:
        self.root = root.rstrip("/")
        self.directory = directory

    def path(self, relative: str) -> str:
        return f"{self.root}/{relative}"

    def list_names(self, relative: str) -> list[str]:
        folder = self.directory / relative
        return sorted(os.listdir(folder)) if folder.is_dir() else []

    def read_text(self, relative: str) -> str:
        return (self.directory / relative).read_text(encoding="utf-8")

    def write_text(self, relative: str, text: str) -> None:
        """Write a temporary file, then rename: readers see the old file or the whole new one."""
        target = self.directory / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, target)

    def delete(self, relative: str) -> None:
        target = self.directory / relative
        if target.is_dir():
            shutil.rmtree(target, ignore_errors=True)
        elif target.exists():
            target.unlink()

    def size(self, relative: str) -> int:
        target = self.directory / relative
        if target.is_file():
            return target.stat().st_size
        return sum(p.stat().st_size for p in target.rglob("*") if p.is_file()) if target.is_dir() else 0


class HadoopFiles:
    """Any Hadoop file system, through the classic session's JVM gateway."""

    def __init__(self, spark: SparkSession, root: str) -> None:
        context: Any = getattr(spark, "sparkContext", None) if not _is_connect(spark) else None
        if context is None:
            raise InvalidArgumentError(
                f"state path {root!r}: under Spark Connect the state path must be a local path or a shared "
                "mount (plain path or file:), reachable from the Connect server and every worker"
            )
        jvm: Any = context._jvm
        self._jvm = jvm
        self._conf = context._jsc.hadoopConfiguration()
        self.root = root.rstrip("/")
        self._fs = jvm.org.apache.hadoop.fs.Path(self.root).getFileSystem(self._conf)

    def path(self, relative: str) -> str:
        return f"{self.root}/{relative}"

    def _p(self, relative: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(self.path(relative))

    def exists(self, relative: str) -> bool:
        return bool(self._fs.exists(self._p(relative)))

    def list_names(self, relative: str) -> list[str]:
        if not self.exists(relative):
            return []
        return sorted(str(status.getPath().getName()) for status in self._fs.listStatus(self._p(relative)))

    def read_text(self, relative: str) -> str:
        stream = self._fs.open(self._p(relative))
        try:
            return str(self._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def write_text(self, relative: str, text: str) -> None:
        """Write to a temporary name, then rename: readers see the old file or the whole new one."""
        temporary = self._p(relative + ".tmp")
        out = self._fs.create(temporary, True)
        try:
            out.write(bytearray(text.encode("utf-8")))
        finally:
            out.close()
        final = self._p(relative)
        if self._fs.exists(final):
            self._fs.delete(final, False)
        if not self._fs.rename(temporary, final):
            raise OSError(f"could not rename {self.path(relative)}.tmp to {self.path(relative)}")

    def delete(self, relative: str) -> None:
        target = self._p(relative)
        if self._fs.exists(target):
            self._fs.delete(target, True)

    def size(self, relative: str) -> int:
        target = self._p(relative)
        return int(self._fs.getContentSummary(target).getLength()) if self._fs.exists(target) else 0


def _is_connect(spark: SparkSession) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")
