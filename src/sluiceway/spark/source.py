"""The `sluiceway` data source: one class that Spark asks for readers and writers.

Options are checked at the first moment Spark runs the data source's code, so that a bad one,
or one whose name the source or sink does not know, stops the query before it starts, with a
ConfigError that names it:

- reads, batch and streaming: at `load()`, where Spark asks for the schema (`schema()`). A read
  given a schema of its own (`.schema(...)`) runs nothing at `load()`: its options are checked
  when the query plans its first batch;
- batch writes: at `save()`, where Spark asks for the writer;
- streaming writes: Spark runs nothing of the sink at `start()`: its options are checked when the
  query plans its first batch, and the query stops with the ConfigError (`query.exception()`,
  `awaitTermination()`).

Spark shows the Python traceback of such an error before its message: the ConfigError is raised
from this module alone, so that the traceback is a frame or two long, and with
`spark.sql.execution.pyspark.udf.hideTraceback.enabled=true` the message stands alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

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

T = TypeVar("T")


def _checked(parse: Callable[[Mapping[str, str]], T], options: Mapping[str, str]) -> T:
    """`parse(options)`; a ConfigError is raised again from here, without the frames of the
    parsing, which would only push its message further down what Spark shows."""
    try:
        return parse(options)
    except ConfigError as bad_option:
        raise bad_option.with_traceback(None) from None


class SluicewayDataSource(DataSource):
    """Read from and write to a Sluiceway broker: `format("sluiceway")`, batch and streaming.

    Register it once per session with `spark.dataSource.register(SluicewayDataSource)` (or
    `sluiceway.spark.register(spark)`); the options are described in docs/spark.md.
    """

    @classmethod
    def name(cls) -> str:
        return "sluiceway"

    def schema(self) -> StructType:
        # Spark asks for it at load(), and only for reads: the moment to refuse bad options.
        _checked(source_options, self.options)
        return SOURCE_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        check_source_schema(schema)
        return BatchReader(_checked(source_options, self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        check_source_schema(schema)
        options = _checked(source_options, self.options)
        if options.is_queue:
            return QueueStreamReader(options)
        return TopicStreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise ConfigError(
                "mode", "the sluiceway sink only appends (publishes): use mode('append')"
            )
        return BatchSink(_checked(sink_options, self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        if overwrite:
            raise ConfigError(
                "outputMode",
                "the sluiceway sink publishes each batch's rows: use outputMode append or update",
            )
        options = _checked(sink_options, self.options)
        sink_id = None
        if options.guarantee is DeliveryGuarantee.EXACTLY_ONCE:
            sink_id = stream_sink_id(options, self.options)
        return StreamSink(options, schema, sink_id)
