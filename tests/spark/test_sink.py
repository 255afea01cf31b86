"""Writing with a real local Spark and a real broker: the streaming sink's exactly-once commit
across a replayed batch, batch writes and reads, producer flow control, column checks."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.errors.exceptions.captured import CapturedException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from sluiceway.client.pipeline import (
    OutgoingMessage,
    PipelineConnection,
    PipelineSettings,
    StageState,
)
from sluiceway.client.producer import RetryPolicy
from sluiceway.testing import BrokerThread
from tests.spark.conftest import SPARK_WAIT, publish, settings

pytestmark = pytest.mark.timeout(300)

SMALL_QUEUE = "/queue/small"


@pytest.fixture(scope="module")
def module_broker() -> Iterator[BrokerThread]:
    with BrokerThread({"imq.destination.queue.small.maxNumMsgs": "5"}) as broker:
        yield broker


def texts(broker: BrokerThread, destination: str) -> Counter[str]:
    with PipelineConnection(settings(broker)) as connection:
        return Counter(m.text for m in connection.read_range(destination, 0, None))


def replay_query(
    spark: SparkSession, broker: BrokerThread, guarantee: str, checkpoint: Path
) -> StreamingQuery:
    source = (
        spark.readStream.format("sluiceway")
        .option("port", str(broker.port))
        .option("destination", f"/topic/feed-{guarantee}")
        .option("group", "feed")
        .option("maxMessagesPerTrigger", "1000")
        .load()
    )
    return (
        source.writeStream.format("sluiceway")
        .option("port", str(broker.port))
        .option("destination", f"/queue/sunk-{guarantee}")
        .option("deliveryGuarantee", guarantee)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def run(query: StreamingQuery) -> list[tuple[int, int]]:
    """Wait for an available-now query: (batch id, input rows) of each batch it ran."""
    assert query.awaitTermination(SPARK_WAIT), "the query did not end"
    assert query.exception() is None
    return [(int(p["batchId"]), int(p["numInputRows"])) for p in query.recentProgress]


@pytest.mark.parametrize(("guarantee", "duplicates"), [("exactlyOnce", 0), ("atLeastOnce", 1000)])
def test_a_batch_replayed_after_the_sinks_commit_is_published_once(
    spark: SparkSession,
    module_broker: BrokerThread,
    tmp_path: Path,
    guarantee: str,
    duplicates: int,
) -> None:
    with PipelineConnection(settings(module_broker)) as connection:
        connection.open_cursor(f"/topic/feed-{guarantee}", "feed", "earliest")
    publish(module_broker, f"/topic/feed-{guarantee}", 0, 3000)
    checkpoint = tmp_path / "checkpoint"
    first = replay_query(spark, module_broker, guarantee, checkpoint)
    assert run(first) == [(0, 1000), (1, 1000), (2, 1000)]
    sunk = f"/queue/sunk-{guarantee}"
    assert texts(module_broker, sunk) == Counter(f"m{i}" for i in range(3000))

    # A crash after the sink's commit of batch 2 and before Spark's own: commits/2 is missing.
    (checkpoint / "commits" / "2").unlink()
    (checkpoint / "commits" / ".2.crc").unlink(missing_ok=True)  # Hadoop's checksum beside it
    second = replay_query(spark, module_broker, guarantee, checkpoint)
    assert run(second) == [(2, 1000)]  # Spark ran batch 2 again...
    assert (checkpoint / "commits" / "2").exists()
    published = texts(module_broker, sunk)
    assert set(published) == {f"m{i}" for i in range(3000)}
    assert sum(published.values()) == 3000 + duplicates  # ...and the sink published it once
    if guarantee == "exactlyOnce":
        # The sink's name came from the checkpoint: `spark-` and the query's id.
        with PipelineConnection(settings(module_broker)) as connection:
            probe = connection.commit_stage(f"spark-{first.id}", 2, ["probe"])
        assert probe.state is StageState.COMMITTED_BEFORE


def sample(spark: SparkSession, count: int) -> DataFrame:
    rows = [(f"b{i}", {"k": str(i)}, i % 10) for i in range(count)]
    return spark.createDataFrame(rows, "body string, headers map<string,string>, priority int")


def read_batch(
    spark: SparkSession, broker: BrokerThread, destination: str, **options: str
) -> DataFrame:
    reader = (
        spark.read.format("sluiceway")
        .option("port", str(broker.port))
        .option("destination", destination)
    )
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def test_batch_write_publishes_every_row_and_batch_read_consumes_nothing(
    spark: SparkSession, module_broker: BrokerThread
) -> None:
    sample(spark, 500).repartition(3).write.format("sluiceway").option(
        "port", str(module_broker.port)
    ).option("destination", "/queue/table").mode("append").save()

    rows = read_batch(spark, module_broker, "/queue/table").collect()
    assert sorted(r.text for r in rows) == sorted(f"b{i}" for i in range(500))
    for row in rows:
        number = int(row.text[1:])
        assert row.headers == {"k": str(number), "content-type": "text/plain;charset=utf-8"}
        assert row.priority == number % 10
        assert row.persistent is True
    # Reading consumed nothing; a range reads exactly its sequence numbers, in parallel.
    assert read_batch(spark, module_broker, "/queue/table").count() == 500
    ranged = read_batch(
        spark,
        module_broker,
        "/queue/table",
        startingOffsets="100",
        endingOffsets="200",
        minPartitions="3",
    )
    assert ranged.rdd.getNumPartitions() == 3
    assert sorted(r.sequence for r in ranged.select("sequence").collect()) == list(range(100, 200))


def test_rows_can_name_their_destination_priority_and_persistence(
    spark: SparkSession, module_broker: BrokerThread
) -> None:
    rows = [(b"x", "/queue/left", False), (b"y", "/queue/right", True), (b"z", "/queue/left", True)]
    frame = spark.createDataFrame(rows, "body binary, destination string, persistent boolean")
    frame.write.format("sluiceway").option("port", str(module_broker.port)).mode("append").save()
    left = read_batch(spark, module_broker, "/queue/left").collect()
    assert sorted((r.body, r.persistent) for r in left) == [(b"x", False), (b"z", True)]
    assert [r.body for r in read_batch(spark, module_broker, "/queue/right").collect()] == [b"y"]
    assert left[0].headers == {}  # a binary body gets no content-type


def test_a_write_refused_past_its_deadline_fails_with_the_brokers_reason(
    spark: SparkSession, module_broker: BrokerThread
) -> None:
    writer = (
        sample(spark, 20)
        .coalesce(1)
        .write.format("sluiceway")
        .option("port", str(module_broker.port))
        .option("destination", SMALL_QUEUE)
        .option("retryDeadlineSec", "1")
        .mode("append")
    )
    with pytest.raises(CapturedException) as failed:
        writer.save()
    text = str(failed.value)
    assert "maxNumMsgs" in text
    assert "status 414" in text
    assert SMALL_QUEUE in text
    # Nothing was published, and the aborted stage no longer takes room in the queue.
    with PipelineConnection(settings(module_broker)) as connection:
        assert connection.head(SMALL_QUEUE).message_count == 0
    retry = RetryPolicy(pause=0.05, deadline=0.2)
    with PipelineConnection(PipelineSettings(port=module_broker.port, retry=retry)) as connection:
        sent = connection.send_many(OutgoingMessage(SMALL_QUEUE, b"room") for _ in range(5))
    assert sent == 5


def test_unknown_columns_and_overwrite_are_refused_with_a_reason(
    spark: SparkSession, module_broker: BrokerThread
) -> None:
    frame = spark.createDataFrame([("a", 1)], "body string, bogus int")
    with pytest.raises(CapturedException, match="bogus"):
        frame.write.format("sluiceway").option("port", str(module_broker.port)).option(
            "destination", "/queue/never"
        ).mode("append").save()
    with pytest.raises(CapturedException, match="only appends"):
        frame.select("body").write.format("sluiceway").option("destination", "/queue/never").mode(
            "overwrite"
        ).save()
