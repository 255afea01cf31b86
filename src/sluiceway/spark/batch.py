"""Batch reads: a destination's retained messages, by sequence range, consuming nothing.

`spark.read.format("sluiceway")` reads what a topic retains (for its cursors and durable
subscriptions) or what waits in a queue, from `startingOffsets` (earliest, the default, or a
sequence number) to `endingOffsets` (latest, the default: the head when the read is planned, or
a sequence number, exclusive), cut into `minPartitions` ranges read in parallel.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from sluiceway.client.pipeline import PipelineConnection
from sluiceway.errors import ConfigError
from sluiceway.spark.offsets import RangePartition, split_range
from sluiceway.spark.options import SourceOptions, StartingPosition
from sluiceway.spark.reading import read_range_rows


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
        destination = options.destination.path
        with PipelineConnection(options.connection) as connection:
            marker = connection.head(destination)
        start = 0  # 0: from the oldest message retained
        if options.starting is not None and options.starting.position is StartingPosition.SEQUENCE:
            start = options.starting.sequence
        elif marker.first_sequence is not None:
            start = marker.first_sequence
        end = marker.head_sequence + 1 if options.ending is None else options.ending
        return split_range(destination, start, end, options.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        return read_range_rows(self.options, partition)
