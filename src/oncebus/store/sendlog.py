"""The send log: one JSON line per send attempt to a dedup-enabled entity, for the window advisor.

Records: ``entity``, ``key`` (the dedup key's text), ``message_id``, ``time``
(ISO-8601 UTC), ``time_us``, ``outcome`` (``new`` | ``duplicate`` | ``late``:
new, but its key was seen before the window), ``window_us``. Files roll every
hour (``sends-YYYYMMDDTHH.jsonl``); lines are buffered and flushed at least
once a second and when the broker stops.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, TextIO

from oncebus.core.timeutil import us_to_datetime

_LOG = logging.getLogger("oncebus.store")


class SendLogWriter:
    def __init__(self, directory: str | Path, *, flush_every: float = 1.0) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._handle: TextIO | None = None
        self._name = ""
        self._flush_every = flush_every
        self._last_flush = time.monotonic()
        self.records = 0

    def __call__(self, record: dict[str, Any]) -> None:
        when = us_to_datetime(int(record["time_us"]))
        name = f"sends-{when:%Y%m%dT%H}.jsonl"
        if name != self._name:
            self.close()
            self._handle = open(self.directory / name, "a", encoding="utf-8")
            self._name = name
        assert self._handle is not None
        line = dict(record)
        line["time"] = when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        self._handle.write(json.dumps(line, separators=(",", ":")) + "\n")
        self.records += 1
        now = time.monotonic()
        if now - self._last_flush >= self._flush_every:
            self._handle.flush()
            self._last_flush = now

    def flush(self) -> None:
        if self._handle is not None:
            self._handle.flush()

    def close(self) -> None:
        if self._handle is not None:
            handle, self._handle, self._name = self._handle, None, ""
            try:
                handle.close()  # (closed even when its last flush fails: a full disk loses only log lines)
            except OSError as exc:
                _LOG.warning("the send log %s lost its last lines: %s", handle.name, exc)
