"""Rows per second through the Spark sink, beside a Python sink that only counts.

The same streaming query, one after the other, in one local Spark session (local[2]): rows made
in memory by the `synthetic` Python source of spark_source.py (1 KiB bodies, at most 100,000
rows per trigger, Trigger.AvailableNow), their `body` column written:

- `exactly-once`: into the `sluiceway` sink (staged by the tasks, published by the commit);
- `at-least-once`: into the `sluiceway` sink with deliveryGuarantee=atLeastOnce;
- `counting`: into a Python streaming sink whose tasks only count the rows they get (Arrow
  record batches, as the sluiceway sink gets them): what Spark's Python sink path costs here.

Two first, untimed queries (counting, then into the sluiceway sink) warm the session up. Each
sluiceway run has a broker process of its own (non-persistent messages, no limits); the time is
from start() to the end of the query. Prints a line per run and writes
benchmarks/results/spark_sink.json (spark_sink-per-trigger-N.json with --per-trigger N;
`--results PATH` writes elsewhere). `--rounds N` measures each run N times, as
spark_source.py does (medians, and the median of the per-round shares of `counting`).

    .venv/bin/python benchmarks/spark_sink.py [--rows 300000] [--runs exactly-once,counting]
        [--per-trigger 100000] [--rounds 1]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType
from spark_source import (  # run from benchmarks/, as a script
    PER_TRIGGER,
    bench_broker,
    bench_session,
    rounds_of,
    summarize,
)

RESULTS = Path(__file__).parent / "results" / "spark_sink.json"


class Counted(WriterCommitMessage):
    def __init__(self, rows: int) -> None:
        self.rows = rows


class CountingWriter(DataSourceStreamArrowWriter):
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return Counted(sum(batch.num_rows for batch in iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass


class CountingSink(DataSource):
    @classmethod
    def name(cls) -> str:
        return "counting"

    def streamWriter(self, schema: StructType, overwrite: bool) -> CountingWriter:
        return CountingWriter()


def run_query(
    spark: SparkSession,
    rows: int,
    sink: str,
    options: dict[str, str],
    per_trigger: int = PER_TRIGGER,
) -> float:
    """Seconds from start() to the end of an available-now query of `rows` into `sink`, at
    most `per_trigger` rows a batch."""
    with tempfile.TemporaryDirectory(prefix="spark-sink-bench-") as checkpoint:
        frame = (
            spark.readStream.format("synthetic")
            .option("messages", str(rows))
            .option("perTrigger", str(per_trigger))
            .load()
        )
        writer = frame.select("body").writeStream.format(sink)
        for name, value in {**options, "checkpointLocation": checkpoint}.items():
            writer = writer.option(name, value)
        started = time.monotonic()
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
        seconds = time.monotonic() - started
        if query.exception() is not None:
            raise RuntimeError(f"the {sink} query failed: {query.exception()}")
        return seconds


def measure(spark: SparkSession, run: str, rows: int, per_trigger: int) -> float:
    """Seconds for one run: `counting`, or the sluiceway sink `exactly-once` or
    `at-least-once` into a broker of its own."""
    if run == "counting":
        return run_query(spark, rows, "counting", {}, per_trigger)
    guarantee = "exactlyOnce" if run == "exactly-once" else "atLeastOnce"
    with bench_broker() as broker:
        options = {
            "port": str(broker.port),
            "destination": "/queue/sink-bench",
            "deliveryGuarantee": guarantee,
            "persistent": "false",
        }
        seconds = run_query(spark, rows, "sluiceway", options, per_trigger)
        broker.stop()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--runs", default="exactly-once,at-least-once,counting")
    parser.add_argument(
        "--per-trigger", type=int, default=PER_TRIGGER, help="the most rows a batch writes"
    )
    parser.add_argument("--results", type=Path, help="where the figures go (default by --rows)")
    parser.add_argument(
        "--rounds", type=int, default=1, help="measure each run this many times, order turned"
    )
    args = parser.parse_args()
    per_trigger = args.per_trigger
    # The Python workers import the synthetic source from its module, as this script does.
    here = str(Path(__file__).parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    spark = bench_session()
    spark.dataSource.register(CountingSink)
    # Warm-up, not timed: the session's first query, and the sluiceway sink's first (which
    # loads its modules in the Python workers).
    run_query(spark, 1000, "counting", {})
    with bench_broker() as broker:
        options = {"port": str(broker.port), "destination": "/queue/warm-up"}
        run_query(spark, 1000, "sluiceway", options, per_trigger)
        broker.stop()
    runs = args.runs.split(",")
    measured: dict[str, list[float]] = {run: [] for run in runs}
    for number, run in rounds_of(runs, args.rounds):
        seconds = measure(spark, run, args.rows, per_trigger)
        measured[run].append(seconds)
        print(
            f"round {number + 1}, {run}: {args.rows} rows in {seconds:.1f} s: "
            f"{args.rows / seconds:,.0f} rows/s",
            flush=True,
        )
    spark.stop()
    record = {
        "rows": args.rows,
        "per_trigger": per_trigger,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
        "rounds": args.rounds,
        "results": summarize(measured, args.rows, "counting", "rows_per_s"),
    }
    path = args.results or RESULTS
    if args.results is None and per_trigger != PER_TRIGGER:
        path = path.with_stem(f"{path.stem}-per-trigger-{per_trigger}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"written to {path}")


if __name__ == "__main__":
    main()
