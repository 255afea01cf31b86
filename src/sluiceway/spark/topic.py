"""Streaming from a topic: sequence-number offsets, and a cursor per group for retention.

A batch is `[start, end)` by sequence number; read() fetches exactly that range, so a replay
after a crash, or a retried task, reads the same messages. The group's cursor (named by the
`group` option) makes the topic keep every message from the reader's position on; commit(end)
moves it, releasing what Spark has durably processed. Spark's checkpoint, not the cursor, is the
source of truth for the position: commit(end) comes one batch late, and not at all for the last
batch of a run.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from sluiceway.client.pipeline import EndMarker
from sluiceway.errors import NotFound
from sluiceway.spark.errors import DataLossError, UnsupportedBroker
from sluiceway.spark.offsets import RangePartition, TopicOffset, split_range
from sluiceway.spark.options import SourceOptions, StartingPosition
from sluiceway.spark.reading import DriverSide, read_range_rows

log = logging.getLogger("sluiceway.spark")

# How the cursor is opened after the query's start: a cursor that vanished (deleted by an
# operator) comes back at the head, so that a reader behind it is told its messages may be gone
# rather than left to believe it was held all along.
_REOPEN_AT: str = "latest"


class TopicStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """`readStream.format("sluiceway")` on `/topic/NAME`."""

    def __init__(self, options: SourceOptions) -> None:
        # No I/O here: Spark builds the reader twice per query (runner and planner).
        self.options = options
        self.group = options.stream_group()
        self.driver = DriverSide(options)
        self.destination = options.destination.path
        self._initial: TopicOffset | None = None
        self._target: int | None = None  # Trigger.AvailableNow: the head+1 recorded at start

    # -- positions -------------------------------------------------------------------------------

    def initialOffset(self) -> dict[str, object]:
        # Spark asks twice on a fresh query and plans batch 0 from the second answer: computed
        # once, so both agree even while producers send.
        if self._initial is None:
            self._initial = self._starting_offset()
        return self._initial.to_json()

    def _starting_offset(self) -> TopicOffset:
        starting = self.options.stream_starting()
        create_at = {
            StartingPosition.EARLIEST: "earliest",
            StartingPosition.LATEST: "latest",
            StartingPosition.COMMITTED: "earliest",
            StartingPosition.SEQUENCE: str(starting.sequence),
        }[starting.position]
        marker = self.driver.head(cursor=self.group, cursor_start=create_at)
        if marker.cursor_sequence is None:
            settings = self.options.connection
            raise UnsupportedBroker(
                f"the broker at {settings.host}:{settings.port} did not open cursor "
                f"{self.group} on {self.destination} (no cursor-sequence on the end marker): it "
                "predates topic cursors (pipelines-protocol.md), which a topic stream needs"
            )
        earliest = marker.first_sequence if marker.first_sequence is not None else 0
        if starting.position is StartingPosition.EARLIEST:
            sequence = earliest
        elif starting.position is StartingPosition.LATEST:
            sequence = marker.head_sequence + 1
        elif starting.position is StartingPosition.COMMITTED:
            cursor = marker.cursor_sequence
            sequence = cursor if cursor is not None else earliest
        else:
            sequence = starting.sequence
        # The cursor is not moved to `sequence` here, even when it is behind: Spark asks for the
        # initial offset again to replay batch 0 after a crash, and the cursor must still hold it.
        log.info(
            "topic %s, group %s: starting at sequence %d (%s; head %d)",
            self.destination,
            self.group,
            sequence,
            starting.position.value,
            marker.head_sequence,
        )
        return TopicOffset(self.destination, sequence, sequence)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.driver.max_messages())

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.driver.head().head_sequence + 1
        log.info("topic %s: available-now run up to sequence %d", self.destination, self._target)

    def latestOffset(self, start: dict[str, object], limit: ReadLimit) -> dict[str, object]:
        begin = TopicOffset.parse(start, self.destination).sequence
        marker = self.driver.head(cursor=self.group, cursor_start=_REOPEN_AT)
        available = marker.head_sequence + 1
        if self._target is not None:
            available = min(available, self._target)
        if available <= begin:
            return start
        caps = self.driver.caps(limit)
        # Sequence numbers the topic no longer holds (never retained, or skipped when the broker
        # restarted) are passed over in the same batch, so the cap counts messages that exist.
        first = begin
        if marker.first_sequence is not None and self._held_from(begin, marker):
            first = max(begin, marker.first_sequence)
        end = available if caps.messages is None else min(available, first + caps.messages)
        if caps.bytes is not None and first < end:
            end = self._byte_capped_end(first, end, caps.bytes)
        return TopicOffset(self.destination, begin, end).to_json()

    def _byte_capped_end(self, start: int, end: int, max_bytes: int) -> int:
        """The end of `[start, end)` cut so that its bodies add up to `max_bytes` at most (one
        message at least). The range is read on the driver to measure it, keeping only sums."""
        total = 0
        # Leaving the read early closes the connection; the next call opens another.
        read = self.driver.connection.read_range(self.destination, start, end)
        for taken, message in enumerate(read):
            total += len(message.body)
            if total > max_bytes and taken:
                return message.sequence
            if total >= max_bytes:
                return message.sequence + 1
        return end

    @staticmethod
    def _held_from(position: int, marker: EndMarker) -> bool:
        """Whether the cursor held every message from `position` (at or before it)."""
        return marker.cursor_sequence is not None and marker.cursor_sequence <= position

    # -- batches ---------------------------------------------------------------------------------

    def partitions(
        self, start: dict[str, object], end: dict[str, object]
    ) -> Sequence[InputPartition]:
        if start == end:
            return []
        batch = TopicOffset.parse(end, self.destination)
        first, last = batch.start, batch.sequence
        if last <= first:
            return []
        self._check_retained(first, last)
        return split_range(self.destination, first, last, self.options.min_partitions)

    def _check_retained(self, first: int, last: int) -> None:
        """failOnDataLoss: a batch starting before the oldest retained message, with no cursor
        that held it, may have lost messages (released, expired, or its cursor deleted)."""
        marker = self.driver.head(cursor=self.group, cursor_start=_REOPEN_AT)
        oldest = marker.first_sequence
        if oldest is None or oldest <= first or self._held_from(first, marker):
            return
        gone_to = min(oldest, last)
        cursor = "none" if marker.cursor_sequence is None else str(marker.cursor_sequence)
        text = (
            f"topic {self.destination}: messages with sequence numbers {first} to {gone_to - 1} "
            f"may be gone: the oldest one retained is {oldest}, and the cursor of group "
            f"{self.group} is at {cursor}, past where this batch starts (a cursor deleted or "
            "committed by another query, or messages released by a limit)"
        )
        if self.options.fail_on_data_loss:
            raise DataLossError(text + "; set failOnDataLoss=false to go on without them")
        log.warning("%s; going on without them (failOnDataLoss=false)", text)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        return read_range_rows(self.options, partition)

    def commit(self, end: dict[str, object]) -> None:
        sequence = TopicOffset.parse(end, self.destination).sequence
        try:
            self.driver.connection.commit_cursor(self.destination, self.group, sequence)
        except NotFound:
            log.warning(
                "topic %s: the cursor of group %s is gone (deleted?); the next batch checks "
                "whether messages were lost",
                self.destination,
                self.group,
            )

    def stop(self) -> None:
        self.driver.close()
