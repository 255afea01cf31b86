"""The `sluiceway` data source: one class that Spark asks for readers and writers."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from sluiceway.errors import ConfigError
from sluiceway.spark.batch import BatchReader
from sluiceway.spark.options import DeliveryGuarantee, sink_options, source_options
from sluiceway.spark.queue import QueueStreamReader
from sluiceway.spark.rows import SOURCE_SCHEMA, check_source_schema
from sluiceway.spark.sink import BatchSink, StreamSink, stream_sink_id
from sluiceway.spark.topic import TopicStreamReader


class SluicewayDataSource(DataSource):
    """Read from and write to a Sluiceway broker: `format("sluiceway")`, batch and streaming.

    Register it once per session with `spark.dataSource.register(SluicewayDataSource)` (or
    `sluiceway.spark.register(spark)`); the options are described in docs/spark.md.
    """

    @classmethod
    def name(cls) -> str:
        return "sluiceway"

    def schema(self) -> StructType:
        return SOURCE_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        check_source_schema(schema)
        return BatchReader(source_options(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        check_source_schema(schema)
        options = source_options(self.options)
        if options.is_queue:
            return QueueStreamReader(options)
        return TopicStreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise ConfigError(
                "mode", "the sluiceway sink only appends (publishes): use mode('append')"
            )
        return BatchSink(sink_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        if overwrite:
            raise ConfigError(
                "outputMode",
                "the sluiceway sink publishes each batch's rows: use outputMode append or update",
            )
        options = sink_options(self.options)
        sink_id = None
        if options.guarantee is DeliveryGuarantee.EXACTLY_ONCE:
            sink_id = stream_sink_id(options, self.options)
        return StreamSink(options, schema, sink_id)
