"""A Spark driver for the crash test, run as a process of its own (the test kills it).

    python crash_job.py PORT WORK stream   # queues and topics into Parquet until killed
    python crash_job.py PORT WORK drain    # the same queries, available-now, from their
                                           # checkpoints; then WORK/NAME/result.json

Two queries run side by side, a topic's and a queue's, each into Parquet under WORK/NAME with
its checkpoint beside it. `drain` writes, per query, how many times each body reached Parquet
(read back through Spark, which leaves out files of batches that never committed).
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Final

from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

import sluiceway.spark

QUERIES: Final = {"topic": "/topic/crash", "queue": "/queue/crash"}
BATCH: Final = 200  # maxMessagesPerTrigger: many small batches, so a kill lands mid-stream
DRAIN_BATCH: Final = 1000  # after the restart: fewer, larger batches, to finish sooner
WAIT: Final = 240  # seconds


def start(spark: SparkSession, port: int, work: Path, name: str, drain: bool) -> StreamingQuery:
    frame = (
        spark.readStream.format("sluiceway")
        .option("port", str(port))
        .option("destination", QUERIES[name])
        .option("group", f"crash-{name}")
        .option("maxMessagesPerTrigger", str(DRAIN_BATCH if drain else BATCH))
        .load()
    )
    writer = (
        frame.select("text", "sequence")
        .writeStream.format("parquet")
        .option("path", str(work / name / "out"))
        .option("checkpointLocation", str(work / name / "checkpoint"))
        .queryName(name)
    )
    writer = (
        writer.trigger(availableNow=True) if drain else writer.trigger(processingTime="0 seconds")
    )
    return writer.start()


def main() -> int:
    port, work, mode = int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    drain = mode == "drain"
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("sluiceway-crash")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    sluiceway.spark.register(spark)
    # The queries start one at a time: two starting together in one driver (both replaying a
    # batch after the restart) now and then had Spark serialize a task's plan corrupted
    # (java.io.OptionalDataException in every attempt). `stream` starts the next query once the
    # one before has finished a batch, so both run when the driver is killed; `drain` runs them
    # one after the other.
    for name in QUERIES:
        query = start(spark, port, work, name, drain)
        if drain:
            query.awaitTermination(WAIT)
        else:
            deadline = time.monotonic() + WAIT
            while not query.recentProgress and query.isActive and time.monotonic() < deadline:
                time.sleep(0.1)
        if query.exception() is not None:
            print(f"query {query.name} failed: {query.exception()}", file=sys.stderr)
            return 1
    if not drain:
        spark.streams.awaitAnyTermination()
        return 1  # a stream query ended by itself: the test kills this process first
    for name in QUERIES:
        rows = spark.read.parquet(str(work / name / "out")).select("text").collect()
        counts = Counter(str(row.text) for row in rows)
        (work / name / "result.json").write_text(json.dumps(counts))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
