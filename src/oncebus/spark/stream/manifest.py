"""The manifest a micro-batch of ``deduplicate_stream`` writes (``state_path/batches/N.json``), typed.

Batch N reads only what batch N-1's manifest lists. Manifests of every layout (1, 2, 3) share these
keys; the ones marked not required are absent from earlier releases' manifests and read with a default.
"""

from __future__ import annotations

import json
from typing import NotRequired, Required, TypedDict

from oncebus.spark.stream.files import StateFiles

FOLDER = "batches"


class KeyFolder(TypedDict):
    """A folder of recorded keys: its path under the state, key count, newest t0 and layout."""

    path: str
    rows: int
    max_t0: int
    layout: NotRequired[int]  # absent: layout 1 (keys/b=N)


class Counts(TypedDict):
    batch_rows: int  # rows that arrived in this micro-batch
    late: int  # of those, behind the previous watermark
    decided: int
    held: int  # rows held for a later batch after this one
    kept: int
    kept_recorded: int  # kept rows that recorded a key (not bypassing the rule)


class Manifest(TypedDict, total=False):
    layout: int
    batch_id: Required[int | None]  # None: the empty manifest before the first batch
    watermark_us: Required[int | None]  # rows below it have been decided
    max_time_us: Required[int | None]  # the newest event time seen
    max_out_of_order_us: int
    key_folders: Required[list[KeyFolder]]
    keys_held: int
    held: Required[str | None]  # the folder of the rows held for the next batch
    held_min_t_us: int | None  # the oldest held row's time (an idle trigger decides nothing below it)
    arrivals: Required[list[list[int]]]  # [processing time, newest event time] not yet released
    ordered: bool
    buckets: int  # layout 3: the number of buckets
    held_buckets: list[int]  # layout 3: buckets that hold rows
    flushed: bool
    counts: Counts
    seconds: dict[str, float]


def empty() -> Manifest:
    """The manifest before the first batch."""
    return {
        "batch_id": None,
        "watermark_us": None,
        "max_time_us": None,
        "key_folders": [],
        "held": None,
        "arrivals": [],
    }


def batch_ids(files: StateFiles) -> list[int]:
    return sorted(int(name[:-5]) for name in files.list_names(FOLDER) if name.endswith(".json"))


def read(files: StateFiles, batch_id: int) -> Manifest:
    manifest: Manifest = json.loads(files.read_text(f"{FOLDER}/{batch_id:020d}.json"))
    return manifest


def write(files: StateFiles, manifest: Manifest) -> None:
    """Written atomically (the state's file system replaces the file whole)."""
    assert manifest["batch_id"] is not None
    files.write_text(f"{FOLDER}/{manifest['batch_id']:020d}.json", json.dumps(manifest, indent=1))


def held_rows(manifest: Manifest) -> int:
    """Rows the batch left held for the next one."""
    return int(manifest.get("counts", {}).get("held", 0)) if manifest["held"] else 0
