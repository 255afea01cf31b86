"""Sources of several destinations, with a real local Spark and a real broker: a list of queues
resumed from a checkpoint written when offsets held one destination, and a pattern over topics
that picks up a topic created while the query runs, with the heads in Spark's progress."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import pytest
from pyspark.sql import DataFrame, SparkSession

from sluiceway.client.pipeline import PipelineConnection
from sluiceway.testing import BrokerThread
from tests.spark.conftest import SPARK_WAIT, publish, settings, wait_for

pytestmark = pytest.mark.timeout(300)

CAP: Final = 60  # maxMessagesPerTrigger: every batch at most this many, all destinations together


@pytest.fixture(scope="module")
def module_broker() -> Iterator[BrokerThread]:
    with BrokerThread() as broker:
        yield broker


def stream(spark: SparkSession, broker: BrokerThread, destination: str, group: str) -> DataFrame:
    return (
        spark.readStream.format("sluiceway")
        .option("port", str(broker.port))
        .option("destination", destination)
        .option("group", group)
        .option("maxMessagesPerTrigger", str(CAP))
        .load()
    )


class Batches:
    """What each batch of a query held: (destination, text) pairs, and each batch's size."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str]] = []
        self.sizes: list[int] = []
        self._lock = threading.Lock()

    def __call__(self, batch: DataFrame, _batch_id: int) -> None:
        rows = [(r.destination, r.text) for r in batch.select("destination", "text").collect()]
        with self._lock:
            self.rows.extend(rows)
            if rows:
                self.sizes.append(len(rows))

    def count(self) -> int:
        with self._lock:
            return len(self.rows)


def run_available_now(frame: DataFrame, checkpoint: Path) -> Batches:
    seen = Batches()
    query = (
        frame.writeStream.foreachBatch(seen)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(SPARK_WAIT), "the query did not end"
    assert query.exception() is None
    return seen


def as_single_destination_offsets(checkpoint: Path) -> None:
    """Rewrite the source offsets of `checkpoint` as offsets were written before sources read
    several destinations: one destination, flat."""
    for path in (checkpoint / "offsets").iterdir():
        if not path.name.isdigit():
            continue
        lines = path.read_text().splitlines()
        offset = json.loads(lines[2])
        ((destination, entry),) = offset["destinations"].items()
        lines[2] = json.dumps({"destination": destination, **entry, "bytes": offset["bytes"]})
        path.write_text("\n".join(lines))


def test_a_list_of_queues_resumes_a_single_queue_checkpoint_reading_each_message_once(
    spark: SparkSession, module_broker: BrokerThread, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "checkpoint"
    publish(module_broker, "/queue/two.a", 0, 100)
    first = run_available_now(stream(spark, module_broker, "/queue/two.a", "two"), checkpoint)
    assert Counter(first.rows) == Counter(("/queue/two.a", f"m{i}") for i in range(100))
    as_single_destination_offsets(checkpoint)

    publish(module_broker, "/queue/two.a", 100, 100)
    publish(module_broker, "/queue/two.b", 0, 150)
    both = stream(spark, module_broker, "/queue/two.a,/queue/two.b", "two")
    second = run_available_now(both, checkpoint)
    expected = [("/queue/two.a", f"m{i}") for i in range(100, 200)]
    expected += [("/queue/two.b", f"m{i}") for i in range(150)]
    assert Counter(second.rows) == Counter(expected)
    assert max(second.sizes) <= CAP
    with PipelineConnection(settings(module_broker)) as connection:
        for queue in ("/queue/two.a", "/queue/two.b"):
            assert connection.head(queue).message_count == 0


def source_progress(progress: Mapping[str, Any]) -> Mapping[str, Any]:
    (source,) = progress["sources"]
    assert isinstance(source, Mapping)
    return source


def sequences(offset: str | None) -> dict[str, int]:
    """Each destination's `sequence` in a topic source's offset as Spark's progress shows it
    (JSON text; none before the first batch)."""
    parsed = json.loads(offset) if offset else {}
    if not isinstance(parsed, dict):
        return {}
    return {name: entry["sequence"] for name, entry in parsed.get("destinations", {}).items()}


def test_a_topic_pattern_picks_up_a_topic_created_while_the_query_runs(
    spark: SparkSession, module_broker: BrokerThread, tmp_path: Path
) -> None:
    with PipelineConnection(settings(module_broker)) as connection:
        connection.open_cursor("/topic/wild.a", "wild", "earliest")
    publish(module_broker, "/topic/wild.a", 0, 100)
    seen = Batches()
    query = (
        stream(spark, module_broker, "/topic/wild.*", "wild")
        .writeStream.foreachBatch(seen)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="1 second")
        .start()
    )
    try:
        wait_for(lambda: seen.count() == 100, "the first topic's messages")

        def found_new_topic() -> bool:
            ends = [sequences(source_progress(p)["endOffset"]) for p in query.recentProgress]
            return any("/topic/wild.b" in end for end in ends)

        with PipelineConnection(settings(module_broker)) as connection:
            connection.head("/topic/wild.b")  # made, empty: the query opens its cursor
        wait_for(found_new_topic, "the query to take the new topic in")
        publish(module_broker, "/topic/wild.b", 0, 50)
        publish(module_broker, "/topic/wild.a", 100, 20)
        wait_for(lambda: seen.count() == 170, "the messages sent since")
        wait_for(lambda: final(query.recentProgress) is not None, "the last batch's progress")
        progress = query.recentProgress
    finally:
        query.stop()
    expected = [("/topic/wild.a", f"m{i}") for i in range(120)]
    expected += [("/topic/wild.b", f"m{i}") for i in range(50)]
    assert Counter(seen.rows) == Counter(expected)
    assert max(seen.sizes) <= CAP
    # Spark's progress shows each topic's head (latestOffset) next to where the batch ended:
    # the first batch took 60 of the 100 messages waiting.
    first = next(source_progress(p) for p in progress if p["numInputRows"])
    assert sequences(first["latestOffset"]) == {"/topic/wild.a": 101}
    assert sequences(first["endOffset"]) == {"/topic/wild.a": 1 + CAP}
    last = final(progress)
    assert last is not None
    assert sequences(last["latestOffset"]) == sequences(last["endOffset"]) == END


END: Final = {"/topic/wild.a": 121, "/topic/wild.b": 51}  # where each topic's last batch ends


def final(progress: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The source's progress in the batch that read the last messages, if there is one yet."""
    sources = [source_progress(p) for p in progress]
    return next((s for s in sources if sequences(s["endOffset"]) == END), None)
