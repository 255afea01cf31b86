"""Streaming from a queue: durable numbered leases, acknowledged once Spark has committed.

A queue has no position to replay from: a message read is gone for everyone else. So a batch
reads leases (pipelines-protocol.md, "Queue leases"): `latestOffset` plans the next batch as
lease numbers and sizes; the first read() of a lease creates it, taking up to its size from the
queue, and every later read (a replay after a crash, a retried task) returns the same messages.
Spark's commit acknowledges the leases, and their messages are consumed.

Acknowledging waits until Spark has committed the batch: Spark writes `commits/N` before it
plans batch N+1, so the leases of the batch that ends at `start` are acknowledged in
`latestOffset(start)` and `partitions(start, end)` as well as in `commit(end)` (which comes one
batch late, and never for the last batch of a run). Otherwise the last lease of a stream that
goes idle would expire and its messages come back as duplicates.

Lease numbers of a query start at the broker's clock in milliseconds times 1000 when it starts
with a new checkpoint: above every number an earlier query of the same group used (the broker
creates a lease only above those), without asking the broker for them.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator, Sequence
from typing import Final

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from sluiceway.client.pipeline import EndMarker, LeaseState, PipelineConnection
from sluiceway.errors import BrokerError, Unavailable
from sluiceway.spark.errors import LeaseExpiredError, UnsupportedBroker
from sluiceway.spark.offsets import LeasePartition, QueueOffset, lease_group, lease_names
from sluiceway.spark.options import ExpiredLeasePolicy, SourceOptions
from sluiceway.spark.reading import DriverSide
from sluiceway.spark.rows import SourceRow, message_row

log = logging.getLogger("sluiceway.spark")

# The most messages one lease is asked for: the broker's default imq.lease.max_messages. A batch
# bigger than that (ReadAllAvailable over a long backlog) uses several leases per partition.
LEASE_CHUNK: Final = 100_000
_LEASES_PER_MS: Final = 1000


class QueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """`readStream.format("sluiceway")` on `/queue/NAME`."""

    def __init__(self, options: SourceOptions) -> None:
        # No I/O here: Spark builds the reader twice per query (runner and planner).
        self.options = options
        self.group = options.stream_group()
        options.stream_starting()  # refuses a starting position a queue does not have
        self.driver = DriverSide(options)
        self.destination = options.destination.path
        self._initial: QueueOffset | None = None
        self._target: int | None = None  # Trigger.AvailableNow: the head-sequence at start
        self._acked_through: int | None = None  # the last lease number acknowledged here

    # -- positions -------------------------------------------------------------------------------

    def initialOffset(self) -> dict[str, object]:
        # Spark asks twice on a fresh query: computed once, so both answers agree.
        if self._initial is None:
            marker = self._head()
            base = _broker_clock_ms(marker) * _LEASES_PER_MS
            self._initial = QueueOffset(self.destination, base, 0, 0, 0, 0)
            log.info(
                "queue %s, group %s: leases start after number %d",
                self.destination,
                self.group,
                base,
            )
        return self._initial.to_json()

    def _head(self) -> EndMarker:
        marker = self.driver.head()
        if marker.message_count is None:
            raise UnsupportedBroker(
                f"the broker at {self.options.connection.host}:{self.options.connection.port} "
                "does not report message-count on an end marker: it predates queue leases "
                "(pipelines-protocol.md), which a queue stream needs"
            )
        return marker

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.driver.max_messages())

    def prepareForTriggerAvailableNow(self) -> None:
        # The last sequence number handed out when the run starts: the run ends once no
        # message up to it waits. Counting messages instead would be thrown off by leases that
        # take fewer than planned (imq.lease.max_bytes).
        self._target = self._head().head_sequence
        log.info("queue %s: available-now run up to sequence %d", self.destination, self._target)

    def latestOffset(self, start: dict[str, object], limit: ReadLimit) -> dict[str, object]:
        begin = QueueOffset.parse(start, self.destination)
        self._acknowledge(begin)
        marker = self._head()
        waiting = marker.message_count or 0
        if waiting == 0:
            return start
        caps = self.driver.caps(limit)
        total = waiting if caps.messages is None else min(waiting, caps.messages)
        if self._target is not None:
            # A queue is read oldest first: at most the messages from the oldest waiting one
            # up to the recorded head (fewer if some were consumed by others meanwhile).
            first = marker.first_sequence
            if first is None or first > self._target:
                return start
            total = min(total, self._target - first + 1)
        return self._plan(begin, total, caps.bytes).to_json()

    def _plan(self, begin: QueueOffset, total: int, max_bytes: int | None) -> QueueOffset:
        """Leases for `total` messages: spread over the partitions, each under LEASE_CHUNK."""
        partitions = max(1, min(self.options.min_partitions, total))
        per_partition = math.ceil(total / partitions)
        leases = math.ceil(per_partition / LEASE_CHUNK)
        size = math.ceil(per_partition / leases)
        lease_bytes = 0 if max_bytes is None else max(1, max_bytes // (partitions * leases))
        return QueueOffset(
            self.destination, begin.lease + leases, leases, partitions, size, lease_bytes
        )

    # -- batches ---------------------------------------------------------------------------------

    def partitions(
        self, start: dict[str, object], end: dict[str, object]
    ) -> Sequence[InputPartition]:
        last = QueueOffset.parse(end, self.destination)
        if start == end or last.leases == 0:
            return []
        self._acknowledge(QueueOffset.parse(start, self.destination))
        numbers = last.lease_numbers()
        return [
            LeasePartition(
                self.destination,
                lease_group(self.group, partition),
                numbers.start,
                numbers.stop - 1,
                last.size,
                last.bytes,
            )
            for partition in range(last.partitions)
        ]

    def read(self, partition: InputPartition) -> Iterator[SourceRow]:
        assert isinstance(partition, LeasePartition)
        return read_lease_rows(self.options, partition)

    def commit(self, end: dict[str, object]) -> None:
        self._acknowledge(QueueOffset.parse(end, self.destination))

    def _acknowledge(self, offset: QueueOffset) -> None:
        """Acknowledge the leases of the batch that ends at `offset` (Spark committed it)."""
        if offset.leases == 0:
            return
        if self._acked_through is not None and offset.lease <= self._acked_through:
            return
        connection = self.driver.connection
        for name in lease_names(self.group, offset):
            try:
                state = connection.ack_lease(self.destination, name)
            except Unavailable:
                # Its member could not be reached within failoverDeadlineSec: stop, rather than
                # leave the lease to expire and its messages to be read twice. A restarted
                # query acknowledges the leases of its last committed batch again.
                raise
            except BrokerError as exc:
                log.warning(
                    "queue %s: acknowledging lease %s failed: %s", self.destination, name, exc
                )
                continue
            if state is LeaseState.EXPIRED:
                log.warning(
                    "queue %s: lease %s expired before Spark committed its batch; its messages "
                    "went back to the queue and will be read again (raise leaseTtlSec)",
                    self.destination,
                    name,
                )
        self._acked_through = offset.lease

    def stop(self) -> None:
        self.driver.close()


def _broker_clock_ms(marker: EndMarker) -> int:
    """The broker's clock, from the end marker's `timestamp` (this machine's clock if absent):
    a restarted driver on another machine still numbers its leases after the previous one's."""
    text = marker.headers.get("timestamp", "")
    return int(text) if text.isdigit() else time.time_ns() // 1_000_000


def read_lease_rows(options: SourceOptions, partition: LeasePartition) -> Iterator[SourceRow]:
    """Executor side: the messages of the partition's leases, in order, as rows."""
    destination = partition.destination
    with PipelineConnection(options.connection) as connection:
        for number in range(partition.first, partition.last + 1):
            name = f"{partition.group}/{number}"
            read = connection.read_lease(
                destination,
                name,
                max_messages=partition.size,
                max_bytes=partition.bytes or None,
                ttl_ms=options.lease_ttl_ms,
            )
            for message in read:
                if message.headers.get("lease") != name:
                    raise UnsupportedBroker(
                        f"the broker answered a read of lease {name} with a plain delivery: it "
                        "does not support queue leases (pipelines-protocol.md)"
                    )
                yield message_row(message, options.include_headers)
            assert read.end is not None
            _check_lease_end(options, destination, name, read.end)


def _check_lease_end(options: SourceOptions, destination: str, name: str, end: EndMarker) -> None:
    if end.lease_state is LeaseState.ACKNOWLEDGED:
        # Spark only replays batches it has not committed, and the leases of a batch are
        # acknowledged after its commit: this is a checkpoint edited by hand.
        log.info("queue %s: lease %s was acknowledged before; nothing to read", destination, name)
    elif end.lease_state is LeaseState.EXPIRED:
        text = (
            f"queue {destination}: lease {name} expired before its batch was committed (the "
            "query was down longer than its time to live, leaseTtlSec); its messages went back "
            "to the queue and will be delivered again, marked redelivered"
        )
        if options.on_expired_lease is ExpiredLeasePolicy.FAIL:
            raise LeaseExpiredError(
                text + ". Set onExpiredLease=skip to go on: they are then read in a later batch "
                "(at least once)"
            )
        log.warning("%s; skipped (onExpiredLease=skip)", text)
    elif end.lease_state is None:
        raise UnsupportedBroker(
            f"the broker's answer to a read of lease {name} has no lease-state: it does not "
            "support queue leases (pipelines-protocol.md)"
        )
