"""Per pipeline reader (a topic's cursor group, a queue's lease group): how far behind it was.

Each `reader` row of the history carries the reader's lag at that sample: the messages of its
destination it had not taken (`lag_messages`) and the age of the oldest of them (`lag_seconds`),
as admin.readers measures them. A reader is durable: it outlives connections and broker
restarts, so it is keyed by its destination, kind and group across runs. The report gives its
lag at the last sample that saw it and the most it reached.
"""

from __future__ import annotations

from typing import Final

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sluiceway.analysis.frames import Prepared
from sluiceway.analysis.results import (
    ReaderStats,
    RowLike,
    float_of,
    int_of,
    opt_int_of,
    str_of,
)

KEY: Final = ["destination", "reader_kind", "group"]


def stats(prepared: Prepared) -> DataFrame:
    """One row per reader: its lag at the last sample that saw it, and the peaks."""
    interval_s = prepared.timeline.interval_s
    return prepared.readers.groupBy(*KEY).agg(
        (F.count("*") * interval_s).alias("present_s"),
        F.max_by("lag_messages", "ts").alias("lag_messages"),
        F.max("lag_messages").alias("peak_lag_messages"),
        F.max_by("lag_seconds", "ts").alias("lag_seconds"),
        F.max("lag_seconds").alias("peak_lag_seconds"),
        F.max_by("open_leases", "ts").alias("open_leases"),
        F.max("ts").alias("last_seen_ms"),
    )


def to_reader(row: RowLike) -> ReaderStats:
    return ReaderStats(
        destination=str_of(row, "destination"),
        kind=str_of(row, "reader_kind"),
        group=str_of(row, "group"),
        present_s=float_of(row, "present_s"),
        lag_messages=int_of(row, "lag_messages"),
        peak_lag_messages=int_of(row, "peak_lag_messages"),
        lag_seconds=float_of(row, "lag_seconds"),
        peak_lag_seconds=float_of(row, "peak_lag_seconds"),
        open_leases=opt_int_of(row, "open_leases"),
        last_seen_ms=int_of(row, "last_seen_ms"),
    )
