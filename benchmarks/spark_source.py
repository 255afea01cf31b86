"""Messages per second through the Spark streaming source, beside Spark's floor for Python sources.

Three runs of the same query (readStream, Trigger.AvailableNow, at most 100,000 messages per
micro-batch, into Spark's `noop` sink), in one Spark session: local (local[2]), or with
`--master standalone` on a standalone cluster started here for the runs (spark_cluster.py: a
master and two workers of one core and 1 GiB each, stopped at the end):

- `topic`: the `sluiceway` source on a topic (range reads by sequence number, a cursor);
- `queue`: the `sluiceway` source on a queue (durable leases, acknowledged as batches commit);
- `synthetic`: a Python streaming data source that makes the same rows in memory, with the same
  schema and offsets: what Spark's Python data source path allows on this machine, with no
  broker and no network.

Two first, untimed queries (synthetic, then a topic) warm the session up. The broker (a separate
process) is filled before each run with 1 KiB non-persistent messages; filling is not timed.
The time is from `start()` to the end of the query. Prints a line per run and writes
benchmarks/results/spark_source.json (spark_source-standalone.json for the cluster,
`-per-trigger-N` added with --per-trigger N; `--results PATH` writes elsewhere).

`--rounds N` measures every run N times in the same session, the runs' order turned by one from
round to round (a query's time depends on where it comes: the first runs after the warm-ups are
the slowest); each figure is then the median of the N, and each run's share of `synthetic` the
median of its per-round shares.

    .venv/bin/python benchmarks/spark_source.py [--messages 300000] [--runs topic,queue,synthetic]
        [--master local|standalone] [--per-trigger 100000] [--rounds 1]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType
from spark_cluster import StandaloneCluster  # run from benchmarks/, as a script

import sluiceway.spark
from sluiceway.client.pipeline import PipelineConnection, PipelineSettings
from sluiceway.loadgen import produce
from sluiceway.spark.rows import SOURCE_SCHEMA
from sluiceway.testing import BrokerProcess

RESULTS = Path(__file__).parent / "results" / "spark_source.json"
STANDALONE_RESULTS = Path(__file__).parent / "results" / "spark_source-standalone.json"
# The cluster of `--master standalone`: as many one-core workers as local[2] has threads.
WORKERS, WORKER_CORES, WORKER_MEMORY = 2, 1, "1g"
PER_TRIGGER = 100_000
BODY_SIZE = 1024


class SyntheticRange(InputPartition):
    def __init__(self, start: int, end: int) -> None:
        super().__init__(None)
        self.start, self.end = start, end


class SyntheticReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Rows made in memory: the same columns, offsets and per-trigger cap as the sluiceway
    source, and no I/O at all."""

    def __init__(self, total: int, per_trigger: int) -> None:
        self.total, self.per_trigger = total, per_trigger

    def initialOffset(self) -> dict[str, int]:
        return {"sequence": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        pass  # the head is fixed: `total`

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        cap = limit.max_rows if isinstance(limit, ReadMaxRows) else self.total
        return {"sequence": min(self.total, start["sequence"] + cap)}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        return [SyntheticRange(start["sequence"], end["sequence"])]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, SyntheticRange)
        padding = b"x" * BODY_SIZE
        now = datetime.datetime.now(tz=datetime.UTC)
        for sequence in range(partition.start, partition.end):
            body = b"%d " % sequence + padding[len(b"%d " % sequence) :]
            yield (
                body,
                body.decode(),
                {"content-type": "text/plain"},
                f"ID:synthetic-{sequence}",
                sequence,
                "/queue/synthetic",
                4,
                False,
                now,
                None,
                False,
                1,
            )


class SyntheticSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "synthetic"

    def schema(self) -> StructType:
        return SOURCE_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        per_trigger = int(self.options.get("perTrigger", PER_TRIGGER))
        return SyntheticReader(int(self.options["messages"]), per_trigger)


def run_query(spark: SparkSession, source: str, options: dict[str, str]) -> float:
    """Seconds from start() to the end of an available-now query into the noop sink."""
    with tempfile.TemporaryDirectory(prefix="spark-bench-") as checkpoint:
        reader = spark.readStream.format(source)
        for name, value in options.items():
            reader = reader.option(name, value)
        started = time.monotonic()
        query = (
            reader.load()
            .writeStream.format("noop")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        seconds = time.monotonic() - started
        batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
        print(f"  {source} {options.get('destination', '')}: batch sizes {batches}", flush=True)
        return seconds


def fill(port: int, destination: str, count: int) -> None:
    produced = asyncio.run(produce(port, destination, count, body_size=BODY_SIZE))
    if produced.accepted != count:
        raise RuntimeError(f"only {produced.accepted} of {count} accepted: {produced.refused}")


def bench_session(master: str = "local[2]") -> SparkSession:
    """The session the Spark benchmarks run in, local unless `master` names a cluster's
    `spark://` URL (its executors take a worker's memory and one core each), with both sources
    registered. The driver binds 127.0.0.1."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # the driver JVM's own servers
    builder = SparkSession.builder.master(master)
    if master.startswith("spark://"):
        builder = builder.config("spark.executor.memory", WORKER_MEMORY).config(
            "spark.executor.cores", str(WORKER_CORES)
        )
    spark = (
        builder.config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    sluiceway.spark.register(spark)
    spark.dataSource.register(SyntheticSource)
    return spark


def bench_broker() -> BrokerProcess:
    """A broker process without limits on what it holds, nor throttling, nor admin port."""
    return BrokerProcess(
        "-D", "imq.autocreate.destination.maxNumMsgs=-1",
        "-D", "imq.throttling.server.threshold=0",
        "-D", "imq.admin.http.port=-1",
    )  # fmt: skip


def run_one(spark: SparkSession, run: str, messages: int, per_trigger: int = PER_TRIGGER) -> float:
    """Seconds for `run` (`topic`, `queue:2`, `synthetic`...) to read `messages` messages, at
    most `per_trigger` a batch."""
    kind, _, partitions = run.partition(":")  # queue:2: minPartitions=2
    if kind == "synthetic":
        options = {"messages": str(messages), "perTrigger": str(per_trigger)}
        return run_query(spark, "synthetic", options)
    destination = f"/{kind}/bench"
    with bench_broker() as broker:
        options = {
            "port": str(broker.port),
            "destination": destination,
            "group": "bench",
            "startingOffsets": "earliest",
            "maxMessagesPerTrigger": str(per_trigger),
            "minPartitions": partitions or "1",
        }
        if kind == "topic":
            # The cursor must exist before the messages, or the topic keeps none.
            with PipelineConnection(PipelineSettings(port=broker.port)) as connection:
                connection.open_cursor(destination, "bench", "earliest")
        fill(broker.port, destination, messages)
        seconds = run_query(spark, "sluiceway", options)
        broker.stop()
    return seconds


def rounds_of(runs: list[str], rounds: int) -> Iterator[tuple[int, str]]:
    """(round, run) in the order they are measured: the runs, turned by one each round."""
    for number in range(rounds):
        turn = number % len(runs)
        for run in runs[turn:] + runs[:turn]:
            yield number, run


def summarize(
    seconds: dict[str, list[float]], count: int, floor: str, unit: str
) -> dict[str, dict[str, Any]]:
    """Per run: the median time and rate over the rounds, every round's time, and the median of
    the per-round shares of `floor` (the in-memory run) when it was measured."""
    results: dict[str, dict[str, Any]] = {}
    for run, times in seconds.items():
        median = statistics.median(times)
        result: dict[str, Any] = {"seconds": round(median, 2), unit: round(count / median)}
        if len(times) > 1:
            result["seconds_per_round"] = [round(t, 2) for t in times]
        if floor in seconds and run != floor:
            shares = [f / t for t, f in zip(times, seconds[floor], strict=True)]
            result[f"share_of_{floor}"] = round(statistics.median(shares), 3)
        results[run] = result
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument(
        "--runs",
        default="topic,queue,synthetic",
        help="comma-separated; topic:N or queue:N reads with minPartitions=N",
    )
    parser.add_argument(
        "--master",
        choices=("local", "standalone"),
        default="local",
        help="local[2], or a standalone cluster of two one-core workers started here",
    )
    parser.add_argument(
        "--per-trigger", type=int, default=PER_TRIGGER, help="the most messages a batch reads"
    )
    parser.add_argument("--results", type=Path, help="where the figures go (default by --master)")
    parser.add_argument(
        "--rounds", type=int, default=1, help="measure each run this many times, order turned"
    )
    args = parser.parse_args()
    standalone = args.master == "standalone"
    runs = args.runs.split(",")
    measured: dict[str, list[float]] = {run: [] for run in runs}
    with contextlib.ExitStack() as stack:
        master = "local[2]"
        if standalone:
            cluster = StandaloneCluster(WORKERS, WORKER_CORES, WORKER_MEMORY)
            master = stack.enter_context(cluster).url
            print(f"standalone cluster at {master}", flush=True)
        spark = bench_session(master)
        stack.callback(spark.stop)  # before the cluster stops: the application ends cleanly
        # The first query of a session pays for loading and compiling Spark's code, and the
        # first of a source for loading its modules in the Python workers: neither is timed.
        run_query(spark, "synthetic", {"messages": "1000"})
        run_one(spark, "topic", 1000, args.per_trigger)
        for number, run in rounds_of(runs, args.rounds):
            seconds = run_one(spark, run, args.messages, args.per_trigger)
            measured[run].append(seconds)
            rate = args.messages / seconds
            print(
                f"round {number + 1}, {run}: {args.messages} messages in {seconds:.1f} s: "
                f"{rate:,.0f} msgs/s",
                flush=True,
            )
    record = {
        "messages": args.messages,
        "per_trigger": args.per_trigger,
        "body_size": BODY_SIZE,
        "master": (
            f"standalone: {WORKERS} workers of {WORKER_CORES} core and {WORKER_MEMORY}"
            if standalone
            else "local[2]"
        ),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
        "rounds": args.rounds,
        "results": summarize(measured, args.messages, "synthetic", "msgs_per_s"),
    }
    path = args.results or (STANDALONE_RESULTS if standalone else RESULTS)
    if args.results is None and args.per_trigger != PER_TRIGGER:
        path = path.with_stem(f"{path.stem}-per-trigger-{args.per_trigger}")
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"written to {path}")


if __name__ == "__main__":
    main()
