"""The window advisor: how large must an entity's history window be?

Input: the broker's *send log*, JSON-lines files (``*.json``, ``*.jsonl``)
and/or Parquet files under one folder, one record per send attempt::

    entity, key (DedupKey.text), message_id, time (ISO-8601 UTC),
    time_us (int, microseconds since the epoch), outcome ("new" | "duplicate"
    | "late"), window_us (the entity's window then)

Per entity it reports the duplicate rate, the resend-delay distribution, the
smallest window that would have caught ``share`` of the resends, and a what-if
table over candidate windows.

A *resend* is every send of a key after its first send in the log, whatever
the broker's verdict. Its *delay* is measured from that first send, not from
the previous copy: the window runs from the first accepted send and is not
extended by duplicates, so delay-from-first is what a window must cover. The
recommended window is the smallest whole number of seconds greater than the
``share`` quantile of the delays (``t < t0 + W`` must hold), clamped to the
allowed 20 s .. 7 days. Percentiles use Spark's ``percentile_approx`` with
accuracy 100,000 (rank error at most 0.001 % of the resends).

The what-if table is exact for the logged times: the fixed-window rule is
replayed per key for every candidate window, so a resend after the window
starts a new window that later copies fall into, as in the broker.
*resends missed* are copies that window would have let through. *Keys held*
is estimated as (accepted sends per second over the log's span) x window;
index memory is keys held x 40 bytes (the core index's footprint per key).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from oncebus.core.durations import format_duration, parse_duration, to_micros
from oncebus.core.entities import MAX_DUPLICATE_WINDOW, MIN_DUPLICATE_WINDOW, validate_duplicate_window
from oncebus.core.errors import InvalidArgumentError

LOG_SCHEMA = T.StructType(
    [
        T.StructField("entity", T.StringType()),
        T.StructField("key", T.StringType()),
        T.StructField("message_id", T.StringType()),
        T.StructField("time", T.StringType()),
        T.StructField("time_us", T.LongType()),
        T.StructField("outcome", T.StringType()),
        T.StructField("window_us", T.LongType()),
    ]
)
DEFAULT_CANDIDATES = ("PT20S", "PT1M", "PT2M", "PT5M", "PT10M", "PT30M", "PT1H", "PT6H", "P1D", "P7D")
BYTES_PER_KEY = 40
PERCENTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p99.9", 0.999))
_ACCURACY = 100_000


def read_send_log(spark: SparkSession, log_path: str) -> DataFrame:
    """All send records under ``log_path`` (JSON lines and Parquet, any depth)."""
    parts: list[DataFrame] = []
    for pattern in ("*.json", "*.jsonl"):
        reader = spark.read.schema(LOG_SCHEMA).option("recursiveFileLookup", "true")
        parts.append(reader.option("pathGlobFilter", pattern).json(log_path))
    parquet = spark.read.option("recursiveFileLookup", "true").option("pathGlobFilter", "*.parquet")
    try:
        found = parquet.parquet(log_path)
    except Exception as exc:  # no Parquet files: Spark cannot infer a schema
        if "UNABLE_TO_INFER_SCHEMA" not in str(exc) and "PATH_NOT_FOUND" not in str(exc):
            raise
        if "PATH_NOT_FOUND" in str(exc):
            raise InvalidArgumentError(f"send log {log_path!r} does not exist") from exc
    else:
        parts.append(found.select(*[F.col(f.name).cast(f.dataType) for f in LOG_SCHEMA.fields]))
    log = parts[0]
    for part in parts[1:]:
        log = log.unionByName(part)
    return log


def _candidates(values: Sequence[Any] | None) -> list[timedelta]:
    return [validate_duplicate_window(v) for v in (values or DEFAULT_CANDIDATES)]


def advise(
    spark: SparkSession,
    log_path: str,
    share: float = 0.999,
    candidates: Sequence[timedelta | str] | None = None,
) -> dict[str, Any]:
    """Advice per entity from the send log under ``log_path`` (see the module docstring)."""
    if not 0 < share <= 1:
        raise InvalidArgumentError(f"share must be in (0, 1], not {share!r}")
    windows = _candidates(candidates)
    log = read_send_log(spark, log_path)
    t_us = F.coalesce(F.col("time_us"), F.unix_micros(F.to_timestamp("time")))
    sends = log.select("entity", "key", "outcome", "window_us", t_us.alias("t")).where(
        F.col("entity").isNotNull() & F.col("key").isNotNull() & F.col("t").isNotNull()
    )
    per_key = Window.partitionBy("entity", "key")
    ordered = per_key.orderBy("t")
    with_delay = sends.select(
        "*",
        F.row_number().over(ordered).alias("copy"),
        (F.col("t") - F.min("t").over(per_key)).alias("delay"),
    ).cache()
    try:
        summary = _summaries(with_delay, share)
        what_if = _what_if(with_delay, windows, summary)
    finally:
        with_delay.unpersist()
    entities: dict[str, Any] = {}
    for entity, row in sorted(summary.items()):
        entities[entity] = {**row, "what_if": what_if.get(entity, [])}
    return {
        "log_path": log_path,
        "share": share,
        "candidates": [format_duration(w) for w in windows],
        "bytes_per_key": BYTES_PER_KEY,
        "entities": entities,
    }


def _summaries(with_delay: DataFrame, share: float) -> dict[str, dict[str, Any]]:
    resend = F.col("copy") > 1
    quantiles = [q for _, q in PERCENTILES] + [share]
    rows = (
        with_delay.groupBy("entity")
        .agg(
            F.count(F.lit(1)).alias("sends"),
            F.sum((F.col("outcome") == "duplicate").cast("long")).alias("duplicates"),
            F.sum((F.col("outcome") == "late").cast("long")).alias("late"),
            F.sum((F.col("copy") == 1).cast("long")).alias("keys"),
            F.sum(resend.cast("long")).alias("resends"),
            F.percentile_approx(F.when(resend, F.col("delay")), quantiles, _ACCURACY).alias("q"),
            F.max(F.when(resend, F.col("delay"))).alias("max_delay"),
            F.min("t").alias("first_t"),
            F.max("t").alias("last_t"),
            F.max_by("window_us", "t").alias("window_us"),
        )
        .collect()
    )
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        sends, resends = int(row["sends"]), int(row["resends"] or 0)
        q = row["q"] or []
        delays = {name: _seconds(q[i]) if q else None for i, (name, _) in enumerate(PERCENTILES)}
        delays["max"] = _seconds(row["max_delay"])
        needed_us = int(q[-1]) + 1 if q else to_micros(MIN_DUPLICATE_WINDOW)
        recommended_s = math.ceil(needed_us / 1_000_000)
        clamped = max(MIN_DUPLICATE_WINDOW, min(MAX_DUPLICATE_WINDOW, timedelta(seconds=recommended_s)))
        span_s = max((int(row["last_t"]) - int(row["first_t"])) / 1_000_000, 1e-6)
        out[row["entity"]] = {
            "sends": sends,
            "keys": int(row["keys"]),
            "duplicates": int(row["duplicates"] or 0),
            "late": int(row["late"] or 0),
            "duplicate_rate": (int(row["duplicates"] or 0) / sends) if sends else 0.0,
            "resends": resends,
            "resend_delay_s": delays,
            "span_s": span_s,
            "current_window": format_duration(timedelta(microseconds=row["window_us"]))
            if row["window_us"] is not None
            else None,
            "recommended_window": format_duration(clamped),
            "recommended_window_s": clamped.total_seconds(),
            "recommended_clamped": clamped != timedelta(seconds=recommended_s),
        }
    return out


def _what_if(
    with_delay: DataFrame, windows: list[timedelta], summary: dict[str, dict[str, Any]]
) -> dict[str, list[dict[str, Any]]]:
    extra = {parse_duration(s["recommended_window"]) for s in summary.values()}
    extra |= {parse_duration(s["current_window"]) for s in summary.values() if s["current_window"]}
    every = sorted(set(windows) | extra)
    window_us = F.array(*[F.lit(to_micros(w)).cast("long") for w in every])
    repeated = with_delay.groupBy("entity", "key").agg(F.array_sort(F.collect_list("t")).alias("times"))
    repeated = repeated.where(F.size("times") > 1)
    init = F.struct(F.lit(None).cast("long").alias("t0"), F.lit(0).cast("long").alias("kept"))

    def kept_under(w: Any) -> Any:
        def step(acc: Any, t: Any) -> Any:
            new = acc["t0"].isNull() | (t >= acc["t0"] + w)
            return F.when(new, F.struct(t.alias("t0"), (acc["kept"] + 1).alias("kept"))).otherwise(acc)

        return F.aggregate("times", init, step)["kept"] - 1

    missed = repeated.select("entity", F.transform(window_us, kept_under).alias("missed"))
    totals = (
        missed.groupBy("entity").agg(*[F.sum(F.col("missed")[i]).alias(f"m{i}") for i in range(len(every))]).collect()
    )
    by_entity = {row["entity"]: row for row in totals}
    out: dict[str, list[dict[str, Any]]] = {}
    for entity, s in summary.items():
        row = by_entity.get(entity)
        table = []
        for i, w in enumerate(every):
            resends_missed = int(row[f"m{i}"] or 0) if row is not None else 0
            accepted = s["keys"] + resends_missed
            keys_held = round(accepted / s["span_s"] * w.total_seconds()) if s["span_s"] > 0 else accepted
            table.append(
                {
                    "window": format_duration(w),
                    "window_s": w.total_seconds(),
                    "resends_missed": resends_missed,
                    "missed_share": resends_missed / s["resends"] if s["resends"] else 0.0,
                    "keys_held": keys_held,
                    "index_bytes": keys_held * BYTES_PER_KEY,
                }
            )
        out[entity] = table
    return out


def _seconds(us: Any) -> float | None:
    return None if us is None else int(us) / 1_000_000


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def format_advice(advice: dict[str, Any]) -> str:
    """The advice as a printable table."""
    lines = [f"send log: {advice['log_path']}    share of resends to catch: {advice['share']:.3%}", ""]
    header = (
        f"{'entity':<20} {'sends':>10} {'dup rate':>9} {'late':>7} {'p50':>9} {'p99':>9} {'p99.9':>9} "
        f"{'max':>9} {'current':>10} {'recommended':>12}"
    )
    lines += [header, "-" * len(header)]
    for entity, s in advice["entities"].items():
        d = s["resend_delay_s"]

        def sec(v: float | None) -> str:
            return "-" if v is None else f"{v:.3f}s"

        lines.append(
            f"{entity:<20} {s['sends']:>10} {s['duplicate_rate']:>9.3%} {s['late']:>7} {sec(d['p50']):>9} "
            f"{sec(d['p99']):>9} {sec(d['p99.9']):>9} {sec(d['max']):>9} {s['current_window'] or '-':>10} "
            f"{s['recommended_window'] + ('*' if s['recommended_clamped'] else ''):>12}"
        )
    if any(s["recommended_clamped"] for s in advice["entities"].values()):
        lines.append("* clamped to the allowed range, 20 s (PT20S) to 7 days (P7D)")
    for entity, s in advice["entities"].items():
        lines += ["", f"what if, {entity} ({s['resends']} resends):"]
        head = f"  {'window':>10} {'resends missed':>15} {'missed':>9} {'keys held':>12} {'index memory':>13}"
        lines += [head, "  " + "-" * (len(head) - 2)]
        for row in s["what_if"]:
            mark = " <- recommended" if row["window"] == s["recommended_window"] else ""
            mark += " <- current" if row["window"] == s["current_window"] else ""
            lines.append(
                f"  {row['window']:>10} {row['resends_missed']:>15} {row['missed_share']:>9.3%} "
                f"{row['keys_held']:>12} {_bytes(row['index_bytes']):>13}{mark}"
            )
    return "\n".join(lines)


def write_advice(advice: dict[str, Any], out_dir: str | os.PathLike[str]) -> str:
    """Write ``advice.json`` and ``advice.png`` (what-if chart) into ``out_dir``; return the printable table."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "advice.json").write_text(json.dumps(advice, indent=2) + "\n")
    _chart(advice, out / "advice.png")
    return format_advice(advice)


def _chart(advice: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    entities = list(advice["entities"].items()) or [("(no sends)", {"what_if": [], "recommended_window_s": None})]
    figure, axes = plt.subplots(len(entities), 1, figsize=(8, 3.2 * len(entities)), squeeze=False)
    for (entity, s), ax in zip(entities, axes[:, 0], strict=True):
        rows = s["what_if"]
        x = [r["window_s"] for r in rows]
        ax.plot(x, [100 * r["missed_share"] for r in rows], marker="o", color="tab:red", label="resends missed (%)")
        ax.set_xscale("log")
        ax.set_xlabel("history window (s)")
        ax.set_ylabel("resends missed (%)", color="tab:red")
        memory = ax.twinx()
        memory.plot(x, [r["index_bytes"] / 2**20 for r in rows], marker="s", color="tab:blue", label="index MiB")
        memory.set_ylabel("index memory (MiB)", color="tab:blue")
        if s.get("recommended_window_s"):
            ax.axvline(s["recommended_window_s"], color="tab:green", linestyle="--")
            ax.annotate(
                f"recommended {s.get('recommended_window')}",
                (s["recommended_window_s"], 0.95),
                xycoords=("data", "axes fraction"),
                color="tab:green",
                fontsize=8,
            )
        ax.set_title(f"{entity}: what if the window were ...")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> int:
    """``oncebus advise LOG``: print the table, write advice.json and advice.png."""
    parser = argparse.ArgumentParser(prog="oncebus advise", description="Advise a duplicate-detection window.")
    parser.add_argument("log", help="folder of the broker's send log (JSON lines and/or Parquet)")
    parser.add_argument("--share", type=float, default=0.999, help="share of resends to catch (default 0.999)")
    parser.add_argument(
        "--candidates", default=None, help="comma-separated ISO-8601 windows for the what-if table (e.g. PT1M,PT10M)"
    )
    parser.add_argument("--out", default="advice", help="folder for advice.json and advice.png (default ./advice)")
    parser.add_argument("--master", default=None, help="Spark master URL (default: spark-submit's, else local[*])")
    args = parser.parse_args(argv)
    candidates = [c.strip() for c in args.candidates.split(",") if c.strip()] if args.candidates else None
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = SparkSession.getActiveSession()
    owned = spark is None
    if spark is None:
        builder = SparkSession.builder.appName("oncebus advise").config("spark.ui.showConsoleProgress", "false")
        if args.master or "--master" not in os.environ.get("PYSPARK_SUBMIT_ARGS", ""):
            builder = builder.master(args.master or os.environ.get("SPARK_MASTER", "local[*]"))
        spark = builder.getOrCreate()
    try:
        advice = advise(spark, args.log, share=args.share, candidates=candidates)
        print(write_advice(advice, args.out))
        print(f"\nwrote {Path(args.out) / 'advice.json'} and {Path(args.out) / 'advice.png'}")
    except InvalidArgumentError as exc:
        print(f"oncebus advise: {exc}", file=sys.stderr)
        return 2
    finally:
        if owned:
            spark.stop()
    return 0
