"""The state of ``deduplicate_stream``: what it holds (``state_report``) and how it stays small (compaction).

Each micro-batch adds one key folder. So that a long-running query's state
stays proportional to the keys inside the window rather than to the number of
batches, old folders are merged: when more than ``COMPACT_AT`` live key
folders are listed, the small ones (under ``TARGET_ROWS`` keys) but the newest
``KEEP_RECENT`` are rewritten as one folder ``c=N`` (N = the batch that
compacted), keeping only keys whose own window has not passed (``t0 + window >
watermark``); a merged folder still small is merged again later.
A folder that no manifest lists any more is deleted once the batch after the
compaction has committed (a replay of the compacting batch still reads it).

So compaction is planned every batch (a look at the manifest, no job) but runs
at most every ``COMPACT_AT - KEEP_RECENT`` = 12 batches in a steady stream of
small batches (after a merge the merged folder and 4 recent ones are live; one
folder a batch is added until more than 16 are), and a manifest lists at
most ``COMPACT_AT + 1`` small folders, plus the large ones (``TARGET_ROWS``
keys or more, a big batch's), which go whole once their window has passed.

``python -m oncebus.spark._state STATE_PATH`` prints the report as JSON
without changing anything.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from oncebus.spark.stream.files import StateFiles, local_directory, state_files
from oncebus.spark.stream.manifest import KeyFolder

COMPACT_AT = 16
KEEP_RECENT = 4
TARGET_ROWS = 1_000_000


def newest_manifest(files: StateFiles) -> dict[str, Any] | None:
    ids = [int(name[:-5]) for name in files.list_names("batches") if name.endswith(".json")]
    if not ids:
        return None
    manifest: dict[str, Any] = json.loads(files.read_text(f"batches/{max(ids):020d}.json"))
    return manifest


def _iso(us: int | None) -> str | None:
    if us is None or us >= 2**62:
        return None
    return datetime.fromtimestamp(us / 1_000_000, UTC).isoformat()


def state_report(state_path: str, spark: SparkSession | None = None) -> dict[str, Any]:
    """Size and age of a ``deduplicate_stream`` state, read from its newest manifest and its folders.

    Changes nothing. ``spark`` is needed only for a state path that is not local (HDFS, S3A...).
    """
    files: StateFiles
    if local_directory(state_path) is not None or spark is None:
        directory = local_directory(state_path)
        if directory is None:
            raise ValueError(f"{state_path!r} is not a local path: pass a SparkSession to read it")
        from oncebus.spark.stream.files import LocalFiles

        files = LocalFiles(state_path, directory)
    else:
        files = state_files(spark, state_path)
    manifest = newest_manifest(files)
    if manifest is None:
        return {"state_path": state_path, "batches": 0}
    folders = manifest["key_folders"]
    watermark = manifest.get("watermark_us")
    oldest = min((int(f["max_t0"]) for f in folders), default=None)
    names = files.list_names("")
    return {
        "state_path": state_path,
        "layout": manifest.get("layout", 1),
        "batch_id": manifest["batch_id"],
        "watermark": _iso(watermark),
        "newest_time": _iso(manifest.get("max_time_us")),
        "keys_held": int(manifest.get("keys_held", sum(int(f["rows"]) for f in folders))),
        "key_folders": len(folders),
        "compacted_folders": sum(1 for f in folders if f["path"].startswith("c=")),
        "held_rows": int(manifest.get("counts", {}).get("held", 0)) if manifest.get("held") else 0,
        # every key of the oldest folder was recorded at or before this time
        "oldest_folder_newest_t0": _iso(oldest),
        "oldest_folder_age_seconds": None if oldest is None or watermark is None else (watermark - oldest) / 1e6,
        "bytes": sum(files.size(name) for name in names if name != "_checkpoint"),
        "bytes_by_part": {name: files.size(name) for name in names},
        "folders_on_disk": sum(1 for name in names if name.startswith(("b=", "c="))),
        "last_batch_seconds": manifest.get("seconds", {}),
    }


def plan_compaction(folders: list[KeyFolder]) -> list[KeyFolder]:
    """The live key folders to merge now: when more than ``COMPACT_AT`` are listed, every folder smaller
    than ``TARGET_ROWS`` keys but the newest ``KEEP_RECENT`` (if at least two). Large folders (a big
    micro-batch's) are left alone: their scan costs the same merged or not, and they go whole once
    their newest key's window has passed."""
    if len(folders) <= COMPACT_AT:
        return []
    small = [f for f in folders[: len(folders) - KEEP_RECENT] if int(f["rows"]) < TARGET_ROWS]
    return small if len(small) >= 2 else []


def compact(
    keys: DataFrame, columns: tuple[str, str, str, str], watermark: int | None, default_window_us: int
) -> DataFrame:
    """The keys of the merged folders whose own window has not passed (``t0 + window > watermark``)."""
    h1, h2, t, w = columns
    window = F.coalesce(F.col(w), F.lit(default_window_us))
    alive = keys if watermark is None else keys.where(F.col(t) + window > F.lit(watermark))
    return alive.select(F.col(h1), F.col(h2), F.col(t), window.alias(w))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m oncebus.spark._state STATE_PATH   (a local state path; changes nothing)")
        return 2
    print(json.dumps(state_report(args[0]), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
