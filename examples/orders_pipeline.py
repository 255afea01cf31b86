"""An orders pipeline: produce orders, enrich them in Spark, publish the results, check them.

    python examples/orders_pipeline.py                 # its own broker, 5,000 orders
    python examples/orders_pipeline.py --port 61613    # a broker already running

(In a checkout set up by ./dev, the python is .venv/bin/python.)

1. A producer sends ORDERS orders (JSON) to /queue/orders, persistent.
2. A Spark stream reads /queue/orders (group `orders-enrich`, at most 1,000 messages per
   micro-batch), parses each order, computes its total and a size class, and writes the result
   to /queue/orders.enriched with the exactly-once sink. It runs with Trigger.AvailableNow:
   it stops once it has processed what was waiting when it started.
3. A consumer drains /queue/orders.enriched and checks that every order came through once,
   with the right total. The exit status is 0 when they all did, 1 otherwise.

It says what it is doing as it goes, each line with the seconds since it started, and whenever
a step has printed nothing for QUIET_S seconds, that it is still at it: starting Spark the first
time on a machine takes a while, and so does the stream's first batch.

Needs the `spark` extra (pyspark, pyarrow) and Java 17 or later.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, IntegerType, StringType, StructField, StructType

import sluiceway.spark
from sluiceway.client.sync import AckMode, ConnectionFactory
from sluiceway.testing import BrokerProcess

ORDERS_QUEUE = "/queue/orders"
RESULTS_QUEUE = "/queue/orders.enriched"
QUIET_S = 5.0  # the longest the example stays silent: then it says it is still at the step
EVERY = 1000  # orders between two lines while sending and draining
ORDER_SCHEMA = StructType(
    [
        StructField("id", IntegerType()),
        StructField("customer", StringType()),
        StructField("region", StringType()),
        StructField("quantity", IntegerType()),
        StructField("unit_price", DoubleType()),
    ]
)


class Progress:
    """Prints each step and what happens in it, and, from a thread of its own, that the step is
    still going whenever nothing was printed for QUIET_S seconds (Spark's start prints nothing
    for a long while) until it is closed."""

    def __init__(self) -> None:
        self._started = self._last = time.monotonic()
        self._step = "starting"
        self._step_started = self._started
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="progress", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._done.set()
        self._thread.join()

    def step(self, doing: str, detail: str = "") -> None:
        """A new step: "starting Spark", said with `detail` after it."""
        with self._lock:
            self._step, self._step_started = doing, time.monotonic()
        self.say(f"{doing}{detail}...")

    def say(self, text: str) -> None:
        with self._lock:
            now = time.monotonic()
            print(f"[{now - self._started:5.1f} s] {text}", flush=True)
            self._last = now

    def _watch(self) -> None:
        while not self._done.wait(0.5):
            with self._lock:
                quiet = time.monotonic() - self._last >= QUIET_S
                step, for_s = self._step, time.monotonic() - self._step_started
            if quiet:
                self.say(f"  still {step} ({for_s:.0f} s)")


def make_order(number: int, rng: random.Random) -> dict[str, Any]:
    return {
        "id": number,
        "customer": f"customer-{rng.randrange(200)}",
        "region": rng.choice(["EU", "US", "APAC"]),
        "quantity": rng.randrange(1, 20),
        "unit_price": round(rng.uniform(1, 500), 2),
    }


def produce(port: int, count: int, progress: Progress) -> dict[int, float]:
    """Send `count` orders; the expected total of each, by order id."""
    rng = random.Random(7)  # noqa: S311  (sample data, not secrets)
    expected = {}
    with ConnectionFactory(f"stomp://127.0.0.1:{port}").connect() as connection:
        producer = connection.session(AckMode.AUTO).producer(ORDERS_QUEUE)
        for number in range(count):
            order = make_order(number, rng)
            expected[number] = round(order["quantity"] * order["unit_price"], 2)
            producer.send(json.dumps(order).encode(), persistent=True)
            if (number + 1) % EVERY == 0 and number + 1 < count:
                progress.say(f"  sent {number + 1} of {count}")
    return expected


def enrich(spark: SparkSession, port: int, checkpoint: Path, progress: Progress) -> None:
    """The Spark job: orders in, enriched orders out, until the backlog seen at start is done."""
    orders = (
        spark.readStream.format("sluiceway")
        .option("port", str(port))
        .option("destination", ORDERS_QUEUE)
        .option("group", "orders-enrich")
        .option("maxMessagesPerTrigger", "1000")
        .load()
    )
    order = F.from_json(F.col("text"), ORDER_SCHEMA)
    enriched = (
        orders.select(order.alias("order"))
        .select("order.*")
        .withColumn("total", F.round(F.col("quantity") * F.col("unit_price"), 2))
        .withColumn(
            "size",
            F.when(F.col("total") >= 2000, "large")
            .when(F.col("total") >= 200, "medium")
            .otherwise("small"),
        )
    )
    results = enriched.select(
        F.to_json(F.struct("id", "customer", "region", "total", "size")).alias("body"),
        F.create_map(F.lit("region"), F.col("region")).alias("headers"),
    )
    query = (
        results.writeStream.format("sluiceway")
        .option("port", str(port))
        .option("destination", RESULTS_QUEUE)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    said: set[int] = set()
    enriched_so_far = 0
    finished = False
    while not finished:
        finished = bool(query.awaitTermination(1))  # raises if the query failed
        for batch in query.recentProgress:
            if batch.batchId in said:
                continue
            said.add(batch.batchId)
            enriched_so_far += batch.numInputRows
            progress.say(
                f"  batch {batch.batchId}: {batch.numInputRows} orders enriched "
                f"({enriched_so_far} so far, {batch.batchDuration / 1000:.1f} s)"
            )


def check(port: int, expected: dict[int, float], progress: Progress) -> int:
    """Drain the results; the number of problems found (0: every order once, totals right)."""
    seen: dict[int, float] = {}
    duplicates = wrong = 0
    with ConnectionFactory(f"stomp://127.0.0.1:{port}").connect() as connection:
        consumer = connection.session(AckMode.AUTO).consumer(RESULTS_QUEUE)
        while len(seen) < len(expected):
            message = consumer.receive(timeout=10.0)
            if message is None:
                break
            result = json.loads(message.body)
            if result["id"] in seen:
                duplicates += 1
            seen[result["id"]] = result["total"]
            if abs(result["total"] - expected[result["id"]]) > 0.005:
                wrong += 1
            if len(seen) % EVERY == 0 and len(seen) < len(expected):
                progress.say(f"  received {len(seen)} of {len(expected)}")
        while consumer.receive(timeout=1.0) is not None:  # nothing may follow
            duplicates += 1
    missing = len(expected) - len(seen)
    progress.say(
        f"{len(expected)} orders sent, {len(seen)} enriched orders received: "
        f"{missing} missing, {duplicates} duplicated, {wrong} with a wrong total"
    )
    return missing + duplicates + wrong


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=5000, help="how many orders (5000)")
    parser.add_argument(
        "--port", type=int, help="a running broker's STOMP port (default: start one)"
    )
    args = parser.parse_args()
    # Spark's Python workers must run this interpreter: it has pyarrow and sluiceway.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    progress = Progress()
    try:
        return run(args.orders, args.port, progress)
    finally:
        progress.close()


def run(orders: int, port: int | None, progress: Progress) -> int:
    """The three steps; the exit status."""
    broker = None
    if port is None:
        progress.step("starting a broker")
        broker = BrokerProcess("-D", "imq.admin.http.port=-1")
        port = broker.port
        progress.say(f"broker ready: STOMP on 127.0.0.1:{port}")
    spark: SparkSession | None = None
    # The broker is stopped however the run ends, Spark failing to start (no Java) included:
    # a child process left running would outlive the example.
    try:
        progress.step(
            "starting Spark",
            " (local[2]; its JVM takes a while to start, up to a minute or more on a small "
            "machine the first time)",
        )
        spark = (
            SparkSession.builder.master("local[2]")
            .appName("sluiceway-orders-example")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        sluiceway.spark.register(spark)
        progress.say("Spark ready")
        progress.step(f"sending {orders} orders to {ORDERS_QUEUE}")
        expected = produce(port, orders, progress)
        progress.say(f"sent {len(expected)} orders to {ORDERS_QUEUE}")
        progress.step(
            "streaming the orders through Spark",
            f" ({ORDERS_QUEUE} to {RESULTS_QUEUE}, at most 1000 orders a batch; the first "
            "batch takes longest)",
        )
        with tempfile.TemporaryDirectory(prefix="orders-checkpoint-") as checkpoint:
            enrich(spark, port, Path(checkpoint), progress)
        progress.say(f"Spark published the enriched orders to {RESULTS_QUEUE}")
        progress.step(f"draining {RESULTS_QUEUE} and checking every order")
        problems = check(port, expected, progress)
    finally:
        if spark is not None:
            progress.step("stopping Spark")
            spark.stop()
        if broker is not None:
            progress.step("stopping the broker")
            broker.stop()
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
