"""What a test broker is started with, shared by its two modes (a subprocess and a thread)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from oncebus.core.errors import OncebusError

_OUTPUT_LINES = 200


class BrokerStartError(OncebusError, RuntimeError):
    """``oncebus serve`` did not become ready; the message carries its output."""

    condition = "amqp:internal-error"
    status = 500


@dataclass(frozen=True)
class Launch:
    """What to serve: ``oncebus serve --port 0`` with these settings."""

    data_dir: Path
    host: str
    config: Path | None
    keys: Mapping[str, str]
    clock_file: Path | None
    work_dir: Path  # the temporary directory serve() made (clock, config, and the data unless given)
