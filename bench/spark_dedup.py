"""Exact duplicate detection in Spark against Spark's approximate built-in and the core, one run.

    python bench/spark_dedup.py                    # 2,000,000 rows in 250,000-row batches, 200,000 in 10,000-row ones
    python bench/spark_dedup.py --rows 1000000 --small-rows 100000
    python bench/spark_dedup.py --held-30m         # streaming with ~30 million keys held (several minutes)
    python bench/spark_dedup.py --ours-only --small-rows 0   # exact streaming and exact batch only, 250k batches

Ratio mode, on the same trace (out of order within 2 s; two entities: "orders"
20 s window, "mytopic" 60 s window and partitioned):

* exact streaming (``deduplicate_stream``), the trace as Parquet files read one
  file per micro-batch, kept rows written as Parquet;
* Spark's approximate ``dropDuplicatesWithinWatermark`` (``deduplicate(...,
  mode="approximate")``, one 60 s window for every entity), same files, same sink,
  on the default (HDFS-backed) state store and on the RocksDB provider;
* exact batch (``deduplicate``) over the same files, kept rows written as Parquet;
* the core, ``oncebus.core.DuplicateDetector``, in pure Python on one core, fed
  the rows in (time, seq) order (validation, key and verdict per row; the sort
  is not timed).

The held-30m mode streams ``rate-micro-batch`` rows at 50,000 sends/s of event
time (3 % resends, a tenth of them after the window) through a 10-minute window,
so about 30 million keys are held; after the state is full it reports rows/s
and the latency of each measured batch. Benchmarks never assert on time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

# the one reference (the core's verdicts) and the trace generator live with the tests; a clone has both
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from tests.spark.reference import core_survivors
from tests.spark.traces import DEFAULT_ENTITIES, generate_trace, write_parts

from oncebus.spark import EntitySettings, deduplicate, deduplicate_stream, flush_stream

SETTINGS = {
    e.name: EntitySettings(window=timedelta(microseconds=e.window_us), partitioned=e.partitioned)
    for e in DEFAULT_ENTITIES
}
BOUND = timedelta(seconds=2)
SETTINGS_OPTIONS: dict[str, Any] = {"entity_col": "entity", "entity_settings": SETTINGS, "order_col": "seq"}


def session(memory: str) -> SparkSession:
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("oncebus bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.memory", memory)
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def manifests(state: Path) -> list[dict[str, Any]]:
    folder = state / "batches"
    if not folder.exists():
        return []
    return [json.loads((folder / n).read_text()) for n in sorted(os.listdir(folder)) if n.endswith(".json")]


ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
PROVIDER = "spark.sql.streaming.stateStore.providerClass"


def ratio_mode(args: argparse.Namespace) -> None:
    spark = session("4g")
    work = Path(tempfile.mkdtemp(prefix="oncebus-bench-"))
    builtin = not args.ours_only
    try:
        print(f"load before: {os.getloadavg()[0]:.1f} (1-min load average, {os.cpu_count()} CPUs)")
        summary = [
            scenario(spark, work / "large", args.rows, args.batch_rows_large, args.rate, core=True, builtin=builtin),
        ]
        if args.small_rows:
            summary.append(
                scenario(
                    spark,
                    work / "small",
                    args.small_rows,
                    args.batch_rows_small,
                    args.rate,
                    core=False,
                    builtin=builtin,
                )
            )
        print("\n== goals ==")
        for line in summary:
            print(line)
        print(f"load after: {os.getloadavg()[0]:.1f}")
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


def _since(iso: str, wall: float) -> float:
    """Seconds from the wall-clock time ``wall`` to a progress report's ISO timestamp (UTC)."""
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() - wall


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def scenario(
    spark: SparkSession, work: Path, rows: int, batch_rows: int, rate: float, *, core: bool, builtin: bool = True
) -> str:
    """The ways on one trace read ``batch_rows`` rows per micro-batch (one file each); returns the goals' line."""
    trace = generate_trace(rows, rate=rate, max_out_of_order_us=2_000_000, seed=3)
    source = work / "in"
    source.mkdir(parents=True)
    files = -(-len(trace) // batch_rows)
    write_parts(trace, source, batch_rows)  # read in order by the file stream source
    rows = len(trace)
    print(f"\n== {rows:,} rows, {files} micro-batches of {batch_rows:,} rows ==")
    print(f"trace: rate {rate:,.0f}/s of event time, out of order < 2 s; load {os.getloadavg()[0]:.1f}")
    schema = spark.read.parquet(str(source)).schema
    deduplicate(  # warm the Python workers and the JIT on a small slice, untimed
        spark.read.parquet(str(source)).limit(10_000), entity_col="entity", entity_settings=SETTINGS, order_col="seq"
    ).write.format("noop").mode("overwrite").save()

    def stream_source(folder: Path = source) -> DataFrame:
        return spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(folder))

    def approximate(folder: Path, out: Path, provider: str) -> tuple[float, list[Any]]:
        spark.conf.set(PROVIDER, provider)  # read when the query starts
        try:
            started = time.perf_counter()
            query = (
                deduplicate(stream_source(folder), "PT1M", mode="approximate", entity_col="entity")
                .writeStream.format("parquet")
                .option("path", str(out))
                .option("checkpointLocation", str(out) + "-cp")
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            return time.perf_counter() - started, query.recentProgress
        finally:
            spark.conf.unset(PROVIDER)

    # warm every streaming way (JIT, Python workers, RocksDB's native library) on one file, untimed
    warm = work / "warm-in"
    warm.mkdir()
    shutil.copy(source / "part-00000.parquet", warm / "part-00000.parquet")
    warm_options = {**SETTINGS_OPTIONS, "state_path": str(work / "warm-state"), "output_path": str(work / "warm")}
    deduplicate_stream(
        stream_source(warm), max_out_of_order=BOUND, trigger={"availableNow": True}, **warm_options
    ).awaitTermination()
    for provider in (HDFS, ROCKSDB) if builtin else ():
        approximate(warm, work / f"warm-approx-{provider[-25:]}", provider)

    results: list[tuple[str, float, set[int], list[float]]] = []

    def kept(folder: Path) -> set[int]:
        return {r[0] for r in spark.read.parquet(str(folder)).select("seq").collect()}

    # exact streaming (ours); flush_stream decides what the last batch still held
    options: dict[str, Any] = {**SETTINGS_OPTIONS, "state_path": str(work / "state"), "output_path": str(work / "s")}
    started, started_wall = time.perf_counter(), time.time()
    query = deduplicate_stream(stream_source(), max_out_of_order=BOUND, trigger={"availableNow": True}, **options)
    query.awaitTermination()
    ended = time.perf_counter()
    progress = query.recentProgress
    flush_stream(stream_source(), **options)
    seconds = time.perf_counter() - started
    first = min((p for p in progress), key=lambda p: p["batchId"], default=None)
    startup = _since(first["timestamp"], started_wall) if first else float("nan")
    print(
        f"exact streaming: {seconds:.2f} s in all: query start to its first batch {startup:.2f} s, "
        f"flush_stream {seconds - (ended - started):.2f} s, {len(progress)} progress reports"
    )
    latency = [p["durationMs"]["triggerExecution"] / 1000 for p in progress if p["numInputRows"]]
    results.append(("exact streaming (ours)", seconds, kept(work / "s"), latency))
    profile(progress, manifests(work / "state"))

    for label, provider in (("HDFS", HDFS), ("RocksDB", ROCKSDB)) if builtin else ():
        seconds, progress = approximate(source, work / f"a-{label}", provider)
        latency = [p["durationMs"]["triggerExecution"] / 1000 for p in progress if p["numInputRows"]]
        results.append(
            (f"built-in dropDuplicatesWithinWatermark, {label}", seconds, kept(work / f"a-{label}"), latency)
        )

    started = time.perf_counter()
    deduplicate(
        spark.read.parquet(str(source)), entity_col="entity", entity_settings=SETTINGS, order_col="seq"
    ).write.mode("overwrite").parquet(str(work / "b"))
    results.append(("exact batch (ours)", time.perf_counter() - started, kept(work / "b"), []))

    t_us = trace["enqueued_time"].cast(pa.int64()).to_numpy()
    seq = trace["seq"].to_numpy()
    order = np.lexsort((seq, t_us)).tolist()
    cols = [trace[c].to_pylist() for c in ("entity", "message_id", "partition_key", "session_id")]
    feed = [(cols[0][i], cols[1][i], cols[2][i], cols[3][i], int(t_us[i]), int(seq[i])) for i in order]
    started = time.perf_counter()
    truth = set(core_survivors(feed, EntitySettings(), SETTINGS))
    if core:
        results.append(("core DuplicateDetector, 1 core", time.perf_counter() - started, truth, []))

    print(f"\n{'way':<48} {'seconds':>8} {'rows/s':>10} {'median batch s':>14} {'kept':>9}  exact?")
    for name, secs, survivors, latency in results:
        differ = len(survivors ^ truth)
        verdict = "yes" if not differ else f"no: {differ:,} rows differ"
        print(
            f"{name:<48} {secs:>8.2f} {rows / secs:>10,.0f} {_median(latency):>14.2f} {len(survivors):>9,}  {verdict}"
        )
    stream, batch = results[0], next(r for r in results if r[0].startswith("exact batch"))
    if not builtin:
        line = f"{batch_rows:>7,}-row batches: exact streaming / exact batch {batch[1] / stream[1]:.2f}"
        print(line)
        return line
    hdfs, rocks = results[1], results[2]
    lines = [
        f"{batch_rows:>7,}-row batches: exact streaming / built-in (HDFS) by throughput {hdfs[1] / stream[1]:.2f}, "
        f"by median latency {_median(hdfs[3]) / _median(stream[3]):.2f}; / built-in (RocksDB) by throughput "
        f"{rocks[1] / stream[1]:.2f}, by median latency {_median(rocks[3]) / _median(stream[3]):.2f}; "
        f"exact streaming / exact batch {batch[1] / stream[1]:.2f}"
    ]
    print(lines[0])
    return lines[0]


def profile(progress: list[Any], done: list[dict[str, Any]]) -> None:
    """Where a micro-batch's seconds go (medians over the batches with rows): Spark's driver-side phases
    (durationMs) and, inside addBatch, the engine's own phases (the manifest's seconds; "decide" is the one
    Spark job whose tasks run on the executors, the rest is the driver)."""
    busy = [p for p in progress if p["numInputRows"]]
    if not busy:
        return
    spark_phases = {k: _median([p["durationMs"].get(k, 0) / 1000 for p in busy]) for k in busy[0]["durationMs"]}
    ours = [m["seconds"] for m in done if m["counts"]["batch_rows"]]
    engine_phases = {k: _median([s.get(k, 0.0) for s in ours]) for k in (ours[0] if ours else {})}
    print(
        "profile of one micro-batch (medians, s): spark " + ", ".join(f"{k} {v:.2f}" for k, v in spark_phases.items())
    )
    print("  engine (inside addBatch): " + ", ".join(f"{k} {v:.2f}" for k, v in engine_phases.items()))


def held_mode(args: argparse.Namespace) -> None:
    spark = session("8g")
    work = Path(tempfile.mkdtemp(prefix="oncebus-bench-held-"))
    rate, batch_rows = 50_000, args.batch_rows
    window = timedelta(minutes=10)
    try:
        source = (
            spark.readStream.format("rate-micro-batch")
            .option("rowsPerBatch", batch_rows)
            .option("numPartitions", 2)
            .option("advanceMillisPerBatch", int(batch_rows / rate * 1000))
            .load()
        )
        v = F.col("value")

        def uniform(salt: int) -> Any:
            return F.pmod(F.xxhash64(v, F.lit(salt)), F.lit(1_000_000))

        back = F.when(
            uniform(2) < 100_000,  # a tenth of the resends come after the window
            F.lit(window.total_seconds() * rate) + F.pmod(F.xxhash64(v, F.lit(4)), F.lit(10_000_000)),
        ).otherwise(F.pmod(F.xxhash64(v, F.lit(5)), F.lit(30 * rate)))
        first = F.when((uniform(1) < 30_000) & (v - back >= 0), v - back).otherwise(v)
        event_us = (
            F.lit(1_795_000_000_000_000) + v * (1_000_000 // rate) - F.pmod(F.xxhash64(v, F.lit(3)), F.lit(2_000_000))
        )
        sends = source.select(
            F.concat(F.lit("m"), first.cast("long").cast("string")).alias("message_id"),
            F.timestamp_micros(event_us.cast("long")).alias("enqueued_time"),
            v.alias("seq"),
            F.concat(F.lit("body-"), v.cast("string")).alias("body"),
        )

        def sink(df: DataFrame, batch_id: int) -> None:
            df.write.format("noop").mode("overwrite").save()

        query = deduplicate_stream(
            sends,
            window,
            state_path=str(work / "state"),
            foreach_batch=sink,
            max_out_of_order=BOUND,
            order_col="seq",
            trigger={"processingTime": "0 seconds"},
        )
        print(f"{batch_rows:,} rows per micro-batch = {batch_rows / rate:.0f} s of sends at {rate:,}/s; window 10 min")
        print(f"{'batch':>5} {'keys held':>12} {'seconds':>8} {'rows/s':>9}  phases")
        measured: list[dict[str, Any]] = []
        shown = 0
        while len(measured) < args.measure_batches:
            time.sleep(1)
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
            done = manifests(work / "state")
            for m in done[shown:]:
                total = m["seconds"]["total"]
                full = m["keys_held"] >= args.target_keys
                print(
                    f"{m['batch_id']:>5} {m['keys_held']:>12,} {total:>8.2f} {batch_rows / total:>9,.0f}  "
                    f"{m['seconds']}{'  (measured)' if full else ''}",
                    flush=True,
                )
                if full:
                    measured.append(m)
            shown = len(done)
        # Spark's own clock per batch (offsets, our foreachBatch, commit); the manifest's "total" is ours only
        progress = {p["batchId"]: p["durationMs"]["triggerExecution"] / 1000 for p in query.recentProgress}
        query.stop()
        latency = [progress.get(m["batch_id"], m["seconds"]["total"]) for m in measured]
        rows = batch_rows * len(measured)
        keys = statistics.mean(m["keys_held"] for m in measured)
        print(
            f"\nexact streaming with {keys / 1e6:.1f} M keys held: {rows / sum(latency):,.0f} rows/s "
            f"over {len(measured)} batches of {batch_rows:,} rows; batch latency (Spark triggerExecution) "
            f"median {statistics.median(latency):.2f} s, max {max(latency):.2f} s"
        )
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--batch-rows-large", type=int, default=250_000, help="rows per micro-batch, first run")
    parser.add_argument("--small-rows", type=int, default=200_000, help="rows of the small-batch run")
    parser.add_argument("--batch-rows-small", type=int, default=10_000, help="rows per micro-batch, second run")
    parser.add_argument("--rate", type=float, default=20_000.0, help="sends per second of event time in the trace")
    parser.add_argument(
        "--ours-only", action="store_true", help="exact streaming and exact batch only (no built-in), for profiling"
    )
    parser.add_argument("--held-30m", action="store_true", help="streaming with about 30 million keys held")
    parser.add_argument("--batch-rows", type=int, default=2_000_000, help="rows per micro-batch (held-30m mode)")
    parser.add_argument("--target-keys", type=int, default=28_000_000, help="keys held before measuring")
    parser.add_argument("--measure-batches", type=int, default=5)
    args = parser.parse_args()
    if args.held_30m:
        held_mode(args)
    else:
        ratio_mode(args)


if __name__ == "__main__":
    main()
