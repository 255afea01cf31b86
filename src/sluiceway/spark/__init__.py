"""Spark pipelines on Sluiceway: the `sluiceway` PySpark data source (PySpark 4.2 or later).

    import sluiceway.spark

    sluiceway.spark.register(spark)
    orders = (
        spark.readStream.format("sluiceway")
        .option("destination", "/queue/orders")
        .option("group", "orders-to-lake")
        .load()
    )

Streams read topics by sequence number (a cursor per group keeps what the reader still needs)
and queues by durable numbered leases; the sink stages rows on the broker and publishes each
batch once. See docs/spark.md for the options, the schema, the offsets and the guarantees.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sluiceway.spark.source import SluicewayDataSource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["SluicewayDataSource", "register"]


def register(spark: SparkSession) -> None:
    """Register the `sluiceway` format with `spark`, a local or a remote (Spark Connect)
    session (once per session)."""
    spark.dataSource.register(SluicewayDataSource)
