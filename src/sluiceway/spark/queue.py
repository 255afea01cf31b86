"""Streaming from queues: durable numbered leases, acknowledged once Spark has committed.

A queue has no position to replay from: a message read is gone for everyone else. So a batch
reads leases (pipelines-protocol.md, "Queue leases"): `latestOffset` plans the next batch as
lease numbers and caps, per queue; `partitions` makes the leases, one after the other, each
within what the ones before left of the batch's caps (`maxMessagesPerTrigger`,
`maxBytesPerTrigger`, shared among the queues as `sharing` says), so a batch never exceeds them
however many queues and partitions it has; the tasks read them, and every later read (a replay
after a crash, a retried task) returns the same messages. Spark's commit acknowledges the
leases, and their messages are consumed.

Acknowledging waits until Spark has committed the batch: Spark writes `commits/N` before it
plans batch N+1, so the leases of the batch that ends at `start` are acknowledged in
`latestOffset(start)` and `partitions(start, end)` as well as in `commit(end)` (which comes one
batch late, and never for the last batch of a run). Otherwise the last lease of a stream that
goes idle would expire and its messages come back as duplicates.

A queue the query has no position for (a new checkpoint, or a queue a pattern matches for the
first time) numbers its leases after the highest number its lease groups used before, as the
broker reports it (`lease-high`): the broker makes a lease only above those, and no clock is
involved. A broker that predates that report (and making leases without reading them) gets the
older scheme: numbers from its clock in milliseconds times 1000, leases made by their first
read, each within an equal share of the caps. A queue that is gone is dropped from the offsets.
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
from sluiceway.spark.offsets import (
    LeasePartition,
    QueueBatch,
    QueueOffset,
    lease_group,
    lease_names,
)
from sluiceway.spark.options import ExpiredLeasePolicy, SourceOptions
from sluiceway.spark.reading import Caps, DriverSide, flow_limit
from sluiceway.spark.sharing import fair_shares, rotated, spread

log = logging.getLogger("sluiceway.spark")

# The most messages one lease is asked for: the broker's default imq.lease.max_messages. A batch
# bigger than that (ReadAllAvailable over a long backlog) uses several leases per partition.
LEASE_CHUNK: Final = 100_000
_LEASES_PER_MS: Final = 1000


class QueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """`readStream.format("sluiceway")` on `/queue/NAME` (or several, or a pattern)."""

    def __init__(self, options: SourceOptions) -> None:
        # No I/O here: Spark builds the reader twice per query (runner and planner).
        self.options = options
        self.group = options.stream_group()
        options.stream_starting()  # refuses a starting position a queue does not have
        self.driver = DriverSide(options)
        self._initial: QueueBatch | None = None
        # Trigger.AvailableNow: each queue's head-sequence at start (only those are read).
        self._targets: dict[str, int] | None = None
        self._acked: dict[str, int] = {}  # per queue, the last lease number acknowledged here
        self._makes_leases: bool | None = None  # the broker makes leases for the driver
        self._latest: dict[str, object] | None = None  # what waited, for Spark's progress

    # -- positions -------------------------------------------------------------------------------

    def initialOffset(self) -> dict[str, object]:
        # Spark asks twice on a fresh query: computed once, so both answers agree.
        if self._initial is None:
            queues = self.driver.resolve()
            self._initial = QueueBatch({q: self._first_position(q) for q in queues})
        return self._initial.to_json()

    def _first_position(self, queue: str) -> QueueOffset:
        """Where `queue`'s lease numbers start when the query has no position for it."""
        base = self._highest_used(queue)
        if base is None:
            base = _broker_clock_ms(self._head(queue)) * _LEASES_PER_MS
        log.info("queue %s, group %s: leases start after number %d", queue, self.group, base)
        return QueueOffset(queue, base, 0, 0, 0, 0)

    def _highest_used(self, queue: str) -> int | None:
        """The highest lease number this query's lease groups used on `queue` (0 when none
        did); None when the broker does not say (it predates `lease-high`)."""
        connection, highest = self.driver.connection, 0
        for partition in range(self.options.min_partitions):
            name = f"{lease_group(self.group, partition)}/0"
            end = connection.read_lease(queue, name, create=False, messages=False)
            marker = end.drain()
            self._makes_leases = marker.lease_high is not None
            if marker.lease_high is None:
                return None
            highest = max(highest, marker.lease_high)
        return highest

    def _head(self, queue: str) -> EndMarker:
        marker = self.driver.head(queue)
        if marker.message_count is None:
            raise UnsupportedBroker(
                f"the broker at {self.options.connection.host}:{self.options.connection.port} "
                "does not report message-count on an end marker: it predates queue leases "
                "(pipelines-protocol.md), which a queue stream needs"
            )
        return marker

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.driver.default_messages())

    def prepareForTriggerAvailableNow(self) -> None:
        # The last sequence number handed out when the run starts: the run ends once no
        # message up to it waits. Counting messages instead would be thrown off by leases that
        # take fewer than planned (imq.lease.max_bytes).
        queues = self.driver.resolve()
        self._targets = {q: self._head(q).head_sequence for q in queues}
        log.info("queues: available-now run up to sequences %s", self._targets)

    def reportLatestOffset(self) -> dict[str, object] | None:
        """The messages waiting in each queue when the last batch was planned (`waiting`, that
        batch's included): Spark shows it as the source's `latestOffset` in its progress."""
        return self._latest

    def latestOffset(self, start: dict[str, object], limit: ReadLimit) -> dict[str, object]:
        begin = QueueBatch.parse(start)
        self._acknowledge(begin)
        queues = self.driver.resolve()
        if self._targets is not None:
            queues = [q for q in queues if q in self._targets]
        caps = self.driver.caps(limit)
        markers = {q: self._head(q) for q in queues}
        self._latest = {
            "destinations": {q: {"waiting": m.message_count or 0} for q, m in markers.items()}
        }
        demands = {q: self._demand(q, markers[q], caps) for q in queues}
        shares = fair_shares(demands, caps.messages, begin.turn)
        if set(queues) == set(begin.entries) and not any(shares.values()):
            return start
        parts = spread(self.options.min_partitions, shares)
        planned = {}
        for queue in queues:
            known = begin.entries.get(queue) or self._first_position(queue)
            planned[queue] = self._plan(known, shares[queue], parts.get(queue, 0))
        return self._batch(planned, caps.bytes, begin.turn + 1).to_json()

    def _demand(self, queue: str, marker: EndMarker, caps: Caps) -> int:
        """How many messages `queue` may give the next batch."""
        waiting = marker.message_count or 0
        if caps.flow_limited:
            waiting = min(waiting, flow_limit(marker))
        if self._targets is not None:
            # A queue is read oldest first: at most the messages from the oldest waiting one
            # up to the recorded head (fewer if some were consumed by others meanwhile).
            first, target = marker.first_sequence, self._targets[queue]
            if first is None or first > target:
                return 0
            waiting = min(waiting, target - first + 1)
        return waiting

    def _plan(self, begin: QueueOffset, total: int, partitions: int) -> QueueOffset:
        """Leases for `total` messages of one queue: spread over `partitions` lease groups,
        each under LEASE_CHUNK (none when `total` is 0)."""
        queue = begin.destination
        if total == 0 or partitions == 0:
            return QueueOffset(queue, begin.lease, 0, 0, 0, 0)
        per_partition = math.ceil(total / partitions)
        leases = math.ceil(per_partition / LEASE_CHUNK)
        size = math.ceil(per_partition / leases)
        if self._makes_leases is None:
            self._highest_used(queue)  # asks the broker what it supports
        made_total = total if self._makes_leases else None
        return QueueOffset(queue, begin.lease + leases, leases, partitions, size, 0, made_total)

    def _batch(
        self, planned: dict[str, QueueOffset], max_bytes: int | None, turn: int
    ) -> QueueBatch:
        """The batch of the queues' plans, with its byte cap: for the whole batch when the driver
        makes the leases, else an equal share for each lease."""
        batch_bytes = 0 if max_bytes is None else max_bytes
        if max_bytes is not None and not self._makes_leases:
            leases = sum(entry.leases * entry.partitions for entry in planned.values())
            batch_bytes = max(1, max_bytes // max(1, leases))
        return QueueBatch(planned, batch_bytes, turn)

    # -- batches ---------------------------------------------------------------------------------

    def partitions(
        self, start: dict[str, object], end: dict[str, object]
    ) -> Sequence[InputPartition]:
        batch = QueueBatch.parse(end)
        leased = batch.leased()
        if start == end or not leased:
            return []
        self._acknowledge(QueueBatch.parse(start))
        made = batch.made
        if made:
            self._make_leases(batch)
        return [
            LeasePartition(
                entry.destination,
                lease_group(self.group, partition),
                entry.lease_numbers().start,
                entry.lease,
                entry.size,
                batch.bytes,
                made,
            )
            for entry in leased
            for partition in range(entry.partitions)
        ]

    def _make_leases(self, batch: QueueBatch) -> None:
        """Make the batch's leases in order, queue after queue (in the order of the batch's
        turn), each within what the ones before left of its caps: a queue at most its `total`
        messages and an equal share of the bytes the queues before it left (a replay finds the
        leases made, with the same messages, and the same caps left). The first lease that
        takes a message may take one over the byte cap, so that a message larger than it is
        read; the others never go over. Leases the caps left nothing for are not made: their
        reads find them `unread`, and read nothing."""
        order = rotated(batch.leased(), batch.turn)
        left = batch.bytes or None
        first = True
        for index, entry in enumerate(order):
            share = None if left is None else left // (len(order) - index)
            used, took = self._make_queue_leases(entry, share, first=first)
            first = first and not took
            if left is not None:
                left -= used

    def _make_queue_leases(
        self, entry: QueueOffset, share: int | None, *, first: bool
    ) -> tuple[int, bool]:
        """Make one queue's leases of a batch within `total` messages and `share` bytes; the
        bytes they took, and whether they took a message."""
        assert entry.total is not None
        connection = self.driver.connection
        messages, size_left, used, took = entry.total, share, 0, False
        for name in lease_names(self.group, entry):
            out_of_bytes = size_left is not None and size_left <= 0
            if messages <= 0 or (out_of_bytes and not (first and not took)):
                break
            read = connection.read_lease(
                entry.destination,
                name,
                max_messages=min(entry.size, messages),
                max_bytes=None if size_left is None else max(1, size_left),
                ttl_ms=self.options.lease_ttl_ms,
                strict_bytes=not (first and not took),
                messages=False,
            )
            end = read.drain()
            if end.lease_state is LeaseState.OPEN:
                messages -= end.lease_count or 0
                used += end.lease_bytes or 0
                took = took or bool(end.lease_count)
                if size_left is not None:
                    size_left -= end.lease_bytes or 0
        return used, took

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, LeasePartition)
        return read_lease_rows(self.options, partition)

    def commit(self, end: dict[str, object]) -> None:
        self._acknowledge(QueueBatch.parse(end))

    def _acknowledge(self, batch: QueueBatch) -> None:
        """Acknowledge the leases of the batch that ends at `batch` (Spark committed it)."""
        for entry in batch.leased():
            if entry.lease <= self._acked.get(entry.destination, -1):
                continue
            self._acknowledge_queue(entry)
            self._acked[entry.destination] = entry.lease

    def _acknowledge_queue(self, entry: QueueOffset) -> None:
        queue, connection = entry.destination, self.driver.connection
        for name in lease_names(self.group, entry):
            try:
                state = connection.ack_lease(queue, name)
            except NotFound:
                continue  # never made (the batch's caps left nothing for it), or queue gone
            except Unavailable:
                # Its member could not be reached within failoverDeadlineSec: stop, rather than
                # leave the lease to expire and its messages to be read twice. A restarted
                # query acknowledges the leases of its last committed batch again.
                raise
            except BrokerError as exc:
                log.warning("queue %s: acknowledging lease %s failed: %s", queue, name, exc)
                continue
            if state is LeaseState.EXPIRED:
                log.warning(
                    "queue %s: lease %s expired before Spark committed its batch; its messages "
                    "went back to the queue and will be read again (raise leaseTtlSec)",
                    queue,
                    name,
                )

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
