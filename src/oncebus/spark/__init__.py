"""The duplicate-detection rule at data-pipeline scale (optional extra: ``pip install oncebus[spark]``).

* :func:`deduplicate`: the exact rule on a batch DataFrame (or Spark's
  approximate ``dropDuplicatesWithinWatermark`` on a stream, if asked).
* :func:`deduplicate_stream`: the exact rule on a streaming DataFrame, state
  kept as Parquet under a path you give.
* :func:`advise`: the window advisor over a broker's send log.
* :func:`register`: the ``oncebus`` data source (read a queue or subscription, write a queue or topic).
* :func:`state_report`: size and age of a ``deduplicate_stream`` state (changes nothing).
"""

from __future__ import annotations

from oncebus.spark._advisor import advise, write_advice
from oncebus.spark._datasource import OncebusDataSource, register
from oncebus.spark._dedup import deduplicate
from oncebus.spark._settings import EntitySettings
from oncebus.spark.stream import DEFAULT_MAX_OUT_OF_ORDER, StreamOptions, deduplicate_stream, flush_stream
from oncebus.spark.stream.state import state_report

__all__ = [
    "DEFAULT_MAX_OUT_OF_ORDER",
    "EntitySettings",
    "OncebusDataSource",
    "StreamOptions",
    "advise",
    "deduplicate",
    "deduplicate_stream",
    "flush_stream",
    "register",
    "state_report",
    "write_advice",
]
