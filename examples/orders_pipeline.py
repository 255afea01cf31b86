"""An orders pipeline: produce orders, enrich them in Spark, publish the results, check them.

    .venv/bin/python examples/orders_pipeline.py                 # its own broker, 5,000 orders
    .venv/bin/python examples/orders_pipeline.py --port 61613    # a broker already running

1. A producer sends ORDERS orders (JSON) to /queue/orders, persistent.
2. A Spark stream reads /queue/orders (group `orders-enrich`, at most 1,000 messages per
   micro-batch), parses each order, computes its total and a size class, and writes the result
   to /queue/orders.enriched with the exactly-once sink. It runs with Trigger.AvailableNow:
   it stops once it has processed what was waiting when it started.
3. A consumer drains /queue/orders.enriched and checks that every order came through once,
   with the right total. The exit status is 0 when they all did, 1 otherwise.

Needs the `spark` extra (pyspark, pyarrow) and Java 17 (`./dev test` installs both).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
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
ORDER_SCHEMA = StructType(
    [
        StructField("id", IntegerType()),
        StructField("customer", StringType()),
        StructField("region", StringType()),
        StructField("quantity", IntegerType()),
        StructField("unit_price", DoubleType()),
    ]
)


def make_order(number: int, rng: random.Random) -> dict[str, Any]:
    return {
        "id": number,
        "customer": f"customer-{rng.randrange(200)}",
        "region": rng.choice(["EU", "US", "APAC"]),
        "quantity": rng.randrange(1, 20),
        "unit_price": round(rng.uniform(1, 500), 2),
    }


def produce(port: int, count: int) -> dict[int, float]:
    """Send `count` orders; the expected total of each, by order id."""
    rng = random.Random(7)  # noqa: S311  (sample data, not secrets)
    expected = {}
    with ConnectionFactory(f"stomp://127.0.0.1:{port}").connect() as connection:
        producer = connection.session(AckMode.AUTO).producer(ORDERS_QUEUE)
        for number in range(count):
            order = make_order(number, rng)
            expected[number] = round(order["quantity"] * order["unit_price"], 2)
            producer.send(json.dumps(order).encode(), persistent=True)
    return expected


def enrich(spark: SparkSession, port: int, checkpoint: Path) -> None:
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
    query.awaitTermination()


def check(port: int, expected: dict[int, float]) -> int:
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
        while consumer.receive(timeout=1.0) is not None:  # nothing may follow
            duplicates += 1
    missing = len(expected) - len(seen)
    print(
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
    broker = None
    if args.port is None:
        broker = BrokerProcess("-D", "imq.admin.http.port=-1")
    port = args.port if broker is None else broker.port
    spark: SparkSession | None = None
    # The broker is stopped however the run ends, Spark failing to start (no Java) included:
    # a child process left running would outlive the example.
    try:
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
        expected = produce(port, args.orders)
        print(f"sent {len(expected)} orders to {ORDERS_QUEUE}")
        with tempfile.TemporaryDirectory(prefix="orders-checkpoint-") as checkpoint:
            enrich(spark, port, Path(checkpoint))
        print(f"Spark published the enriched orders to {RESULTS_QUEUE}")
        problems = check(port, expected)
    finally:
        if spark is not None:
            spark.stop()
        if broker is not None:
            broker.stop()
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
