"""Producer holding and throttling episodes: when producers could not send, for how long, why.

Two sources, two scopes:

- `held_producer` rows: a connection whose SENDs the broker holds, with the reason of its oldest
  held SEND (destination full, broker full, producer throttled, producers paused, memory low)
  and how long that SEND has waited, which gives the episode's start;
- destination rows: the destination as a whole throttled (JMS IQ Manager thresholds) or its
  producers paused by an administrator, whether or not a SEND was waiting at that moment.

An episode is a run of consecutive samples with the same key; it ends between the last sample
that saw it and the next one (placed half-way), or is still going at the end of the range.

How it ended (`Outcome`) is told by that next sample. A whole destination's episode was lifted.
A connection's held SENDs were accepted when the destination took messages in meanwhile: held
SENDs are admitted before any new SEND to the same destination, so any growth of its counter
means they went first. When it took none, they were refused (held longer than
imq.producer.hold.timeout, or the destination was destroyed) or dropped with their connection:
either way not accepted. A next sample from another broker run means the broker stopped first.
"""

from __future__ import annotations

from typing import Final

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from sluiceway.analysis.frames import Prepared, clip_start
from sluiceway.analysis.results import (
    Outcome,
    ProducerEpisode,
    RowLike,
    int_of,
    opt_int_of,
    str_of,
)

COLUMNS: Final = [
    "destination",
    "connection",
    "reason",
    "limit",
    "detail",
    "start",
    "end",
    "max_held_sends",
]
# What an episode's outcome is found from: its broker run and its last sample.
ENDING: Final = ["run", "last_seen"]
THROTTLED_DETAIL: Final = (
    "the destination was throttled: the broker held more than imq.throttling.server.threshold "
    "messages and it had more than imq.throttling.destination.threshold undelivered"
)
PAUSED_DETAIL: Final = "its producers were paused by an administrator (pause dst -pst PRODUCERS)"


def _islands(rows: DataFrame, key: list[str]) -> DataFrame:
    """Number the runs of consecutive samples of each key (`episode`)."""
    in_order = Window.partitionBy(*key).orderBy("ts")
    previous = F.lag("ts").over(in_order)
    begins = previous.isNull() | (previous != F.col("sample_prev"))
    return rows.withColumn(
        "episode",
        F.sum(F.when(begins, 1).otherwise(0)).over(
            in_order.rowsBetween(Window.unboundedPreceding, Window.currentRow)
        ),
    )


def _ending(last_seen: Column, gap_after: Column) -> Column:
    return F.when(gap_after.isNull(), last_seen).otherwise(last_seen + gap_after / 2)


def held_episodes(prepared: Prepared) -> DataFrame:
    key = ["run", "connection", "destination", "reason"]
    rows = _islands(prepared.held, key)
    return (
        rows.groupBy(*key, "episode")
        .agg(
            F.min(F.col("ts") - F.round(F.col("held_for") * 1000)).alias("began"),
            F.max("ts").alias("last_seen"),
            F.max_by("gap_after", "ts").alias("gap_after"),
            F.coalesce(F.max_by("limit", "ts"), F.lit("")).alias("limit"),
            F.coalesce(F.min_by("detail", "ts"), F.lit("")).alias("detail"),
            F.max("held_sends").alias("max_held_sends"),
        )
        .withColumn("start", clip_start(F.col("began"), prepared.range_start))
        .withColumn("end", _ending(F.col("last_seen"), F.col("gap_after")))
        .select(*COLUMNS, *ENDING)
    )


def destination_episodes(prepared: Prepared) -> DataFrame:
    # The schema's `reason`, `limit` and `detail` belong to held_producer rows (null here).
    rows = prepared.destinations.drop("reason", "limit", "detail")
    throttled = rows.where(F.lower(F.col("throttled")) == "true").select(
        "*",
        F.lit("producer throttled").alias("reason"),
        F.lit("imq.throttling.destination.threshold").alias("limit"),
        F.lit(THROTTLED_DETAIL).alias("detail"),
    )
    paused = rows.where(F.col("state").isin("PRODUCERS_PAUSED", "PAUSED")).select(
        "*",
        F.lit("producers paused").alias("reason"),
        F.lit("").alias("limit"),
        F.lit(PAUSED_DETAIL).alias("detail"),
    )
    key = ["run", "destination", "reason"]
    first_seen = F.min("ts")
    before = F.min_by("gap_before", "ts")
    return (
        _islands(throttled.unionByName(paused), key)
        .groupBy(*key, "episode")
        .agg(
            F.when(before.isNull(), first_seen).otherwise(first_seen - before / 2).alias("start"),
            F.max("ts").alias("last_seen"),
            F.max_by("gap_after", "ts").alias("gap_after"),
            F.first("limit").alias("limit"),
            F.first("detail").alias("detail"),
            F.max("held_sends").alias("max_held_sends"),
        )
        .withColumn("end", _ending(F.col("last_seen"), F.col("gap_after")))
        .withColumn("connection", F.lit(None).cast("long"))
        .select(*COLUMNS, *ENDING)
    )


def _outcome(found: DataFrame, samples: DataFrame, destination_samples: DataFrame) -> DataFrame:
    """`outcome` (an Outcome's value): how each episode ended, from the sample after its last
    (see the module docstring); `destination_samples` carry `in_inc` (traffic.per_sample)."""
    after = samples.select(
        F.col("sample_prev").alias("last_seen"),
        F.col("ts").alias("next_ts"),
        F.col("run").alias("next_run"),
    )
    taken = destination_samples.select(
        "destination", F.col("ts").alias("next_ts"), F.col("in_inc").alias("taken_in")
    )
    ended = found.join(F.broadcast(after), "last_seen", "left").join(
        taken, ["destination", "next_ts"], "left"
    )
    outcome = (
        F.when(F.col("next_ts").isNull(), F.lit(Outcome.ONGOING.value))
        .when(F.col("next_run") != F.col("run"), F.lit(Outcome.STOPPED.value))
        .when(F.col("connection").isNull(), F.lit(Outcome.LIFTED.value))
        .when(F.col("taken_in") > 0, F.lit(Outcome.ACCEPTED.value))
        .otherwise(F.lit(Outcome.REFUSED.value))
    )
    return ended.withColumn("outcome", outcome).select(*COLUMNS, "outcome")


def episodes(prepared: Prepared, destination_samples: DataFrame) -> DataFrame:
    both = _outcome(
        held_episodes(prepared).unionByName(destination_episodes(prepared)),
        prepared.samples,
        destination_samples,
    )
    return (
        both.withColumn("start", F.col("start").cast("long"))
        .withColumn("end", F.col("end").cast("long"))
        .withColumn("seconds", F.greatest(F.lit(0.0), (F.col("end") - F.col("start")) / 1000.0))
    )


def per_destination(all_episodes: DataFrame) -> DataFrame:
    """`held_s`: for each connection, the time its SENDs were held, added up (producer-seconds;
    whole-destination episodes are listed but not added, as they overlap the connections');
    `held_episodes`: every episode."""
    return all_episodes.groupBy("destination").agg(
        F.coalesce(
            F.sum(F.when(F.col("connection").isNotNull(), F.col("seconds"))), F.lit(0.0)
        ).alias("held_s"),
        F.count("*").alias("held_episodes"),
    )


def to_episode(row: RowLike) -> ProducerEpisode:
    return ProducerEpisode(
        destination=str_of(row, "destination"),
        connection=opt_int_of(row, "connection"),
        reason=str_of(row, "reason"),
        limit=str_of(row, "limit"),
        detail=str_of(row, "detail"),
        start_ms=int_of(row, "start"),
        end_ms=int_of(row, "end"),
        outcome=Outcome(str_of(row, "outcome")),
        max_held_sends=int_of(row, "max_held_sends"),
    )
