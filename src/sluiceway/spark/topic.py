"""Streaming from topics: sequence-number offsets, and a cursor per group for retention.

A batch is `[start, end)` by sequence number in each topic the source reads; read() fetches
exactly that range, so a replay after a crash, or a retried task, reads the same messages. The
group's cursor on each topic (named by the `group` option) makes it keep every message from the
reader's position on; commit(end) moves it, releasing what Spark has durably processed. Spark's
checkpoint, not the cursor, is the source of truth for the position: commit(end) comes one
batch late, and not at all for the last batch of a run.

The topics are resolved at every trigger (destinations.resolve): a topic a pattern matches for
the first time starts where `startingOffsets` says (by default its cursor, created at the oldest
message it retains), and its cursor is opened then, so it keeps what is sent from then on; a
topic that is gone is dropped from the offsets. The batch's caps are shared among the topics
(sharing).
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
from sluiceway.spark.offsets import RangePartition, TopicBatch, TopicOffset, split_range
from sluiceway.spark.options import SourceOptions, StartingPosition
from sluiceway.spark.reading import Caps, DriverSide, flow_limit, read_range_rows
from sluiceway.spark.sharing import fair_shares, rotated, spread

log = logging.getLogger("sluiceway.spark")

# How the cursor is opened after the query's start: a cursor that vanished (deleted by an
# operator) comes back at the head, so that a reader behind it is told its messages may be gone
# rather than left to believe it was held all along.
_REOPEN_AT: str = "latest"


class TopicStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """`readStream.format("sluiceway")` on `/topic/NAME` (or several, or a pattern)."""

    def __init__(self, options: SourceOptions) -> None:
        # No I/O here: Spark builds the reader twice per query (runner and planner).
        self.options = options
        self.group = options.stream_group()
        self.driver = DriverSide(options)
        self._initial: TopicBatch | None = None
        # Trigger.AvailableNow: each topic's head+1 recorded at start (only those are read).
        self._targets: dict[str, int] | None = None
        self._turn = 0  # which topic comes first when the byte cap is shared out
        self._latest: dict[str, object] | None = None  # the heads seen last, for Spark's progress
        self._committed: dict[str, int] = {}  # the cursor positions committed by this reader

    # -- positions -------------------------------------------------------------------------------

    def initialOffset(self) -> dict[str, object]:
        # Spark asks twice on a fresh query and plans batch 0 from the second answer: computed
        # once, so both agree even while producers send.
        if self._initial is None:
            topics = self.driver.resolve()
            self._initial = TopicBatch({t: self._starting_offset(t) for t in topics})
        return self._initial.to_json()

    def _starting_offset(self, topic: str) -> TopicOffset:
        """Where `topic` starts when the query has no position for it: its cursor is opened
        (created at the start position when new)."""
        starting = self.options.stream_starting()
        create_at = {
            StartingPosition.EARLIEST: "earliest",
            StartingPosition.LATEST: "latest",
            StartingPosition.COMMITTED: "earliest",
            StartingPosition.SEQUENCE: str(starting.sequence),
        }[starting.position]
        marker = self.driver.head(topic, cursor=self.group, cursor_start=create_at)
        if marker.cursor_sequence is None:
            settings = self.options.connection
            raise UnsupportedBroker(
                f"the broker at {settings.host}:{settings.port} did not open cursor "
                f"{self.group} on {topic} (no cursor-sequence on the end marker): it "
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
            topic,
            self.group,
            sequence,
            starting.position.value,
            marker.head_sequence,
        )
        return TopicOffset(topic, sequence, sequence)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.driver.default_messages())

    def prepareForTriggerAvailableNow(self) -> None:
        topics = self.driver.resolve()
        self._targets = {t: self.driver.head(t).head_sequence + 1 for t in topics}
        log.info("topics: available-now run up to sequences %s", self._targets)

    def reportLatestOffset(self) -> dict[str, object] | None:
        """Each topic's next sequence number (`sequence`, as in the offsets) when the last
        batch was planned: Spark shows it as the source's `latestOffset` in its progress."""
        return self._latest

    def latestOffset(self, start: dict[str, object], limit: ReadLimit) -> dict[str, object]:
        begin = TopicBatch.parse(start)
        topics = self.driver.resolve()
        if self._targets is not None:
            topics = [t for t in topics if t in self._targets]
        caps = self.driver.caps(limit)
        positions: dict[str, int] = {}
        firsts: dict[str, int] = {}
        demands: dict[str, int] = {}
        heads: dict[str, object] = {}
        for topic in topics:
            known = begin.entries.get(topic)
            position = known.sequence if known else self._starting_offset(topic).sequence
            marker = self.driver.head(topic, cursor=self.group, cursor_start=_REOPEN_AT)
            heads[topic] = {"sequence": marker.head_sequence + 1}
            positions[topic] = position
            firsts[topic], demands[topic] = self._available(topic, position, marker, caps)
        self._latest = {"destinations": heads}
        shares = fair_shares(demands, caps.messages, self._turn)
        ends = {t: firsts[t] + shares[t] if shares[t] else positions[t] for t in topics}
        if caps.bytes is not None:
            self._cap_bytes(firsts, ends, caps.bytes)
        if set(topics) == set(begin.entries) and all(ends[t] == positions[t] for t in topics):
            return start
        self._turn += 1
        return TopicBatch({t: TopicOffset(t, positions[t], ends[t]) for t in topics}).to_json()

    def _available(
        self, topic: str, position: int, marker: EndMarker, caps: Caps
    ) -> tuple[int, int]:
        """Where `topic`'s next batch reads from, and how many messages it may take."""
        available = marker.head_sequence + 1
        if self._targets is not None:
            available = min(available, self._targets[topic])
        # Sequence numbers the topic no longer holds (never retained, or skipped when the broker
        # restarted) are passed over in the same batch, so the cap counts messages that exist.
        first = position
        if marker.first_sequence is not None and self._held_from(position, marker):
            first = max(position, marker.first_sequence)
        demand = max(0, available - first)
        if caps.flow_limited:
            demand = min(demand, flow_limit(marker))
        return first, demand

    def _cap_bytes(self, firsts: dict[str, int], ends: dict[str, int], max_bytes: int) -> None:
        """Cut the batch's ranges so that their bodies add up to `max_bytes` at most: topic
        after topic in turning order, each within an equal share of what the ones before left
        (sharing). The ranges are read on the driver to measure them, keeping only sums."""
        order = rotated([t for t in sorted(ends) if ends[t] > firsts[t]], self._turn)
        left, taken = max_bytes, False
        for index, topic in enumerate(order):
            share = left // (len(order) - index)
            ends[topic], used = self._byte_capped_end(
                topic, firsts[topic], ends[topic], share, strict=taken
            )
            left -= used
            taken = taken or used > 0

    def _byte_capped_end(
        self, topic: str, start: int, end: int, max_bytes: int, *, strict: bool
    ) -> tuple[int, int]:
        """The end of `[start, end)` cut so that its bodies add up to `max_bytes` at most, and
        those bytes; one message over it when not `strict` and it would take none."""
        total = 0
        # Leaving the read early closes the connection; the next call opens another.
        read = self.driver.connection.read_range(topic, start, end)
        for message in read:
            size = len(message.body)
            if total + size > max_bytes and (total or strict):
                return message.sequence, total
            total += size
            if total >= max_bytes:
                return message.sequence + 1, total
        return end, total

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
        batch = TopicBatch.parse(end)
        ranges = {name: e for name, e in batch.entries.items() if e.width}
        for entry in ranges.values():
            self._check_retained(entry)
        parts = spread(self.options.min_partitions, {n: e.width for n, e in ranges.items()})
        return [
            part
            for name in sorted(ranges)
            for part in split_range(name, ranges[name].start, ranges[name].sequence, parts[name])
        ]

    def _check_retained(self, batch: TopicOffset) -> None:
        """failOnDataLoss: a batch starting before the oldest retained message, with no cursor
        that held it, may have lost messages (released, expired, or its cursor deleted)."""
        topic, first, last = batch.destination, batch.start, batch.sequence
        marker = self.driver.head(topic, cursor=self.group, cursor_start=_REOPEN_AT)
        oldest = marker.first_sequence
        if oldest is None or oldest <= first or self._held_from(first, marker):
            return
        gone_to = min(oldest, last)
        cursor = "none" if marker.cursor_sequence is None else str(marker.cursor_sequence)
        text = (
            f"topic {topic}: messages with sequence numbers {first} to {gone_to - 1} "
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
        for topic, entry in TopicBatch.parse(end).entries.items():
            if self._committed.get(topic) == entry.sequence:
                continue
            try:
                self.driver.connection.commit_cursor(topic, self.group, entry.sequence)
            except NotFound:
                log.warning(
                    "topic %s: the cursor of group %s is gone (deleted, or the topic was); the "
                    "next batch checks whether messages were lost",
                    topic,
                    self.group,
                )
                continue
            self._committed[topic] = entry.sequence

    def stop(self) -> None:
        self.driver.close()
