"""A Spark driver for the cluster failover test, run as a process of its own.

    python cluster_job.py ADDRESSES WORK

One query: a queue read by leases into the exactly-once sink, both given the cluster's members
in `addresses`, with its checkpoint under WORK. It runs until the test stops it; a member is
killed meanwhile. Spark retries a failed task (`local[2,4]`: up to 4 attempts), as it does on
a real cluster.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Final

from pyspark.sql import SparkSession

import sluiceway.spark

SOURCE: Final = "/queue/failover.in"
SINK: Final = "/queue/failover.out"
BATCH: Final = 200  # maxMessagesPerTrigger: many small batches, so the kill lands mid-stream
WAIT: Final = 240  # seconds for the first batch


def main() -> int:
    addresses, work = sys.argv[1], Path(sys.argv[2])
    spark = (
        SparkSession.builder.master("local[2,4]")
        .appName("sluiceway-cluster-failover")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    sluiceway.spark.register(spark)
    frame = (
        spark.readStream.format("sluiceway")
        .option("addresses", addresses)
        .option("destination", SOURCE)
        .option("group", "failover")
        .option("minPartitions", "2")
        .option("maxMessagesPerTrigger", str(BATCH))
        .load()
    )
    query = (
        frame.select("body")
        .writeStream.format("sluiceway")
        .option("addresses", addresses)
        .option("destination", SINK)
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(processingTime="0 seconds")
        .queryName("failover")
        .start()
    )
    deadline = time.monotonic() + WAIT
    while not query.recentProgress and query.isActive and time.monotonic() < deadline:
        time.sleep(0.1)
    print("started", flush=True)
    query.awaitTermination()
    exception = query.exception()
    print(f"query {query.name} ended: {exception}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
