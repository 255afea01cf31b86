"""What the stream readers share: the driver's connection, the destinations it reads now, the
read limits, and the reads that run in executors.

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
from sluiceway.client.pipeline_listing import ListRight
from sluiceway.spark.arrow_rows import PACK, pack_batches
from sluiceway.spark.destinations import resolve
from sluiceway.spark.offsets import RangePartition
from sluiceway.spark.options import SourceOptions

log = logging.getLogger("sluiceway.spark")

# maxMessagesPerTrigger when the broker names no flow limit (its own default, imqConsumerFlowLimit).
FALLBACK_FLOW_LIMIT: Final = 1000


@dataclass(frozen=True, slots=True)
class Caps:
    """How much one batch may take: messages and bytes in all (None: no cap); `flow_limited`:
    each destination at most its consumer flow limit besides (maxMessagesPerTrigger unset)."""

    messages: int | None
    bytes: int | None
    flow_limited: bool = False


def flow_limit(marker: EndMarker) -> int:
    """A destination's effective consumer flow limit, from a read's end marker (else the
    SUBSCRIBE's receipt); the broker's default when it names none."""
    limit = marker.consumer_flow_limit
    return limit if limit is not None and limit > 0 else FALLBACK_FLOW_LIMIT


class DriverSide:
    """The driver's connection, the destinations and the per-trigger limits, for both stream
    readers."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.connection = PipelineConnection(options.connection)

    def resolve(self) -> list[str]:
        """The destinations the query reads now (its patterns asked of the broker again)."""
        return resolve(self.connection, self.options.destinations, ListRight.CONSUME)

    def default_messages(self) -> int:
        """maxMessagesPerTrigger, by default the destinations' flow limits added up: the
        broker's consumer flow control is Spark's admission control (`caps` then holds each
        destination to its own)."""
        if self.options.max_messages is not None:
            return self.options.max_messages
        return sum(flow_limit(self.head(name)) for name in self.resolve()) or FALLBACK_FLOW_LIMIT

    def caps(self, limit: ReadLimit) -> Caps:
        """The caps for one batch under Spark's `limit`. Spark passes the default limit
        (ReadMaxRows of `default_messages`) or ReadAllAvailable (Trigger.Once, or a trigger
        that ignores limits), which must lift both caps."""
        options = self.options
        flow_limited = options.max_messages is None
        if isinstance(limit, ReadAllAvailable):
            return Caps(None, None)
        if isinstance(limit, ReadMaxRows):
            if flow_limited:
                return Caps(None, options.max_bytes, flow_limited=True)
            return Caps(max(1, limit.max_rows), options.max_bytes)
        if isinstance(limit, ReadMaxBytes):
            return Caps(options.max_messages, max(1, limit.max_bytes), flow_limited)
        return Caps(options.max_messages, options.max_bytes, flow_limited)

    def head(
        self, destination: str, cursor: str | None = None, cursor_start: str | None = None
    ) -> EndMarker:
        return self.connection.head(destination, cursor=cursor, cursor_start=cursor_start)

    def close(self) -> None:
        self.connection.close()


def read_range_rows(options: SourceOptions, partition: RangePartition) -> Iterator[pa.RecordBatch]:
    """Executor side: the messages of `[start, end)`, as record batches, as they arrive."""
    with PipelineConnection(options.connection) as connection:
        read = connection.read_range(
            partition.destination, partition.start, partition.end, pack=PACK
        )
        yield from pack_batches(read.packs(), options.include_headers)
