"""The Spark job: read the history, aggregate it in Spark, collect the small results.

Everything that grows with the history (rows per sample, per consumer sample) stays in Spark;
the driver receives one row per destination, consumer, pipeline reader, distribution, episode,
plotted time bucket and period of a destination's load (traffic.SLICES), each list capped (the
MAX_* below), with a count of what was left off.
"""

from __future__ import annotations

from typing import Final

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from sluiceway.analysis import consumers, frames, producers, readers, sources, traffic
from sluiceway.analysis.results import Collected
from sluiceway.analysis.session import SHUFFLE_PARTITIONS

MAX_DESTINATIONS: Final = 500
MAX_PLOTTED: Final = 12  # destinations with throughput and backlog plots, by traffic
MAX_CONSUMERS: Final = 2000
MAX_EPISODES: Final = 500
MAX_READERS: Final = 2000
# Bucket edges can split a destination's range into one bucket more than MAX_POINTS.
MAX_SERIES_POINTS: Final = traffic.MAX_POINTS + 1


def run(
    spark: SparkSession, paths: list[str], since_ms: int | None, until_ms: int | None, where: str
) -> Collected:
    cache = frames.Cache()
    try:
        # Every aggregation starts from these rows: the JSON is parsed once.
        rows = cache.keep(sources.load(spark, paths, since_ms, until_ms))
        prepared = frames.prepare(rows, where, since_ms, cache)
        partitions = int(spark.conf.get(SHUFFLE_PARTITIONS) or 0)
        return _collect(prepared, cache, partitions)
    finally:
        cache.release()


def _collect(prepared: frames.Prepared, cache: frames.Cache, partitions: int) -> Collected:
    timeline = prepared.timeline
    destination_samples = cache.keep(traffic.per_sample(prepared))
    consumer_samples = cache.keep(consumers.per_sample(prepared, prepared.destinations))
    pauses = consumers.pause_episodes(consumer_samples, prepared.range_start)
    pause_totals = cache.keep(consumers.pause_totals(pauses))
    episodes = cache.keep(producers.episodes(prepared, destination_samples))
    extras = [
        consumers.stranded(consumer_samples, timeline.interval_s),
        pause_totals.groupBy("destination").agg(F.sum("paused_s").alias("paused_s")),
        producers.per_destination(episodes),
    ]
    destination_table = cache.keep(traffic.stats(destination_samples, extras))
    destination_rows = _bounded(
        destination_table.orderBy(F.desc("traffic"), "destination"), MAX_DESTINATIONS
    )
    plotted = [
        str(row["destination"])
        for row in destination_rows[:MAX_PLOTTED]
        if row["traffic"] or row["peak_msgs"]
    ]
    width = traffic.bucket_ms(timeline.first_ms, timeline.last_ms, prepared.interval_ms)
    series = traffic.series(destination_samples, plotted, timeline.first_ms, width)
    consumer_table = cache.keep(
        consumers.stats(consumer_samples, pause_totals, timeline.interval_s)
    )
    consumer_rows = _bounded(
        consumer_table.orderBy("destination", F.desc("delivered"), "run", "connection"),
        MAX_CONSUMERS,
    )
    episode_rows = _bounded(episodes.orderBy("start", "destination"), MAX_EPISODES)
    distribution_rows = _bounded(consumers.distributions(consumer_table), MAX_DESTINATIONS)
    # The load over time of the queues and topics with consumers, for the shifting-load rule.
    with_consumers = [str(r["destination"]) for r in destination_rows if r["max_consumers"]]
    slice_rows = _bounded(
        traffic.slices(
            destination_samples,
            consumer_samples,
            with_consumers,
            timeline.first_ms,
            timeline.last_ms,
        ),
        MAX_DESTINATIONS * traffic.SLICES,
    )
    reader_table = cache.keep(readers.stats(prepared))
    reader_rows = _bounded(reader_table.orderBy(*readers.KEY), MAX_READERS)
    return Collected(
        timeline=timeline,
        destinations=[traffic.to_stats(r) for r in destination_rows],
        destinations_left_off=_left_off(destination_table, destination_rows, MAX_DESTINATIONS),
        series=[traffic.to_point(r) for r in _bounded(series, MAX_PLOTTED * MAX_SERIES_POINTS)],
        consumers=[consumers.to_consumer(r) for r in consumer_rows],
        consumers_left_off=_left_off(consumer_table, consumer_rows, MAX_CONSUMERS),
        distributions=[consumers.to_distribution(r) for r in distribution_rows],
        episodes=[producers.to_episode(r) for r in episode_rows],
        episodes_left_off=_left_off(episodes, episode_rows, MAX_EPISODES),
        shuffle_partitions=partitions,
        readers=[readers.to_reader(r) for r in reader_rows],
        readers_left_off=_left_off(reader_table, reader_rows, MAX_READERS),
        slices=[traffic.to_slice(r) for r in slice_rows],
    )


def _bounded(table: DataFrame, most: int) -> list[Row]:
    return table.limit(most).collect()


def _left_off(table: DataFrame, taken: list[Row], most: int) -> int:
    """How many rows were not collected (counted only when the cap was reached)."""
    return 0 if len(taken) < most else table.count() - len(taken)
