"""Streaming reads with a real local Spark and a real broker: queues by leases, topics by
sequence number, the broker's flow limit as admission control, Trigger.AvailableNow, and what a
replayed batch does with a lease that expired while the query was down."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from sluiceway.client.pipeline import LeaseState, OutgoingMessage, PipelineConnection
from sluiceway.spark.offsets import QueueOffset, lease_names
from sluiceway.testing import BrokerThread
from tests.spark.conftest import SPARK_WAIT, publish, settings, wait_for

pytestmark = pytest.mark.timeout(300)

# The "ticks" destinations cap their consumers' flow limit: the default maxMessagesPerTrigger.
TICKS_FLOW = 400


@pytest.fixture(scope="module")
def module_broker() -> Iterator[BrokerThread]:
    properties = {
        f"imq.destination.{kind}.ticks.consumerFlowLimit": str(TICKS_FLOW)
        for kind in ("queue", "topic")
    }
    with BrokerThread(properties) as broker:
        yield broker


def stream(
    spark: SparkSession, broker: BrokerThread, destination: str, **options: str
) -> DataFrame:
    reader = (
        spark.readStream.format("sluiceway")
        .option("port", str(broker.port))
        .option("destination", destination)
    )
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def to_parquet(frame: DataFrame, tmp_path: Path, name: str, **trigger: Any) -> StreamingQuery:
    return (
        frame.writeStream.format("parquet")
        .option("path", str(tmp_path / name / "out"))
        .option("checkpointLocation", str(tmp_path / name / "checkpoint"))
        .trigger(**(trigger or {"availableNow": True}))
        .start()
    )


def finish(query: StreamingQuery) -> list[int]:
    """Wait for an available-now query; the input rows of each of its batches."""
    assert query.awaitTermination(SPARK_WAIT), "the query did not end"
    assert query.exception() is None
    return [int(p["numInputRows"]) for p in query.recentProgress if p["numInputRows"]]


def parquet_texts(spark: SparkSession, path: Path) -> Counter[str]:
    return Counter(row.text for row in spark.read.parquet(str(path)).select("text").collect())


def last_offset(checkpoint: Path) -> dict[str, object]:
    """The source offset of the checkpoint's last batch (line 3 of offsets/N)."""
    offsets = checkpoint / "offsets"
    last = max((p for p in offsets.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    parsed = json.loads(last.read_text().splitlines()[2])
    assert isinstance(parsed, dict)
    return parsed


def test_queue_stream_reads_each_message_once_in_batches_of_at_most_the_limit(
    spark: SparkSession, module_broker: BrokerThread, tmp_path: Path
) -> None:
    publish(module_broker, "/queue/orders", 0, 10_000)
    frame = stream(
        spark, module_broker, "/queue/orders", group="orders-etl", maxMessagesPerTrigger="1000"
    )
    batches = finish(to_parquet(frame, tmp_path, "orders"))
    assert sum(batches) == 10_000
    assert max(batches) <= 1000
    assert len(batches) >= 10
    texts = parquet_texts(spark, tmp_path / "orders" / "out")
    assert texts == Counter(f"m{i}" for i in range(10_000))
    # Every lease was acknowledged, the last one too (Spark never calls commit() for it).
    offset = QueueOffset.parse(last_offset(tmp_path / "orders" / "checkpoint"), "/queue/orders")
    with PipelineConnection(settings(module_broker)) as connection:
        assert connection.head("/queue/orders").message_count == 0
        for name in lease_names("orders-etl", offset):
            read = connection.read_lease("/queue/orders", name)
            assert read.drain().lease_state is LeaseState.ACKNOWLEDGED


def batch_sizes(frame: DataFrame) -> tuple[StreamingQuery, list[tuple[int, int]]]:
    """An available-now query recording each batch's rows and body bytes."""
    seen: list[tuple[int, int]] = []

    def record(batch: DataFrame, _batch_id: int) -> None:
        row = batch.selectExpr("count(*) AS n", "coalesce(sum(length(body)), 0) AS b").first()
        assert row is not None
        if row.n:
            seen.append((int(row.n), int(row.b)))

    query = frame.writeStream.foreachBatch(record).trigger(availableNow=True).start()
    return query, seen


def test_no_batch_exceeds_its_caps_whatever_the_partitions(
    spark: SparkSession, module_broker: BrokerThread
) -> None:
    """Each partition's share is rounded up, and a lease takes a message over its byte share:
    the driver makes the batch's leases one after the other within what is left of its caps."""
    sizes = [40 + (i * 37) % 200 for i in range(2000)]
    for destination in ("/queue/capped.count", "/queue/capped.bytes"):
        with PipelineConnection(settings(module_broker)) as connection:
            connection.send_many(OutgoingMessage(destination, b"x" * size) for size in sizes)
    by_count = stream(
        spark,
        module_broker,
        "/queue/capped.count",
        group="capped",
        minPartitions="3",
        maxMessagesPerTrigger="700",
    )
    query, seen = batch_sizes(by_count)
    finish(query)
    assert sum(n for n, _ in seen) == 2000
    assert max(n for n, _ in seen) == 700  # not 702: three shares of 234
    by_bytes = stream(
        spark,
        module_broker,
        "/queue/capped.bytes",
        group="capped",
        minPartitions="3",
        maxMessagesPerTrigger="100000",
        maxBytesPerTrigger="10000",
    )
    query, seen = batch_sizes(by_bytes)
    finish(query)
    assert sum(n for n, _ in seen) == 2000
    assert sum(b for _, b in seen) == sum(sizes)
    assert max(b for _, b in seen) <= 10_000
    assert min(b for _, b in seen[:-1]) > 10_000 - 240  # full but for the next message


def test_a_new_checkpoint_numbers_leases_after_the_group_s_highest_not_by_the_clock(
    spark: SparkSession, module_broker: BrokerThread, tmp_path: Path
) -> None:
    """The numbers come from the broker's record of the group (`lease-high`), so no clock set
    back can make a new lease answer `expired`."""
    publish(module_broker, "/queue/renumbered", 0, 300)
    options = {"group": "renumbered", "maxMessagesPerTrigger": "100"}
    first = stream(spark, module_broker, "/queue/renumbered", **options)
    assert finish(to_parquet(first, tmp_path, "first")) == [100, 100, 100]
    used = QueueOffset.parse(last_offset(tmp_path / "first" / "checkpoint"), "/queue/renumbered")
    assert used.lease == 3  # numbered from 1: the group was new

    publish(module_broker, "/queue/renumbered", 300, 100)
    second = stream(spark, module_broker, "/queue/renumbered", **options)
    assert finish(to_parquet(second, tmp_path, "second")) == [100]
    again = QueueOffset.parse(last_offset(tmp_path / "second" / "checkpoint"), "/queue/renumbered")
    assert again.lease == 4
    texts = parquet_texts(spark, tmp_path / "second" / "out")
    assert texts == Counter(f"m{i}" for i in range(300, 400))


def test_topic_stream_reads_each_message_once_in_batches_of_at_most_the_limit(
    spark: SparkSession, module_broker: BrokerThread, tmp_path: Path
) -> None:
    with PipelineConnection(settings(module_broker)) as connection:
        connection.open_cursor("/topic/clicks", "clicks-etl", "earliest")
    publish(module_broker, "/topic/clicks", 0, 10_000)
    frame = stream(
        spark, module_broker, "/topic/clicks", group="clicks-etl", maxMessagesPerTrigger="1000"
    )
    batches = finish(to_parquet(frame, tmp_path, "clicks"))
    assert sum(batches) == 10_000
    assert max(batches) <= 1000
    rows = spark.read.parquet(str(tmp_path / "clicks" / "out")).collect()
    assert Counter(r.text for r in rows) == Counter(f"m{i}" for i in range(10_000))
    assert sorted(r.sequence for r in rows) == list(range(1, 10_001))
    first = min(rows, key=lambda r: r.sequence)
    assert first.headers["n"] == "0"
    assert first.destination == "/topic/clicks"
    assert first.body == b"m0"
    assert first.timestamp is not None
    assert first.expires is None
    assert first.redelivered is False


class Producer(threading.Thread):
    """Keeps sending to a destination until stopped; `sent` counts what the broker took."""

    def __init__(self, broker: BrokerThread, destination: str, start: int) -> None:
        super().__init__(daemon=True)
        self.broker = broker
        self.destination = destination
        self.sent = start
        self.stopping = threading.Event()

    def run(self) -> None:
        # About 2,000 messages a second: enough to outrun the query's start, gentle enough to
        # leave the two cores to Spark (the broker runs in this process too).
        while not self.stopping.wait(0.025):
            publish(self.broker, self.destination, self.sent, 50)
            self.sent += 50

    def stop(self) -> int:
        self.stopping.set()
        self.join(SPARK_WAIT)
        return self.sent


@pytest.mark.parametrize("destination", ["/topic/ticks", "/queue/ticks"])
def test_available_now_stops_at_the_head_recorded_at_start_in_batches_of_the_flow_limit(
    spark: SparkSession, module_broker: BrokerThread, tmp_path: Path, destination: str
) -> None:
    """No maxMessagesPerTrigger: the destination's consumer flow limit bounds each batch."""
    group = "ticks-" + destination.split("/")[1]
    if destination.startswith("/topic/"):
        with PipelineConnection(settings(module_broker)) as connection:
            connection.open_cursor(destination, group, "earliest")
    publish(module_broker, destination, 0, 1000)
    producer = Producer(module_broker, destination, 1000)
    producer.start()
    try:
        wait_for(lambda: producer.sent > 1500, "the producer to get going")
        frame = stream(spark, module_broker, destination, group=group, minPartitions="2")
        query = to_parquet(frame, tmp_path, "ticks")
        batches = finish(query)
        sent_at_end = producer.sent
        assert producer.is_alive(), "the producer stopped before the query: nothing was shown"
    finally:
        sent = producer.stop()
    read = sum(batches)
    assert max(batches) <= TICKS_FLOW
    assert len(batches) >= 4
    assert 1500 <= read < sent_at_end <= sent
    texts = parquet_texts(spark, tmp_path / "ticks" / "out")
    assert sum(texts.values()) == read
    assert max(texts.values()) == 1
    if destination.startswith("/topic/"):
        # Exactly the messages up to the recorded head, none after it.
        assert set(texts) == {f"m{i}" for i in range(read)}


def run_until_failure(frame: DataFrame, checkpoint: Path, seen: list[Any]) -> StreamingQuery:
    def fail_after_reading(batch: DataFrame, batch_id: int) -> None:
        seen.extend(batch.collect())  # reads (creates) the batch's lease
        raise RuntimeError(f"batch {batch_id} fails on purpose, after its read")

    return (
        frame.writeStream.foreachBatch(fail_after_reading)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def collect_batches(frame: DataFrame, checkpoint: Path, seen: list[Any]) -> StreamingQuery:
    def keep(batch: DataFrame, batch_id: int) -> None:
        seen.extend(batch.collect())

    return (
        frame.writeStream.foreachBatch(keep)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def test_a_lease_expired_while_the_query_was_down_fails_or_is_skipped(
    spark: SparkSession, module_broker: BrokerThread, tmp_path: Path
) -> None:
    queue = "/queue/expiring"
    publish(module_broker, queue, 0, 40)
    checkpoint = tmp_path / "checkpoint"
    options = {"group": "expiring", "leaseTtlSec": "1", "maxMessagesPerTrigger": "100"}
    first: list[Any] = []
    query = run_until_failure(stream(spark, module_broker, queue, **options), checkpoint, first)
    with pytest.raises(StreamingQueryException):
        query.awaitTermination(SPARK_WAIT)
    assert len(first) == 40
    # The "outage": the lease expires and its messages go back to the queue.
    with PipelineConnection(settings(module_broker)) as connection:
        wait_for(lambda: connection.head(queue).message_count == 40, "the lease to expire")

    replayed: list[Any] = []
    failing = collect_batches(stream(spark, module_broker, queue, **options), checkpoint, replayed)
    with pytest.raises(StreamingQueryException) as failed:
        failing.awaitTermination(SPARK_WAIT)
    assert "expired before its batch was committed" in str(failed.value)
    assert "onExpiredLease=skip" in str(failed.value)
    assert replayed == []

    skipping = collect_batches(
        stream(spark, module_broker, queue, onExpiredLease="skip", **options),
        checkpoint,
        replayed,
    )
    assert skipping.awaitTermination(SPARK_WAIT)
    assert skipping.exception() is None
    assert sorted(r.text for r in replayed) == sorted(f"m{i}" for i in range(40))
    assert all(r.redelivered for r in replayed)
