"""Batch reads: destinations' retained messages, by sequence range, consuming nothing.

`spark.read.format("sluiceway")` reads what topics retain (for their cursors and durable
subscriptions) or what waits in queues, from `startingOffsets` (earliest, the default, or a
sequence number) to `endingOffsets` (latest, the default: the head when the read is planned, or
a sequence number, exclusive), cut into `minPartitions` ranges read in parallel (spread over the
destinations, sharing.spread). A pattern reads the destinations it matches that the user may
browse; sequence numbers are positions in one destination, refused with several.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from sluiceway.client.pipeline import PipelineConnection
from sluiceway.client.pipeline_listing import ListRight
from sluiceway.errors import ConfigError
from sluiceway.spark.destinations import resolve
from sluiceway.spark.offsets import RangePartition, split_range
from sluiceway.spark.options import SourceOptions, StartingPosition
from sluiceway.spark.reading import read_range_rows
from sluiceway.spark.sharing import spread


class BatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        starting = options.starting
        if starting is not None and starting.position not in (
            StartingPosition.EARLIEST,
            StartingPosition.SEQUENCE,
        ):
            raise ConfigError(
                "startingOffsets",
                "a batch read takes startingOffsets=earliest or a sequence number, not "
                f"{starting.position.value}: it reads what the destination holds, without a group",
            )

    def partitions(self) -> Sequence[InputPartition]:
        options = self.options
        ranges: dict[str, tuple[int, int]] = {}
        with PipelineConnection(options.connection) as connection:
            for destination in resolve(connection, options.destinations, ListRight.BROWSE):
                ranges[destination] = self._range(connection, destination)
        widths = {name: end - start for name, (start, end) in ranges.items()}
        parts = spread(options.min_partitions, widths)
        return [
            part for name in sorted(parts) for part in split_range(name, *ranges[name], parts[name])
        ]

    def _range(self, connection: PipelineConnection, destination: str) -> tuple[int, int]:
        """The sequence numbers of `destination` the read takes: `[start, end)`."""
        options = self.options
        marker = connection.head(destination)
        start = 0  # 0: from the oldest message retained
        if options.starting is not None and options.starting.position is StartingPosition.SEQUENCE:
            start = options.starting.sequence
        elif marker.first_sequence is not None:
            start = marker.first_sequence
        end = marker.head_sequence + 1 if options.ending is None else options.ending
        return start, end

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        return read_range_rows(self.options, partition)
