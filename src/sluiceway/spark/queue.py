"""Streaming from a queue: durable numbered leases, acknowledged once Spark has committed.

A queue has no position to replay from: a message read is gone for everyone else. So a batch
reads leases (pipelines-protocol.md, "Queue leases"): `latestOffset` plans the next batch as
lease numbers and caps; `partitions` makes the leases, one after the other, each within what
the ones before left of the batch's caps (`maxMessagesPerTrigger`, `maxBytesPerTrigger`), so a
batch never exceeds them however many partitions it has; the tasks read them, and every later
read (a replay after a crash, a retried task) returns the same messages. Spark's commit
acknowledges the leases, and their messages are consumed.

Acknowledging waits until Spark has committed the batch: Spark writes `commits/N` before it
plans batch N+1, so the leases of the batch that ends at `start` are acknowledged in
`latestOffset(start)` and `partitions(start, end)` as well as in `commit(end)` (which comes one
batch late, and never for the last batch of a run). Otherwise the last lease of a stream that
goes idle would expire and its messages come back as duplicates.

A query with a new checkpoint numbers its leases after the highest number its lease groups used
before, as the broker reports it (`lease-high`): the broker makes a lease only above those, and
no clock is involved. A broker that predates that report (and making leases without reading
them) gets the older scheme: numbers from its clock in milliseconds times 1000, leases made by
their first read, each within an equal share of the caps.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator, Sequence
from typing import Final

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from sluiceway.client.pipeline import EndMarker, LeaseState, PipelineConnection
from sluiceway.client.pipeline_packs import MessagePack
from sluiceway.errors import BrokerError, NotFound, Unavailable
from sluiceway.spark.arrow_rows import PACK, pack_batches
from sluiceway.spark.errors import LeaseExpiredError, UnsupportedBroker
from sluiceway.spark.offsets import LeasePartition, QueueOffset, lease_group, lease_names
from sluiceway.spark.options import ExpiredLeasePolicy, SourceOptions
from sluiceway.spark.reading import DriverSide

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
        self._makes_leases: bool | None = None  # the broker makes leases for the driver

    # -- positions -------------------------------------------------------------------------------

    def initialOffset(self) -> dict[str, object]:
        # Spark asks twice on a fresh query: computed once, so both answers agree.
        if self._initial is None:
            base = self._highest_used()
            if base is None:
                base = _broker_clock_ms(self._head()) * _LEASES_PER_MS
            self._initial = QueueOffset(self.destination, base, 0, 0, 0, 0)
            log.info(
                "queue %s, group %s: leases start after number %d",
                self.destination,
                self.group,
                base,
            )
        return self._initial.to_json()

    def _highest_used(self) -> int | None:
        """The highest lease number this query's lease groups used (0 when none did); None
        when the broker does not say (it predates `lease-high`)."""
        connection, highest = self.driver.connection, 0
        for partition in range(self.options.min_partitions):
            name = f"{lease_group(self.group, partition)}/0"
            end = connection.read_lease(self.destination, name, create=False, messages=False)
            marker = end.drain()
            self._makes_leases = marker.lease_high is not None
            if marker.lease_high is None:
                return None
            highest = max(highest, marker.lease_high)
        return highest

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
        if self._makes_leases is None:
            self._highest_used()  # asks the broker what it supports
        if self._makes_leases:
            batch_bytes = 0 if max_bytes is None else max_bytes
            return QueueOffset(
                self.destination, begin.lease + leases, leases, partitions, size, batch_bytes, total
            )
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
        made = last.total is not None
        if made:
            self._make_leases(last)
        numbers = last.lease_numbers()
        return [
            LeasePartition(
                self.destination,
                lease_group(self.group, partition),
                numbers.start,
                numbers.stop - 1,
                last.size,
                last.bytes,
                made,
            )
            for partition in range(last.partitions)
        ]

    def _make_leases(self, offset: QueueOffset) -> None:
        """Make the batch's leases in order, each within what the ones before left of its caps
        (a replay finds them made, with the same messages, and the same caps left). The first
        may take one message over the byte cap, so that a message larger than it is read; the
        others never go over. Leases the caps left nothing for are not made: their reads find
        them `unread`, and read nothing."""
        assert offset.total is not None
        connection = self.driver.connection
        messages, size_left = offset.total, offset.bytes or None
        first = True
        for name in lease_names(self.group, offset):
            if messages <= 0 or (size_left is not None and size_left <= 0):
                return
            read = connection.read_lease(
                self.destination,
                name,
                max_messages=min(offset.size, messages),
                max_bytes=size_left,
                ttl_ms=self.options.lease_ttl_ms,
                strict_bytes=not first,
                messages=False,
            )
            end = read.drain()
            first = False
            if end.lease_state is LeaseState.OPEN:
                messages -= end.lease_count or 0
                if size_left is not None:
                    size_left -= end.lease_bytes or 0

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
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
            except NotFound:
                continue  # never made: the batch's caps left nothing for it
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


def read_lease_rows(options: SourceOptions, partition: LeasePartition) -> Iterator[pa.RecordBatch]:
    """Executor side: the messages of the partition's leases, in order, as record batches."""
    return pack_batches(_lease_packs(options, partition), options.include_headers)


def _lease_packs(options: SourceOptions, partition: LeasePartition) -> Iterator[MessagePack]:
    destination = partition.destination
    with PipelineConnection(options.connection) as connection:
        for number in range(partition.first, partition.last + 1):
            name = f"{partition.group}/{number}"
            if partition.made:  # made by the driver: never made here
                read = connection.read_lease(destination, name, create=False, pack=PACK)
            else:
                read = connection.read_lease(
                    destination,
                    name,
                    max_messages=partition.size,
                    max_bytes=partition.bytes or None,
                    ttl_ms=options.lease_ttl_ms,
                    pack=PACK,
                )
            for pack in read.packs():
                if dict(pack.shared).get("lease") != name:
                    raise UnsupportedBroker(
                        f"the broker answered a read of lease {name} with a plain delivery: it "
                        "does not support queue leases (pipelines-protocol.md)"
                    )
                yield pack
            assert read.end is not None
            _check_lease_end(options, destination, name, read.end)


def _check_lease_end(options: SourceOptions, destination: str, name: str, end: EndMarker) -> None:
    if end.lease_state is LeaseState.UNREAD:
        log.debug("queue %s: lease %s was not made (the batch's caps were used)", destination, name)
    elif end.lease_state is LeaseState.ACKNOWLEDGED:
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
