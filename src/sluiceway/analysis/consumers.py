"""Per consumer: messages received, time paused by flow control; per queue: how evenly the
messages were spread, and how long some sat in one consumer's window while another had none.

Paused by flow control means the consumer's window was used up: it held its flow limit of
unconsumed messages and got nothing more until it consumed down to its threshold. Each consumer
row carries `flow_paused_for`, how long the current pause has lasted, so a pause's start is
exact; its end lies between the last sample that saw it and the next one, and is placed half-way
(or at the start of the next pause, if that comes first). A pause that starts and ends between
two samples is not seen: the totals are accurate to about half an interval per pause.

How each consumer's window was sized and used, for the adaptive-window rules: whether the broker
sized it (consumerFlowLimit=auto), the smallest and largest it was, the broker's measures of
the consumer's pace and round trip, the 90th percentile of what it held, and what it consumed
over the intervals it held messages at both ends of (its speed while it had work).
"""

from __future__ import annotations

from typing import Final

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from sluiceway.analysis.frames import Prepared, clip_start, increments, queue_type
from sluiceway.analysis.results import (
    ConsumerStats,
    Distribution,
    RowLike,
    bool_of,
    float_of,
    int_of,
    opt_float_of,
    opt_int_of,
    str_of,
)

KEY: Final = ["run", "destination", "connection", "subscription"]
# A consumer is compared with the others of its queue when it was active (not a backup) at
# least this fraction of the time the longest-present one was: a consumer that came for the
# last minute of an hour did not get a small share through flow control.
PRESENCE_FOR_COMPARISON: Final = 0.5
STRANDED_MIN: Final = 2  # unconsumed messages in one window while another consumer has none


def per_sample(prepared: Prepared, destinations: DataFrame) -> DataFrame:
    """Consumer rows with `delivered_inc`, the pause's start `pause_start`, the queue's
    `pending` at that sample (from the destination rows), and `busy`/`consumed_inc`/`busy_s`:
    whether the consumer held unconsumed messages at both ends of the interval since the
    previous sample (it had work throughout, as far as the samples tell), how many it consumed
    over it (delivered, less the growth of what it holds), and the interval's seconds."""
    pending = destinations.select("ts", "destination", F.col("pending").alias("dest_pending"))
    in_order = Window.partitionBy(*KEY).orderBy("ts")
    held_before = F.lag("outstanding").over(in_order)
    # Only across consecutive samples: a consumer seen again after missing ones says nothing of
    # what it did in between.
    consecutive = F.lag("ts").over(in_order) == F.col("sample_prev")
    return (
        prepared.consumers.withColumn("delivered_inc", increments(KEY, "delivered"))
        .withColumn(
            "busy",
            F.coalesce(consecutive & (held_before > 0) & (F.col("outstanding") > 0), F.lit(False)),
        )
        .withColumn(
            "consumed_inc",
            F.greatest(F.lit(0), F.col("delivered_inc") - (F.col("outstanding") - held_before)),
        )
        .withColumn("busy_s", F.col("gap_before") / 1000.0)
        .withColumn(
            "pause_start",
            (F.col("ts") - F.round(F.col("flow_paused_for") * 1000)).cast("long"),
        )
        .withColumn("type", queue_type(F.col("destination")))
        .join(pending, ["ts", "destination"], "left")
    )


def pause_episodes(samples: DataFrame, range_start: int | None) -> DataFrame:
    """One row per pause: KEY, `start`, `end` (ms), `ongoing`, `seconds`."""
    in_order = Window.partitionBy(*KEY).orderBy("ts")
    previous_ts = F.lag("ts").over(in_order)
    previous_paused = F.lag("flow_paused_for").over(in_order)
    # A new pause: not paused at the consumer's previous sample, or paused again since then.
    begins = F.col("flow_paused_for").isNotNull() & (
        previous_paused.isNull() | (F.col("pause_start") > previous_ts)
    )
    numbered = samples.withColumn(
        "episode",
        F.sum(F.when(begins, 1).otherwise(0)).over(
            in_order.rowsBetween(Window.unboundedPreceding, Window.currentRow)
        ),
    ).where(F.col("flow_paused_for").isNotNull())
    episodes = numbered.groupBy(*KEY, "episode").agg(
        F.min("pause_start").alias("began"),
        F.max("ts").alias("last_seen"),
        F.max_by("gap_after", "ts").alias("gap_after"),
    )
    next_start = F.lead("began").over(Window.partitionBy(*KEY).orderBy("began"))
    halfway = F.col("last_seen") + F.col("gap_after") / 2
    end = F.when(F.col("gap_after").isNull(), F.col("last_seen")).otherwise(
        F.least(halfway, F.coalesce(next_start, halfway))
    )
    return (
        episodes.withColumn("end", end.cast("long"))
        .withColumn("start", clip_start(F.col("began"), range_start))
        .withColumn("ongoing", F.col("gap_after").isNull())
        .withColumn("seconds", (F.col("end") - F.col("start")) / 1000.0)
    )


def pause_totals(episodes: DataFrame) -> DataFrame:
    return episodes.groupBy(*KEY).agg(
        F.sum("seconds").alias("paused_s"),
        F.count("*").alias("pause_episodes"),
        F.max("seconds").alias("longest_pause_s"),
    )


def stranded(samples: DataFrame, interval_s: float) -> DataFrame:
    """Per queue: `stranded_s`, the time a consumer sat empty while another held STRANDED_MIN
    or more unconsumed messages and none waited in the queue (Open MQ's uneven distribution:
    messages stuck in one consumer's window while another could have taken them), and
    `stranded_peak`, the most one consumer held meanwhile."""
    per_moment = (
        samples.where((F.col("type") == "queue") & ~F.coalesce(F.col("backup"), F.lit(False)))
        .groupBy("destination", "ts")
        .agg(
            F.count("*").alias("present"),
            F.max("outstanding").alias("most"),
            F.min("outstanding").alias("least"),
            F.max("dest_pending").alias("waiting"),
        )
    )
    is_stranded = (
        (F.col("present") >= 2)
        & (F.col("least") == 0)
        & (F.col("most") >= STRANDED_MIN)
        & (F.coalesce(F.col("waiting"), F.lit(0)) == 0)
    )
    return per_moment.groupBy("destination").agg(
        (F.sum(F.when(is_stranded, 1).otherwise(0)) * interval_s).alias("stranded_s"),
        F.coalesce(F.max(F.when(is_stranded, F.col("most"))), F.lit(0)).alias("stranded_peak"),
    )


def stats(samples: DataFrame, totals: DataFrame, interval_s: float) -> DataFrame:
    """One row per consumer, with its share of its queue's deliveries among those compared."""
    active = ~F.coalesce(F.col("backup"), F.lit(False))
    starving = (
        (F.col("type") == "queue") & (F.col("outstanding") == 0) & (F.col("dest_pending") > 0)
    )
    table = (
        samples.groupBy(*KEY)
        .agg(
            F.max_by("type", "ts").alias("type"),
            F.coalesce(F.max_by("ack", "ts"), F.lit("")).alias("ack"),
            F.coalesce(F.bool_or("backup"), F.lit(False)).alias("backup"),
            F.max_by("window_limit", "ts").alias("window_limit"),
            F.max_by("window_threshold", "ts").alias("window_threshold"),
            F.sum("delivered_inc").alias("delivered"),
            (F.count("*") * interval_s).alias("present_s"),
            (F.sum(F.when(active, 1).otherwise(0)) * interval_s).alias("active_s"),
            (F.sum(F.when(starving, 1).otherwise(0)) * interval_s).alias("starved_s"),
            F.max("outstanding").alias("max_outstanding"),
            *_window_columns(active),
        )
        .join(totals, KEY, "left")
        .fillna(0, ["paused_s", "pause_episodes", "longest_pause_s"])
    )
    queue = Window.partitionBy("destination")
    compared = (F.col("type") == "queue") & (
        F.col("active_s") >= PRESENCE_FOR_COMPARISON * F.max("active_s").over(queue)
    )
    table = table.withColumn("compared", compared & (F.col("active_s") > 0))
    total = F.sum(F.when(F.col("compared"), F.col("delivered"))).over(queue)
    return table.withColumn(
        "share", F.when(F.col("compared") & (total > 0), F.col("delivered") / total)
    ).withColumn("label", F.concat_ws("/", F.col("connection").cast("string"), "subscription"))


def _window_columns(active: Column) -> list[Column]:
    """How its window was sized and used: adaptive or not, the range of sizes it had, the
    broker's measures of its pace and round trip, how much of it was held, and its work while
    it held messages (all null in history written before they were recorded)."""
    busy = F.col("busy")
    return [
        F.coalesce(F.max_by("window_auto", "ts"), F.lit(False)).alias("window_auto"),
        F.max_by("window_max", "ts").alias("window_cap"),
        F.min(F.when(F.col("window_limit") > 0, F.col("window_limit"))).alias("window_low"),
        F.max("window_limit").alias("window_high"),
        F.percentile_approx("pace_ms", 0.5).alias("pace_ms"),
        F.min("pace_ms").alias("pace_low_ms"),
        F.max("pace_ms").alias("pace_high_ms"),
        F.percentile_approx("round_trip_ms", 0.5).alias("round_trip_ms"),
        F.percentile_approx(F.when(active, F.col("outstanding")), 0.9).alias("outstanding_p90"),
        F.coalesce(F.sum(F.when(busy, F.col("consumed_inc"))), F.lit(0)).alias("busy_consumed"),
        F.coalesce(F.sum(F.when(busy, F.col("busy_s"))), F.lit(0.0)).alias("busy_s"),
        F.sum(F.when(busy, 1).otherwise(0)).alias("busy_intervals"),
    ]


def distributions(consumer_stats: DataFrame) -> DataFrame:
    """Per queue with two or more compared consumers: the largest and smallest share."""
    return (
        consumer_stats.where(F.col("share").isNotNull())
        .groupBy("destination")
        .agg(
            F.count("*").alias("consumers"),
            F.sum("delivered").alias("delivered"),
            F.max("share").alias("max_share"),
            F.min("share").alias("min_share"),
            F.max_by("label", "share").alias("max_consumer"),
            F.min_by("label", "share").alias("min_consumer"),
        )
        .where(F.col("consumers") >= 2)
        .orderBy("destination")
    )


def to_consumer(row: RowLike) -> ConsumerStats:
    return ConsumerStats(
        destination=str_of(row, "destination"),
        connection=int_of(row, "connection"),
        subscription=str_of(row, "subscription"),
        run=int_of(row, "run"),
        ack=str_of(row, "ack"),
        backup=bool_of(row, "backup"),
        window_limit=int_of(row, "window_limit"),
        window_threshold=opt_int_of(row, "window_threshold"),
        delivered=int_of(row, "delivered"),
        share=None if row["share"] is None else float_of(row, "share"),
        present_s=float_of(row, "present_s"),
        paused_s=float_of(row, "paused_s"),
        pause_episodes=int_of(row, "pause_episodes"),
        longest_pause_s=float_of(row, "longest_pause_s"),
        starved_s=float_of(row, "starved_s"),
        max_outstanding=int_of(row, "max_outstanding"),
        window_auto=bool_of(row, "window_auto"),
        window_cap=opt_int_of(row, "window_cap"),
        window_low=opt_int_of(row, "window_low"),
        window_high=opt_int_of(row, "window_high"),
        pace_ms=opt_float_of(row, "pace_ms"),
        pace_low_ms=opt_float_of(row, "pace_low_ms"),
        pace_high_ms=opt_float_of(row, "pace_high_ms"),
        round_trip_ms=opt_float_of(row, "round_trip_ms"),
        outstanding_p90=opt_int_of(row, "outstanding_p90"),
        busy_consumed=int_of(row, "busy_consumed"),
        busy_s=float_of(row, "busy_s"),
        busy_intervals=int_of(row, "busy_intervals"),
    )


def to_distribution(row: RowLike) -> Distribution:
    return Distribution(
        destination=str_of(row, "destination"),
        consumers=int_of(row, "consumers"),
        delivered=int_of(row, "delivered"),
        max_share=float_of(row, "max_share"),
        min_share=float_of(row, "min_share"),
        max_consumer=str_of(row, "max_consumer"),
        min_consumer=str_of(row, "min_consumer"),
    )
