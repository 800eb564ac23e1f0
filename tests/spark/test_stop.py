"""``query.stop()`` in the middle of a micro-batch is quiet (issue 21).

Spark recognises an interrupted Python ``foreachBatch`` by matching a regular expression
(``StreamExecution.PROXY_ERROR``, ``(.|\\r\\n|\\r|\\n)*``: one stack frame per character) against the
Python traceback; the traceback of an interrupted Spark action carries the whole Java stack trace
(about 10,000 characters), so the match overflowed the stream thread's stack and the JVM printed a
``java.lang.StackOverflowError`` from the stream execution thread.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_stopping_a_query_mid_batch_prints_no_stack_overflow(tmp_path: Path) -> None:
    job = subprocess.run(
        [sys.executable, "-m", "tests.spark.jobs.stop_job", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
    )
    assert "FINISHED" in job.stdout, job.stdout + job.stderr
    assert "exception: None" in job.stdout, job.stdout  # the query ended as stopped, not failed
    assert "StackOverflowError" not in job.stderr, job.stderr[:3000]
    assert "Exception in thread" not in job.stderr, job.stderr[:3000]
