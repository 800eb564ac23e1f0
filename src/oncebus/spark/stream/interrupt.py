"""A ``foreachBatch`` function that Spark can tell was interrupted by ``query.stop()``.

``query.stop()`` interrupts the stream thread; the Spark action running in the Python
``foreachBatch`` then fails with a ``Py4JJavaError`` whose text is the whole Java stack trace
(about 10,000 characters). Spark decides whether the batch failed or was stopped by matching
``Py4JJavaError: An error occurred while calling((.|\\r\\n|\\r|\\n)*)(java.lang.InterruptedException|...)``
(``StreamExecution.PROXY_ERROR``) against the Python traceback it gets back; Java's regex engine
recurses once per character of that alternation, so on such a long text the match overflows the
stream thread's stack and the JVM prints a ``java.lang.StackOverflowError`` instead of stopping
quietly. :func:`interruptible` re-raises an interruption as a short error of the same form, which
the match recognises, so the query ends as stopped; every other error passes through unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame

# the exceptions Spark counts as an interruption (StreamExecution.IO_EXCEPTION_NAMES)
INTERRUPTIONS = frozenset(
    {"java.lang.InterruptedException", "java.io.InterruptedIOException", "java.nio.channels.ClosedByInterruptException"}
)


class QueryInterrupted(Exception):
    """The micro-batch was interrupted by ``query.stop()``; its text is the form Spark recognises."""


def _java_classes(error: BaseException) -> list[str]:
    """Class names of the Java exception behind ``error`` and its causes ([] when there is none)."""
    java: Any = getattr(error, "java_exception", None) or getattr(error, "_origin", None)
    names: list[str] = []
    try:
        while java is not None and len(names) < 20:
            names.append(str(java.getClass().getName()))
            java = java.getCause()
    except Exception:  # the gateway is gone (the session stopped): nothing more to learn
        pass
    return names


def interruption_of(error: BaseException) -> str | None:
    """The Java interruption behind ``error`` (or an error it was raised from), if there is one."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for name in _java_classes(current):
            if name in INTERRUPTIONS:
                return name
        current = current.__cause__ or current.__context__
    return None


def interruptible(function: Callable[[DataFrame, int], None]) -> Callable[[DataFrame, int], None]:
    """``function`` as a ``foreachBatch`` function whose interruption Spark recognises (see the module)."""

    def each_batch(batch: DataFrame, batch_id: int) -> None:
        try:
            function(batch, batch_id)
        except Exception as error:
            name = interruption_of(error)
            if name is None:
                raise
            raise QueryInterrupted(
                f"py4j.protocol.Py4JJavaError: An error occurred while calling foreachBatch "
                f"(micro-batch {batch_id}, stopped).\n: {name}"
            ) from None

    return each_batch
