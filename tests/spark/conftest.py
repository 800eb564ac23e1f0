"""One local[2] SparkSession for the whole Spark suite (settings measured for fast local tests)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("pyspark", reason="pyspark is not importable: install the extra, pip install -e '.[dev,spark]'")
pytest.importorskip("pyarrow", reason="pyarrow is not importable: install the extra, pip install -e '.[dev,spark]'")

from pyspark.sql import SparkSession

from tests.spark.jobs.common import local_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = local_session("oncebus-tests", driver_memory="2g")
    yield session
    session.stop()
