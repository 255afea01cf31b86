"""The history as Spark tables the aggregations start from: samples, runs, and per-kind rows.

Every row written in one interval carries the same `ts`, and the broker row of that interval
says which run of the broker wrote it (`started`). Joining each row to its sample gives it:

- `run`: counters (messages in and out, messages delivered to a consumer) and connection numbers
  start again when the broker restarts, so every key includes the run;
- `sample_prev`: the sample just before, so that a stretch of time seen in consecutive samples
  (a pause, a hold) can be told from two separate ones;
- `gap_before` / `gap_after`: ms to the samples before and after, to place a stretch's unseen
  start or end half-way. Across a gap longer than GAP_FACTOR intervals (the broker was stopped,
  or history is missing) one interval is assumed instead: whatever was going on ended with the
  broker, about then. Null at the ends of the range: a stretch seen in the last sample is still
  going;
- `run_first` / `run_fresh`: whether the run's counters started inside the analysed range, so a
  total counts what happened in the range and nothing from before it.

The analysis modules import PySpark at the top; the command imports them only once it runs, so
the rest of the command line never loads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from sluiceway.analysis.errors import HistoryNotFound
from sluiceway.analysis.results import Timeline, float_of, int_of

GAP_FACTOR: Final = 1.5  # a gap between samples longer than this many intervals is a break


class Cache:
    """The tables the job reads more than once, kept by Spark (memory, spilling to disk) until
    `release`, so a session that outlives one analysis does not keep them."""

    def __init__(self) -> None:
        self._kept: list[DataFrame] = []

    def keep(self, table: DataFrame) -> DataFrame:
        self._kept.append(table.cache())
        return table

    def release(self) -> None:
        for table in reversed(self._kept):
            table.unpersist()
        self._kept.clear()


@dataclass(frozen=True, slots=True)
class Prepared:
    """Rows by kind, each with its sample's run and neighbours (see the module docstring)."""

    samples: DataFrame  # ts, run, sample_prev, gap_before, gap_after, run_first, run_fresh
    destinations: DataFrame
    consumers: DataFrame
    readers: DataFrame  # pipeline readers: a topic's cursor groups, a queue's lease groups
    held: DataFrame
    timeline: Timeline
    range_start: int | None  # --since: stretches that began earlier are counted from here

    @property
    def interval_ms(self) -> float:
        return self.timeline.interval_s * 1000


def prepare(rows: DataFrame, where: str, range_start: int | None, cache: Cache) -> Prepared:
    """Split `rows` by kind and attach each row's sample; `where` names the history in errors."""
    broker = (
        rows.where(F.col("kind") == "broker")
        .select("ts", F.coalesce(F.col("started"), F.lit(0)).alias("run"))
        .dropDuplicates(["ts"])
    )
    # One row per sample, so a window over all of them (one partition) stays small: a day at
    # the default 10 s interval is 8,640 rows.
    in_order = Window.orderBy("ts")
    samples = cache.keep(
        broker.select(
            "ts",
            "run",
            F.lag("ts").over(in_order).alias("sample_prev"),
            F.lead("ts").over(in_order).alias("sample_next"),
        )
    )
    timeline = _timeline(samples, where)
    interval_ms = timeline.interval_s * 1000
    fresh_within = 2 * interval_ms + 1000
    runs = samples.groupBy("run").agg(F.min("ts").alias("run_first"))
    samples = cache.keep(
        samples.join(runs, "run")
        .withColumn(
            "run_fresh", (F.col("run") > 0) & (F.col("run_first") - F.col("run") <= fresh_within)
        )
        .withColumn("gap_before", _gap(F.col("ts") - F.col("sample_prev"), interval_ms))
        .withColumn("gap_after", _gap(F.col("sample_next") - F.col("ts"), interval_ms))
        .drop("sample_next")
    )
    return Prepared(
        samples=samples,
        destinations=_attach(rows, "destination", samples),
        consumers=_attach(rows, "consumer", samples),
        readers=_attach(rows, "reader", samples),
        held=_attach(rows, "held_producer", samples),
        timeline=timeline,
        range_start=range_start,
    )


def _gap(gap: Column, interval_ms: float) -> Column:
    return F.when(gap > GAP_FACTOR * interval_ms, F.lit(interval_ms)).otherwise(gap)


def _timeline(samples: DataFrame, where: str) -> Timeline:
    row = samples.agg(
        F.count("ts").alias("samples"),
        F.min("ts").alias("first_ms"),
        F.max("ts").alias("last_ms"),
        F.countDistinct("run").alias("runs"),
        F.percentile_approx(F.col("sample_next") - F.col("ts"), 0.5).alias("interval_ms"),
    ).first()
    if row is None or int_of(row, "samples") == 0:
        raise HistoryNotFound(f"no samples in the time range asked for in {where}")
    interval_ms = float_of(row, "interval_ms") if row["interval_ms"] is not None else 1000.0
    return Timeline(
        first_ms=int_of(row, "first_ms"),
        last_ms=int_of(row, "last_ms"),
        samples=int_of(row, "samples"),
        interval_s=interval_ms / 1000,
        runs=int_of(row, "runs"),
    )


def clip_start(start: Column, range_start: int | None) -> Column:
    """A stretch's start, not before the range analysed."""
    return start if range_start is None else F.greatest(start, F.lit(range_start))


def _attach(rows: DataFrame, kind: str, samples: DataFrame) -> DataFrame:
    return rows.where(F.col("kind") == kind).join(F.broadcast(samples), "ts")


def increments(keys: list[str], column: str) -> Column:
    """How much `column`, a counter, grew since the key's previous sample.

    A key's first sample counts its whole value when the key began inside the range (it first
    appears after its run's first sample, or the run itself started inside the range), and
    nothing otherwise. A counter that went down was reset (a destination destroyed and created
    again, a subscription id reused): its new value is what it counted since.
    """
    in_order = Window.partitionBy(*keys).orderBy("ts")
    previous = F.lag(column).over(in_order)
    first_seen = F.min("ts").over(Window.partitionBy(*keys))
    fresh = (first_seen > F.col("run_first")) | F.col("run_fresh")
    value = F.col(column)
    return (
        F.when(previous.isNull(), F.when(fresh, value).otherwise(F.lit(0)))
        .when(value >= previous, value - previous)
        .otherwise(value)
    )


def seconds_since_previous(keys: list[str]) -> Column:
    """Seconds since the key's previous sample; null on its first."""
    in_order = Window.partitionBy(*keys).orderBy("ts")
    return (F.col("ts") - F.lag("ts").over(in_order)) / 1000.0


def queue_type(path: Column) -> Column:
    """queue or topic, from a destination path (/queue/NAME, /topic/NAME)."""
    return F.when(path.startswith("/queue/"), F.lit("queue")).otherwise(F.lit("topic"))
