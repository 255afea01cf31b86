"""Where the metrics history is, and how Spark reads it (see admin/history.py for the writer).

The broker writes one file per UTC hour, `YYYYMMDD-HH.jsonl`, so a time range picks its files by
name before Spark reads anything. Spark reads them with a fixed schema: no pass over the data to
infer one, the same column types whichever kinds of rows a range happens to contain, and rows
written by an older broker (without the newer fields) read as nulls. A line torn by a broker
writing at that moment reads as a row of nulls, which the `ts` filter drops.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Final

from sluiceway.analysis.errors import HistoryNotFound

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

SUFFIX: Final = ".jsonl"
HOUR_MS: Final = 3_600_000
_HOUR_FILE = re.compile(r"(\d{8})-(\d{2})")
_REMOTE = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://")

# (column, Spark type) of every field the analysis reads; the writer adds others, ignored here.
# `throttled` is a count in broker rows and a boolean in destination rows, so it is read as text.
FIELDS: Final = (
    ("ts", "long"),
    ("kind", "string"),
    ("started", "long"),
    ("destination", "string"),
    ("type", "string"),
    ("state", "string"),
    ("msgs", "long"),
    ("pending", "long"),
    ("unacked", "long"),
    ("producers", "long"),
    ("consumers", "long"),
    ("pipeline_readers", "long"),
    ("held_sends", "long"),
    ("throttled", "string"),
    ("msgs_in", "long"),
    ("msgs_out", "long"),
    ("consumer_flow_limit", "long"),
    ("limit_behavior", "string"),
    ("dispatch_policy", "string"),
    ("delivery_order", "string"),
    ("expired", "long"),
    ("consumed_late", "long"),
    ("connection", "long"),
    ("subscription", "string"),
    ("ack", "string"),
    ("backup", "boolean"),
    ("window_limit", "long"),
    ("window_threshold", "long"),
    ("window_auto", "boolean"),
    ("window_max", "long"),
    ("pace_ms", "double"),
    ("round_trip_ms", "double"),
    ("outstanding", "long"),
    ("delivered", "long"),
    ("flow_paused_for", "double"),
    ("reason", "string"),
    ("limit", "string"),
    ("detail", "string"),
    ("held_for", "double"),
    ("reader_kind", "string"),
    ("group", "string"),
    ("lag_messages", "long"),
    ("lag_seconds", "double"),
    ("open_leases", "long"),
)


def is_remote(history: str) -> bool:
    """A URL for Spark's own file systems (hdfs://, s3a://); file:// and plain paths are local."""
    return bool(_REMOTE.match(history)) and not history.startswith("file://")


def local_path(history: str) -> Path:
    return Path(history.removeprefix("file://"))


def hour_of(path: Path) -> int | None:
    """The first ms of the UTC hour a history file covers, from its name; None if not named so."""
    match = _HOUR_FILE.fullmatch(path.name.removesuffix(SUFFIX))
    if match is None:
        return None
    try:
        start = datetime.strptime(match.group(1) + match.group(2), "%Y%m%d%H").replace(tzinfo=UTC)
    except ValueError:
        return None
    return round(start.timestamp() * 1000)


def history_files(directory: Path, since_ms: int | None, until_ms: int | None) -> list[Path]:
    """The history files that may hold rows between `since_ms` and `until_ms`, oldest first.

    Raises HistoryNotFound, saying where it looked and how to turn the history on.
    """
    if not directory.is_dir():
        raise HistoryNotFound(
            f"no metrics history: {directory} is not a directory; {how_to_enable()}"
        )
    every = sorted(directory.glob(f"*{SUFFIX}"))
    if not every:
        raise HistoryNotFound(
            f"no metrics history in {directory} (no *{SUFFIX} files); {how_to_enable()}"
        )
    chosen = []
    for path in every:
        start = hour_of(path)
        if start is not None:
            if since_ms is not None and start + HOUR_MS <= since_ms:
                continue
            if until_ms is not None and start > until_ms:
                continue
        chosen.append(path)
    if not chosen:
        raise HistoryNotFound(
            f"no metrics history in the time range asked for: {directory} holds "
            f"{every[0].name} to {every[-1].name} (one file per UTC hour)"
        )
    return chosen


def how_to_enable() -> str:
    return (
        "the broker writes its history to metrics/ in its data directory when "
        "imq.metrics.enabled=true (the default), imq.metrics.history.retention is above 0 and "
        "the store is the file store (imq.persist.store=file); imq.metrics.interval sets the "
        "seconds between rows; give --data-dir or --history if it is elsewhere"
    )


def schema() -> StructType:
    # PySpark is imported only once `analyze` runs: the other commands never pay for it.
    from pyspark.sql import types as T  # noqa: PLC0415 (PySpark loads only for analyze)

    kinds: dict[str, T.DataType] = {
        "long": T.LongType(),
        "double": T.DoubleType(),
        "string": T.StringType(),
        "boolean": T.BooleanType(),
    }
    return T.StructType([T.StructField(name, kinds[kind], nullable=True) for name, kind in FIELDS])


def load(
    spark: SparkSession, paths: list[str], since_ms: int | None, until_ms: int | None
) -> DataFrame:
    """Every history row between the two times (inclusive), one table for all kinds."""
    from pyspark.sql import functions as F  # noqa: PLC0415 (PySpark loads only for analyze)

    rows = spark.read.schema(schema()).json(paths).where(F.col("ts").isNotNull())
    if since_ms is not None:
        rows = rows.where(F.col("ts") >= since_ms)
    if until_ms is not None:
        rows = rows.where(F.col("ts") <= until_ms)
    return rows
