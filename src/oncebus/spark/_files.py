"""Small files (batch manifests) and folders on any Hadoop file system, from the driver.

State lives under a path the user gives (local, HDFS, S3A, ABFS...); the
driver reaches it through Spark's own Hadoop FileSystem, never assuming a
local disk.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession


class HadoopFiles:
    def __init__(self, spark: SparkSession, root: str) -> None:
        jvm: Any = spark.sparkContext._jvm
        self._jvm = jvm
        self._conf = spark.sparkContext._jsc.hadoopConfiguration()
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
