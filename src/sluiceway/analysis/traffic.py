"""Per destination: messages in and out per second, and the backlog, over time and in total.

Rates come from the counters (messages in and out since the destination was created), as the
growth between two samples divided by the time between them, rather than from the broker's own
5-second rates: every message is counted once whatever the sampling interval. A series is cut
into at most MAX_POINTS time buckets so that a day of history still plots as a readable line and
the driver receives a bounded number of rows.

Deadline misses (messages expired before delivery, and acknowledged after their deadline) are
counters too, added up the same way. The load is also cut into SLICES equal periods, for the
rule that sees whether the window the load calls for changed over the range.
"""

from __future__ import annotations

import math
from typing import Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from sluiceway.analysis.frames import Prepared, increments, seconds_since_previous
from sluiceway.analysis.results import (
    DestinationStats,
    LoadSlice,
    RowLike,
    SeriesPoint,
    float_of,
    int_of,
    opt_float_of,
    str_of,
)

MAX_POINTS: Final = 360  # time buckets per plotted destination
# Equal periods the range is cut into to see whether the load, and the window it calls for,
# changed over it (rules: shifting-load).
SLICES: Final = 6
KEY: Final = ["run", "destination"]


def per_sample(prepared: Prepared) -> DataFrame:
    """Destination rows with `in_inc`/`out_inc` (messages since the previous sample), `dt`, and
    the deadline misses since the previous sample, `expired_inc`/`late_inc` (null in history
    written before they were recorded)."""
    return (
        prepared.destinations.withColumn("in_inc", increments(KEY, "msgs_in"))
        .withColumn("out_inc", increments(KEY, "msgs_out"))
        .withColumn("expired_inc", increments(KEY, "expired"))
        .withColumn("late_inc", increments(KEY, "consumed_late"))
        .withColumn("dt", seconds_since_previous(KEY))
    )


def _rated(column: str) -> Column:
    """The increment where a rate can be measured (not on a destination's first sample)."""
    return F.when(F.col("dt").isNotNull(), F.col(column))


def _ratio(numerator: Column, denominator: Column) -> Column:
    return F.when(denominator > 0, numerator / denominator)


def stats(samples: DataFrame, extras: list[DataFrame]) -> DataFrame:
    """One row per destination; `extras` are per-destination tables joined on `destination`
    (stranded time, paused time, held time), their missing values counted as 0."""
    seconds = F.sum("dt")
    table = samples.groupBy("destination").agg(
        F.max_by("type", "ts").alias("type"),
        F.sum("in_inc").alias("msgs_in"),
        F.sum("out_inc").alias("msgs_out"),
        F.coalesce(_ratio(F.sum(_rated("in_inc")), seconds), F.lit(0.0)).alias("mean_in_rate"),
        F.coalesce(_ratio(F.sum(_rated("out_inc")), seconds), F.lit(0.0)).alias("mean_out_rate"),
        F.coalesce(F.max(_ratio(F.col("in_inc"), F.col("dt"))), F.lit(0.0)).alias("peak_in_rate"),
        F.coalesce(F.max(_ratio(F.col("out_inc"), F.col("dt"))), F.lit(0.0)).alias("peak_out_rate"),
        F.max("msgs").alias("peak_msgs"),
        F.max("pending").alias("peak_pending"),
        F.coalesce(
            F.percentile_approx(F.when(F.col("msgs") > 0, F.col("msgs")), 0.5), F.lit(0)
        ).alias("median_held"),
        F.avg(F.when(F.col("pending") > 0, 1.0).otherwise(0.0)).alias("pending_share"),
        F.max("consumers").alias("max_consumers"),
        F.max("pipeline_readers").alias("max_readers"),  # null in older history: 0 below
        F.max_by("consumer_flow_limit", "ts").alias("consumer_flow_limit"),
        F.coalesce(F.max_by("dispatch_policy", "ts"), F.lit("")).alias("dispatch_policy"),
        F.coalesce(F.max_by("limit_behavior", "ts"), F.lit("")).alias("limit_behavior"),
        F.coalesce(F.max_by("delivery_order", "ts"), F.lit("")).alias("delivery_order"),
        F.sum("expired_inc").alias("expired"),
        F.sum("late_inc").alias("consumed_late"),
        # Samples that recorded the deadline counters: none in older history, where the sums
        # above are unknown rather than 0 (fillna below makes them 0).
        F.count("expired").alias("miss_samples"),
    )
    for extra in extras:
        table = table.join(extra, "destination", "left")
    return table.fillna(0).withColumn("traffic", F.col("msgs_in") + F.col("msgs_out"))


def to_stats(row: RowLike) -> DestinationStats:
    recorded = int_of(row, "miss_samples") > 0
    return DestinationStats(
        destination=str_of(row, "destination"),
        type=str_of(row, "type"),
        msgs_in=int_of(row, "msgs_in"),
        msgs_out=int_of(row, "msgs_out"),
        mean_in_rate=float_of(row, "mean_in_rate"),
        mean_out_rate=float_of(row, "mean_out_rate"),
        peak_in_rate=float_of(row, "peak_in_rate"),
        peak_out_rate=float_of(row, "peak_out_rate"),
        peak_msgs=int_of(row, "peak_msgs"),
        peak_pending=int_of(row, "peak_pending"),
        median_held=float_of(row, "median_held"),
        pending_share=float_of(row, "pending_share"),
        max_consumers=int_of(row, "max_consumers"),
        consumer_flow_limit=int_of(row, "consumer_flow_limit"),
        dispatch_policy=str_of(row, "dispatch_policy"),
        limit_behavior=str_of(row, "limit_behavior"),
        stranded_s=float_of(row, "stranded_s"),
        stranded_peak=int_of(row, "stranded_peak"),
        paused_s=float_of(row, "paused_s"),
        held_s=float_of(row, "held_s"),
        held_episodes=int_of(row, "held_episodes"),
        max_readers=int_of(row, "max_readers"),
        delivery_order=str_of(row, "delivery_order"),
        expired=int_of(row, "expired") if recorded else None,
        consumed_late=int_of(row, "consumed_late") if recorded else None,
    )


def bucket_ms(first_ms: int, last_ms: int, interval_ms: float) -> int:
    """The width of one plotted point: one sample, or wider so a series has at most MAX_POINTS."""
    return max(1, math.ceil(interval_ms), math.ceil((last_ms - first_ms + 1) / MAX_POINTS))


def series(samples: DataFrame, destinations: list[str], first_ms: int, width_ms: int) -> DataFrame:
    """Rates and backlog of `destinations`, per time bucket of `width_ms`."""
    seconds = F.sum("dt")
    return (
        samples.where(F.col("destination").isin(destinations))
        .withColumn("bucket", F.floor((F.col("ts") - first_ms) / width_ms))
        .groupBy("destination", "bucket")
        .agg(
            F.avg("ts").cast("long").alias("ts_ms"),
            _ratio(F.sum(_rated("in_inc")), seconds).alias("in_rate"),
            _ratio(F.sum(_rated("out_inc")), seconds).alias("out_rate"),
            F.avg("msgs").alias("msgs"),
            F.avg("pending").alias("pending"),
            F.avg("unacked").alias("unacked"),
        )
        .orderBy("destination", "bucket")
    )


def to_point(row: RowLike) -> SeriesPoint:
    return SeriesPoint(
        destination=str_of(row, "destination"),
        ts_ms=int_of(row, "ts_ms"),
        in_rate=opt_float_of(row, "in_rate"),
        out_rate=opt_float_of(row, "out_rate"),
        msgs=float_of(row, "msgs"),
        pending=float_of(row, "pending"),
        unacked=float_of(row, "unacked"),
    )


def slices(
    samples: DataFrame,
    consumer_samples: DataFrame,
    destinations: list[str],
    first_ms: int,
    last_ms: int,
) -> DataFrame:
    """The load of `destinations` over SLICES equal periods of the range: messages held (median
    over the samples where any were), active consumers (median), messages out per second."""
    width = max(1, math.ceil((last_ms - first_ms + 1) / SLICES))
    active = (
        consumer_samples.where(~F.coalesce(F.col("backup"), F.lit(False)))
        .groupBy("destination", "ts")
        .agg(F.count("*").alias("active"))
    )
    seconds = F.sum("dt")
    return (
        samples.where(F.col("destination").isin(destinations))
        .join(active, ["destination", "ts"], "left")
        .withColumn("slice", F.floor((F.col("ts") - first_ms) / width))
        .groupBy("destination", "slice")
        .agg(
            F.min("ts").alias("start_ms"),
            F.max("ts").alias("end_ms"),
            F.count("*").alias("samples"),
            F.percentile_approx(F.when(F.col("msgs") > 0, F.col("msgs")), 0.5).alias("median_held"),
            F.percentile_approx(F.when(F.col("active") > 0, F.col("active")), 0.5).alias(
                "consumers"
            ),
            _ratio(F.sum(_rated("out_inc")), seconds).alias("out_rate"),
        )
        .orderBy("destination", "slice")
    )


def to_slice(row: RowLike) -> LoadSlice:
    return LoadSlice(
        destination=str_of(row, "destination"),
        start_ms=int_of(row, "start_ms"),
        end_ms=int_of(row, "end_ms"),
        samples=int_of(row, "samples"),
        median_held=opt_float_of(row, "median_held"),
        consumers=opt_float_of(row, "consumers"),
        out_rate=opt_float_of(row, "out_rate"),
    )
