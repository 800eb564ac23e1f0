"""The bucketed state of ``deduplicate_stream`` (layout 3), read and written inside executor tasks.

Rows are spread over ``buckets`` Spark partitions by ``repartition(buckets, H1)``
(Spark's hash of the key digest), so every key always lands in the same bucket,
and the task of partition ``s`` owns bucket ``s``: it alone reads and writes the
keys of that bucket. Per micro-batch N, one task per bucket:

* looks up the prior ``t0`` of its rows' keys in the bucket's key files of the
  live folders (``<folder>/keys-<s>.arrow``: Arrow IPC, sorted by (h1, h2),
  memory-mapped, binary search; no Spark join), searching a file only for the
  rows its membership filter (``keys-<s>.bits``, beside it) lets through: most
  rows are new keys, in no file; a key file without a filter (written by an
  earlier release) is searched for every row;
* runs the rule (``_chain.keep_mask``) over its rows in (h1, h2, t, order)
  order: sorted by Spark, or here (``sort_order``: numpy on the digests, Arrow
  for the rows that share one), the rows read in that order, never copied in it;
* writes the keys it recorded (``b=N/keys-<s>.arrow`` and its filter), the rows it holds
  (``b=N/held/part-<s>.parquet``) and the rows it keeps (``part-<s>.parquet``
  in the batch's output folder), each to a temporary name then renamed,
  and returns one row of counts.

Everything a task writes is named by (N, s) and is a function of the previous
batch's state and this batch's rows: a retried or speculative attempt writes
the same files again. Compaction (``compact_task``) and the move of a state of
an earlier layout (``write_bucket``) are tasks of their own.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from oncebus.spark import _chain

H1, H2, T, W = _chain.H1, _chain.H2, _chain.T, _chain.W
BUCKET = "__oncebus_bucket"
NONE = np.iinfo(np.int64).min
KEY_SCHEMA = pa.schema([(H1, pa.int64()), (H2, pa.int64()), (T, pa.int64()), (W, pa.int64())])
STATS_FIELDS = ("bucket", "rows", "late", "recorded", "max_t0", "held", "kept", "max_t", "watermark", "min_held_t")
DECIDE_ALL = 2**62
TaskFn = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


def key_file(folder: str, bucket: int) -> str:
    return f"{folder}/keys-{bucket:05d}.arrow"


def filter_file(key_path: Path) -> Path:
    """The membership filter written beside a key file (``keys-<s>.bits``)."""
    return key_path.with_suffix(".bits")


FILTER_MAGIC = b"OBKF1\0\0\0"
FILTER_BITS_PER_KEY = 16  # at least; rounded up to a power of two bits in all: 3 to 6 % of absent keys pass
_COUNT = np.dtype("<i8")  # the header's key count, little-endian whatever the machine
_HEADER = len(FILTER_MAGIC) + _COUNT.itemsize


def _filter_slots(h1: np.ndarray, bits: int) -> np.ndarray:
    """Each digest's bit in a filter of ``bits`` bits (a power of two): its top bits (digests are uniform)."""
    shift = 65 - bits.bit_length()  # 64 - log2(bits): the arithmetic shift keeps log2(bits) signed top bits
    return (h1 >> np.int64(shift)) + np.int64(bits >> 1)


def build_filter(h1: np.ndarray) -> bytes:
    """A one-hash membership filter of a key file's digests: a key whose bit is clear is not in the file.

    A header (magic, key count) lets a reader refuse a filter that does not belong to the key file beside it."""
    bits = 1 << max(13, int(len(h1) * FILTER_BITS_PER_KEY - 1).bit_length())
    flags = np.zeros(bits, dtype=bool)
    flags[_filter_slots(h1, bits)] = True
    count = np.array(len(h1), dtype=_COUNT).tobytes()
    return bytes(FILTER_MAGIC + count + np.packbits(flags, bitorder="little").tobytes())


def read_filter(key_path: Path, keys: int) -> np.ndarray | None:
    """The packed bits of the filter beside a key file of ``keys`` keys, memory-mapped; None when there is none
    (a state written before filters existed) or it belongs to another key file (a write interrupted between the
    two): then every key is looked up in the file."""
    try:
        data = np.memmap(filter_file(key_path), dtype=np.uint8, mode="r")  # one mapping: header and bits
    except (FileNotFoundError, ValueError):  # none, or empty (mmap refuses an empty file)
        return None
    body = len(data) - _HEADER
    if body <= 0 or body & (body - 1):
        return None
    count = int(data[len(FILTER_MAGIC) : _HEADER].view(_COUNT)[0])
    if bytes(data[: len(FILTER_MAGIC)]) != FILTER_MAGIC or count != keys:
        return None
    bits: np.ndarray = data[_HEADER:]
    return bits


def might_hold(bits: np.ndarray, h1: np.ndarray) -> np.ndarray:
    """Which digests may be in the key file of the filter ``bits`` (packed): no false negatives."""
    slots = _filter_slots(h1, len(bits) * 8)
    held: np.ndarray = ((bits[slots >> 3] >> (slots & 7).astype(np.uint8)) & 1).astype(bool)
    return held


def _partition_id() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        raise RuntimeError("oncebus.spark: a bucket task runs only inside a Spark task")
    return int(context.partitionId())


def _replace(target: Path, write: Callable[[Path], None]) -> None:
    """Write to a hidden temporary name in the target's folder, then rename over the target."""
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.parent / f".{target.name}.{uuid.uuid4().hex}.tmp"
    try:
        write(temporary)
        os.replace(temporary, target)
    finally:
        if temporary.exists():
            temporary.unlink()


def write_keys(path: Path, h1: np.ndarray, h2: np.ndarray, t: np.ndarray, w: np.ndarray) -> None:
    """The key file (sorted by (h1, h2)) and its membership filter beside it."""
    batch = pa.RecordBatch.from_arrays([pa.array(a, pa.int64()) for a in (h1, h2, t, w)], schema=KEY_SCHEMA)

    def write(temporary: Path) -> None:
        with pa.OSFile(str(temporary), "wb") as sink, ipc.new_file(sink, KEY_SCHEMA) as writer:
            writer.write_batch(batch)

    bits = build_filter(np.asarray(h1, dtype=np.int64))

    def write_filter(temporary: Path) -> None:
        temporary.write_bytes(bits)

    _replace(path, write)
    _replace(filter_file(path), write_filter)


def read_keys(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """(h1, h2, t0, w) of a key file, memory-mapped (zero copy), or None when the bucket has none."""
    if not path.exists():
        return None
    reader = ipc.open_file(pa.memory_map(str(path), "r"))
    if reader.num_record_batches == 0:
        return None
    if reader.num_record_batches == 1:
        batch = reader.get_batch(0)
        columns = [batch.column(i) for i in range(4)]
    else:
        table = reader.read_all()
        columns = [table.column(i).combine_chunks() for i in range(4)]
    h1, h2, t, w = (c.to_numpy(zero_copy_only=False) for c in columns)
    return h1, h2, t, w


class Lookup:
    """Prior first-accepted times of keys, from one bucket's key files (each sorted by (h1, h2)).

    Each file's membership filter, where there is one, picks the few rows worth a binary search in it: most
    rows of a batch are new keys, and the rest mostly resends of one recent folder."""

    def __init__(self, root: Path, folders: Sequence[str], bucket: int, *, filters: bool = True) -> None:
        self.files: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]] = []
        for folder in folders:
            path = root / key_file(folder, bucket)
            keys = read_keys(path)
            if keys is not None:
                h1, h2, t, _ = keys
                self.files.append((h1, h2, t, read_filter(path, len(h1)) if filters else None))

    def prior(self, h1: np.ndarray, h2: np.ndarray) -> np.ndarray:
        """The newest recorded t0 of each (h1, h2), NONE where the key was never recorded. Fastest when
        ``h1`` is sorted (one pass of binary searches per file, each starting where the last ended)."""
        out = np.full(len(h1), NONE, dtype=np.int64)
        for a1, a2, at, bits in self.files:
            if bits is None:
                _prior_in(out, None, h1, h2, a1, a2, at)
                continue
            rows = np.flatnonzero(might_hold(bits, h1))
            if len(rows):
                _prior_in(out, rows, h1[rows], h2[rows], a1, a2, at)
        return out


def _prior_in(
    out: np.ndarray,
    rows: np.ndarray | None,
    h1: np.ndarray,
    h2: np.ndarray,
    a1: np.ndarray,
    a2: np.ndarray,
    at: np.ndarray,
) -> None:
    """Raise ``out[rows]`` (all of ``out`` when ``rows`` is None) to the t0 one key file records for each
    (h1, h2) given."""
    n = len(a1)
    left = np.searchsorted(a1, h1, "left")
    inside = left < n
    at_left = np.minimum(left, n - 1)
    hit = inside & (a1[at_left] == h1)
    # the common case: one entry with this h1; else (h1 shared by several keys, or a key recorded
    # twice) all entries with this h1 are looked at
    shared = hit & (left + 1 < n) & (a1[np.minimum(left + 1, n - 1)] == h1)
    simple = np.flatnonzero(hit & ~shared & (a2[at_left] == h2))
    target = simple if rows is None else rows[simple]
    out[target] = np.maximum(out[target], at[at_left[simple]])  # each row once: no ufunc.at needed
    for i in np.flatnonzero(shared).tolist():
        end = int(np.searchsorted(a1, h1[i], "right"))
        span = slice(int(left[i]), end)
        same = at[span][a2[span] == h2[i]]
        if len(same):
            j = i if rows is None else int(rows[i])
            out[j] = max(int(out[j]), int(same.max()))


@dataclass(frozen=True)
class _Part:
    """Rows of a bucket task and the order to decide them in (None: they are in it already)."""

    rows: pa.RecordBatch | pa.Table
    order: np.ndarray | None

    def column(self, name: str) -> np.ndarray:
        values: np.ndarray = self.rows.column(self.rows.schema.names.index(name)).to_numpy(zero_copy_only=False)
        return values if self.order is None else values[self.order]

    def mask(self, decided: np.ndarray) -> pa.Array:
        """A mask over the rows as they are, from one over the rows in order."""
        if self.order is None:
            return pa.array(decided)
        unordered = np.empty(len(decided), dtype=bool)
        unordered[self.order] = decided
        return pa.array(unordered)


def sort_order(table: pa.Table, sort_keys: Sequence[str]) -> np.ndarray:
    """The indices that sort ``table`` by ``sort_keys`` (ascending, nulls first, stable), the first of them
    ``H1``: what ``pyarrow.compute.sort_indices`` answers, found by one numpy sort of the digests and Arrow's
    sort only for the rows whose digest another row shares (resends, mostly: a few percent)."""
    keys = [(k, "ascending", "at_start") for k in sort_keys]
    first = table.column(sort_keys[0])
    if first.null_count:
        everything: np.ndarray = pc.sort_indices(table, sort_keys=keys).to_numpy()
        return everything
    h1 = first.to_numpy()
    order = np.argsort(h1, kind="stable")
    ordered = h1[order]
    tie = np.flatnonzero(ordered[1:] == ordered[:-1])
    if len(tie):
        shared = np.zeros(len(order), dtype=bool)
        shared[tie] = True
        shared[tie + 1] = True
        where = np.flatnonzero(shared)
        rows = order[where]
        within = pc.sort_indices(table.select(list(sort_keys)).take(pa.array(rows)), sort_keys=keys).to_numpy()
        order[where] = rows[within]
    return order


@dataclass(frozen=True)
class BatchTask:
    """What the task of every bucket needs to decide micro-batch ``batch_id`` (pickled to executors)."""

    root: str
    batch_id: int
    buckets: int
    watermark: int  # the lowest watermark (from what earlier batches saw); DECIDE_ALL decides every row
    bound_us: int
    previous_watermark: int | None
    key_folders: tuple[str, ...]
    keys_folder: str
    held_folder: str | None  # None: an ordered input holds nothing
    output_folder: str
    user_columns: tuple[str, ...]
    # rows held by the previous batch in this bucket's file there, merged here (else Spark brought them)
    held_input: str | None = None
    # sort the rows here by these columns (else Spark sorted them)
    sort_keys: tuple[str, ...] = ()
    # decide only these buckets, from their held rows alone (a job over spark.range(buckets)), when Spark
    # ran no task for them (it skips a shuffle of nothing)
    only_buckets: frozenset[int] | None = None

    def _rows(self, batches: Iterator[pa.RecordBatch], bucket: int, root: Path) -> list[_Part]:
        """This bucket's rows (the new ones, and those held before) in parts, each in (H1, H2, T, order) order:
        sorted by Spark, or (``sort_keys``) one part with the order to read it in."""
        parts: list[pa.RecordBatch] = []
        for batch in batches:
            names = batch.schema.names
            if not batch.num_rows or BUCKET not in names:  # no rows, or a bucket number from spark.range
                continue
            b = batch.column(names.index(BUCKET)).to_numpy(zero_copy_only=False)
            if (b != bucket).any():
                raise RuntimeError(
                    f"oncebus.spark: rows of bucket {int(b[b != bucket][0])} reached the task of bucket {bucket}:"
                    " the shuffle must keep repartition(buckets, H1) as it is (no adaptive coalescing)"
                )
            parts.append(batch.select([n for n in names if n != BUCKET]))
        held = root / self.held_input / f"part-{bucket:05d}.parquet" if self.held_input else None
        if held is not None and held.exists():
            table = pq.read_table(held)
            if parts:
                table = table.select(parts[0].schema.names).cast(parts[0].schema)
            parts.extend(table.to_batches())
        if not self.sort_keys or not parts:
            return [_Part(part, None) for part in parts]
        table = pa.Table.from_batches(parts).combine_chunks()
        return [_Part(table, sort_order(table, self.sort_keys))]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        bucket = _partition_id()
        if self.only_buckets is not None and bucket not in self.only_buckets:
            return
        root = Path(self.root)
        carry: _chain._Carry | None = None
        rows = late = held_rows = kept_rows = 0
        min_held: int | None = None
        keys: list[tuple[np.ndarray, ...]] = []
        writers: dict[str, tuple[pq.ParquetWriter, Path, Path]] = {}

        def write(name: str, folder: str, table: pa.RecordBatch | pa.Table) -> None:
            if name not in writers:
                target = Path(folder) / f"part-{bucket:05d}.parquet"
                target.parent.mkdir(parents=True, exist_ok=True)
                temporary = target.parent / f".{target.name}.{uuid.uuid4().hex}.tmp"
                writers[name] = (pq.ParquetWriter(str(temporary), table.schema), temporary, target)
            writers[name][0].write(table)

        # every row this bucket sees is seen before any is decided: each new row is at most the bound older
        # than the newest row seen before it, so rows below (newest here - bound) are safe to decide now,
        # whatever the other buckets hold
        parts = self._rows(batches, bucket, root)
        max_t = max((pc.max(p.rows.column(p.rows.schema.names.index(T))).as_py() for p in parts), default=None)
        columns = [tuple(p.column(c) for c in (H1, H2, T, W)) for p in parts]  # each in (H1, H2, T, order) order
        if parts:  # the prior t0 of every row, in one pass over each key file
            lookup = Lookup(root, self.key_folders, bucket)
            priors = lookup.prior(np.concatenate([c[0] for c in columns]), np.concatenate([c[1] for c in columns]))
            offsets = np.cumsum([0, *(p.rows.num_rows for p in parts)])
        watermark = self.watermark
        if max_t is not None and watermark < DECIDE_ALL:
            watermark = max(watermark, max_t - self.bound_us)
        try:
            for number, (part, (h1, h2, t, w)) in enumerate(zip(parts, columns, strict=True)):
                rows += len(t)
                if self.previous_watermark is not None:
                    late += int((t < self.previous_watermark).sum())
                held = t >= watermark
                keep, carry = _chain.keep_mask(
                    h1,
                    h2,
                    t,
                    w,
                    np.zeros(len(t), dtype=bool),
                    carry,
                    held,
                    prior=priors[offsets[number] : offsets[number + 1]],
                )
                recorded = keep & (w >= 0)
                if recorded.any():
                    keys.append((h1[recorded], h2[recorded], t[recorded], w[recorded]))
                if keep.any():
                    kept_rows += int(keep.sum())
                    write("out", self.output_folder, part.rows.select(list(self.user_columns)).filter(part.mask(keep)))
                if held.any() and self.held_folder is not None:
                    held_rows += int(held.sum())
                    oldest = int(t[held].min())
                    min_held = oldest if min_held is None else min(min_held, oldest)
                    write("held", str(root / self.held_folder), part.rows.filter(part.mask(held)))
            for writer, temporary, target in writers.values():
                writer.close()
                os.replace(temporary, target)
        finally:
            for writer, temporary, _ in writers.values():
                if temporary.exists():
                    writer.close()
                    temporary.unlink()
        recorded_count, max_t0 = 0, NONE
        if keys:
            k1, k2, kt, kw = (np.concatenate(part) for part in zip(*keys, strict=True))
            write_keys(root / key_file(self.keys_folder, bucket), k1, k2, kt, kw)
            recorded_count, max_t0 = len(k1), int(kt.max())
        yield _stats(bucket, rows, late, recorded_count, max_t0, held_rows, kept_rows, max_t, watermark, min_held)


def _stats(
    bucket: int,
    rows: int,
    late: int,
    recorded: int,
    max_t0: int,
    held: int,
    kept: int,
    max_t: int | None = None,
    watermark: int | None = None,
    min_held_t: int | None = None,
) -> pa.RecordBatch:
    values = (
        bucket,
        rows,
        late,
        recorded,
        None if max_t0 == NONE else max_t0,
        held,
        kept,
        max_t,
        watermark,
        min_held_t,
    )
    return pa.RecordBatch.from_arrays([pa.array([v], pa.int64()) for v in values], names=list(STATS_FIELDS))


@dataclass(frozen=True)
class WriteBucket:
    """Write rows sorted by (H1, H2) (columns H1, H2, T, W) as the key file of this task's bucket: moves the
    keys of a state of an earlier layout into buckets (after ``repartition(buckets, H1)``)."""

    root: str
    folder: str

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        bucket = _partition_id()
        parts = [b for b in batches if b.num_rows]
        if parts:
            table = pa.Table.from_batches(parts).select([H1, H2, T, W])
            h1, h2, t, w = (table.column(i).combine_chunks().to_numpy(zero_copy_only=False) for i in range(4))
            write_keys(Path(self.root) / key_file(self.folder, bucket), h1, h2, t, w)
            yield _stats(bucket, 0, 0, len(h1), int(t.max()), 0, 0)


@dataclass(frozen=True)
class CompactBuckets:
    """Merge the key files of ``folders`` into ``folder``, bucket by bucket (input: the bucket numbers,
    from ``spark.range(buckets)``), keeping the keys whose own window has not passed."""

    root: str
    folders: tuple[str, ...]
    folder: str
    watermark: int | None

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        root = Path(self.root)
        for batch in batches:
            for bucket in batch.column(0).to_pylist():
                files = [k for k in (read_keys(root / key_file(f, bucket)) for f in self.folders) if k is not None]
                if not files:
                    continue
                h1, h2, t, w = (np.concatenate(part) for part in zip(*files, strict=True))
                if self.watermark is not None:
                    alive = t + w > self.watermark
                    h1, h2, t, w = h1[alive], h2[alive], t[alive], w[alive]
                if not len(h1):
                    continue
                order = np.lexsort((t, h2, h1))
                h1, h2, t, w = h1[order], h2[order], t[order], w[order]
                last = np.ones(len(h1), dtype=bool)  # only the newest t0 of each key matters
                last[:-1] = (h1[1:] != h1[:-1]) | (h2[1:] != h2[:-1])
                h1, h2, t, w = h1[last], h2[last], t[last], w[last]
                write_keys(root / key_file(self.folder, int(bucket)), h1, h2, t, w)
                yield _stats(int(bucket), 0, 0, len(h1), int(t.max()), 0, 0)
