"""What the stream readers share: the driver's connection, the read limits, and the reads
that run in executors.

Driver-side methods (initialOffset, latestOffset, partitions, commit) run in one long-lived
Python worker per query, on one reader instance: it keeps one connection, opened on first use.
read() runs in executor workers on a pickled copy of the reader, which holds no socket (the
connection pickles as its settings): each read opens a connection of its own and closes it when
the partition is read. Rows are yielded as they arrive, so a partition is never held in memory.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

import pyarrow as pa
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxBytes, ReadMaxRows

from sluiceway.client.pipeline import EndMarker, PipelineConnection
from sluiceway.spark.arrow_rows import PACK, pack_batches
from sluiceway.spark.offsets import RangePartition
from sluiceway.spark.options import SourceOptions

log = logging.getLogger("sluiceway.spark")

# maxMessagesPerTrigger when the broker names no flow limit (its own default, imqConsumerFlowLimit).
FALLBACK_FLOW_LIMIT: Final = 1000


@dataclass(frozen=True, slots=True)
class Caps:
    """How much one batch may take: messages and bytes, None for no cap."""

    messages: int | None
    bytes: int | None


class DriverSide:
    """The driver's connection and the per-trigger limits, for both stream readers."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.destination = options.destination.path
        self.connection = PipelineConnection(options.connection)
        self._flow_limit: int | None = None

    def flow_limit(self) -> int:
        """The destination's effective consumer flow limit, asked once (end marker, else the
        SUBSCRIBE's receipt); the broker's default when it names none."""
        if self._flow_limit is None:
            marker = self.connection.head(self.destination)
            limit = marker.consumer_flow_limit
            self._flow_limit = limit if limit is not None and limit > 0 else FALLBACK_FLOW_LIMIT
        return self._flow_limit

    def max_messages(self) -> int:
        """maxMessagesPerTrigger, by default the flow limit: the broker's consumer flow control
        is Spark's admission control."""
        return self.options.max_messages or self.flow_limit()

    def caps(self, limit: ReadLimit) -> Caps:
        """The caps for one batch under Spark's `limit`. Spark passes the default limit
        (ReadMaxRows of maxMessagesPerTrigger) or ReadAllAvailable (Trigger.Once, or a
        trigger that ignores limits), which must lift both caps."""
        if isinstance(limit, ReadAllAvailable):
            return Caps(None, None)
        if isinstance(limit, ReadMaxRows):
            return Caps(max(1, limit.max_rows), self.options.max_bytes)
        if isinstance(limit, ReadMaxBytes):
            return Caps(self.max_messages(), max(1, limit.max_bytes))
        return Caps(self.max_messages(), self.options.max_bytes)

    def head(self, cursor: str | None = None, cursor_start: str | None = None) -> EndMarker:
        return self.connection.head(self.destination, cursor=cursor, cursor_start=cursor_start)

    def close(self) -> None:
        self.connection.close()


def read_range_rows(options: SourceOptions, partition: RangePartition) -> Iterator[pa.RecordBatch]:
    """Executor side: the messages of `[start, end)`, as record batches, as they arrive."""
    with PipelineConnection(options.connection) as connection:
        read = connection.read_range(
            partition.destination, partition.start, partition.end, pack=PACK
        )
        yield from pack_batches(read.packs(), options.include_headers)
