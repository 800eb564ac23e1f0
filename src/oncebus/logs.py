"""Log output of ``oncebus serve``: readable text, or JSON lines for log shippers (``--log-format json``).

Only the ``oncebus`` loggers are configured (INFO and up, to stderr); a record's
``extra`` fields (for example the per-minute duplicate counts: ``entity``,
``accepted``, ``duplicates_dropped``, ``late_resends``, ``window_seconds``)
become keys of its JSON object.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

LOG_FORMATS = ("text", "json")
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO-8601), level, logger, message, then the record's extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(log_format: str = "text", *, stream: TextIO | None = None) -> logging.Handler:
    """Send the ``oncebus`` loggers' INFO and up to ``stream`` (stderr) as text or JSON lines."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"unknown log format {log_format!r}: use one of {', '.join(LOG_FORMATS)}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("oncebus")
    for old in list(logger.handlers):
        logger.removeHandler(old)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return handler
