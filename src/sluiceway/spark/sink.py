"""Writing to a destination: staged on executors, published once from the driver's commit.

Exactly once (the default, `deliveryGuarantee=exactlyOnce`): each write task stages its rows on
the broker under `SINK/BATCH/TASK` (pipelines-protocol.md, "Stages"), where TASK names the task
attempt uniquely, even across restarts of the query; no consumer sees them. The driver's commit
of batch BATCH publishes the stages of the tasks that succeeded, atomically; the broker
remembers the highest batch of each sink it committed, so the commit of a batch that Spark
replays after a crash (between the sink's commit and its own `commits/N`) publishes nothing. An
abort discards the batch's stages; stages of task attempts that died are discarded by the broker
after their time to live (`stageTtlSec`).

SINK is the `sinkId` option, else `spark-` and the query's id, read from the `metadata` file of
the checkpoint location: stable across restarts of the query, and new when the checkpoint is
deleted, whose batch numbers then start again at 0 (with a fixed `sinkId`, change it whenever
the checkpoint is reset, or the new query's first batches are taken for replays and dropped).

At least once (`deliveryGuarantee=atLeastOnce`): the tasks publish directly; a replayed batch
is published again.

A batch write (`df.write`) stages its rows the same way under a sink name of its own and
publishes them all at once when every task has succeeded.

Sends obey producer flow control: a send refused because a destination or the broker is full,
or held longer than the broker's hold timeout, is retried with back-off (`retryPauseSec`,
doubling up to 5 s) until `retryDeadlineSec`; then the task fails with the broker's refusal
(status, message, destination, the limit and its value).
"""

from __future__ import annotations

import json
import logging
import secrets
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import urlparse

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from sluiceway.client.pipeline import (
    OutgoingMessage,
    OutgoingPack,
    PipelineConnection,
    StageState,
)
from sluiceway.client.pipeline_send_packs import packed
from sluiceway.errors import ConfigError
from sluiceway.spark.options import DeliveryGuarantee, OptionReader, SinkOptions
from sluiceway.spark.rows import Defaults, SinkColumns
from sluiceway.spark.sink_packs import columnar, packs

log = logging.getLogger("sluiceway.spark")

# The local property that carries a streaming batch's id to its tasks (set by Spark's micro-batch
# execution; not documented, but the only way a write task learns its batch).
BATCH_ID_PROPERTY: Final = "streaming.sql.batchId"
_MAX_SINK_PREFIX: Final = 150  # leaves room for "-" and a uuid within the 200-character limit


@dataclass(frozen=True)
class SinkCommit(WriterCommitMessage):
    """What a write task tells the driver: the name of its stage task, and how many it sent."""

    task: str
    count: int


def stream_sink_id(options: SinkOptions, raw: Mapping[str, str]) -> str:
    """The SINK of a streaming query's stages: `sinkId`, else derived from the checkpoint."""
    if options.sink_id is not None:
        return options.sink_id
    location = OptionReader(raw).text("checkpointLocation")
    if not location:
        raise ConfigError(
            "sinkId",
            "an exactly-once sluiceway sink needs option sinkId, or a checkpointLocation "
            "option to derive it from",
        )
    query_id = checkpoint_query_id(location)
    if query_id is None:
        raise ConfigError(
            "sinkId",
            f"cannot read the query id from {location}/metadata (not a local path?); set option "
            "sinkId to a name unique to this query, and change it when the checkpoint is reset",
        )
    return f"spark-{query_id}"


def checkpoint_query_id(location: str) -> str | None:
    """The query id Spark keeps in the checkpoint's `metadata` file, if it is on a local disk."""
    parsed = urlparse(location)
    if parsed.scheme not in ("", "file"):
        return None
    path = Path(parsed.path if parsed.scheme else location) / "metadata"
    try:
        first_line = path.read_text(encoding="utf-8").splitlines()[0]
        value = json.loads(first_line).get("id")
    except (OSError, IndexError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and value else None


class SinkRows:
    """Rows to messages, and sending them: what the stream and batch writers share."""

    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        self.options = options
        self.columns = SinkColumns.bind(schema)

    def messages(self, batches: Iterator[pa.RecordBatch]) -> Iterator[OutgoingMessage]:
        """The rows of Spark's record batches as messages: each column taken out of Arrow at
        once, never a Row per row."""
        options, columns = self.options, self.columns
        defaults = Defaults(options.destination, options.persistent, options.priority)
        for batch in batches:
            count = batch.num_rows
            values = [
                batch.column(i).to_pylist() if i is not None else [None] * count
                for i in columns.positions
            ]
            for row in zip(*values, strict=True):
                yield columns.message_of(row, defaults)

    def send(self, rows: Iterator[pa.RecordBatch], stage: str | None) -> int:
        with PipelineConnection(self.options.connection) as connection:
            return connection.send_packs(
                self._packed(rows), stage=stage, stage_ttl_ms=self.options.stage_ttl_ms
            )

    def _packed(
        self, batches: Iterator[pa.RecordBatch]
    ) -> Iterator[OutgoingMessage | OutgoingPack]:
        """Each record batch as packs made from its buffers where it can be, else its rows
        as messages, packed by the client."""
        options, columns = self.options, self.columns
        defaults = Defaults(options.destination, options.persistent, options.priority)
        for batch in batches:
            if columnar(batch, columns, defaults):
                yield from packs(batch, columns, defaults)
            else:
                yield from packed(self.messages(iter([batch])))


def _task_name() -> str:
    """This task attempt's stage task: partition and attempt, and a random part, since attempt
    numbers start again at 0 when a query restarts and a dead attempt's stage may remain."""
    context = TaskContext.get()
    if context is None:
        raise RuntimeError("a sluiceway sink's write() runs in a Spark task")
    return f"{context.partitionId()}.{context.attemptNumber()}.{secrets.token_hex(4)}"


def _batch_id() -> int:
    context = TaskContext.get()
    text = context.getLocalProperty(BATCH_ID_PROPERTY) if context is not None else None
    if text is None or not text.isdigit():
        raise RuntimeError(
            f"the task has no {BATCH_ID_PROPERTY} local property, which Spark sets on the tasks "
            "of a streaming batch; is this Spark version supported (4.2 or later)?"
        )
    return int(text)


def _tasks(messages: list[WriterCommitMessage | None]) -> list[SinkCommit]:
    """The tasks that staged something, with what each staged (the COMMIT checks it)."""
    return [m for m in messages if isinstance(m, SinkCommit) and m.count > 0]


class StreamSink(DataSourceStreamArrowWriter):
    """`writeStream.format("sluiceway")`."""

    def __init__(self, options: SinkOptions, schema: StructType, sink_id: str | None) -> None:
        self.options = options
        self.rows = SinkRows(options, schema)
        self.sink_id = sink_id

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        task = _task_name()
        if self.sink_id is None:  # at least once: publish now
            return SinkCommit(task, self.rows.send(iterator, None))
        stage = f"{self.sink_id}/{_batch_id()}/{task}"
        return SinkCommit(task, self.rows.send(iterator, stage))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.sink_id is None:
            return
        tasks = _tasks(messages)
        if not tasks:
            return  # nothing staged: nothing to publish
        with PipelineConnection(self.options.connection) as connection:
            result = connection.commit_stage(
                self.sink_id, batchId, [t.task for t in tasks], [t.count for t in tasks]
            )
        if result.state is StageState.COMMITTED_BEFORE:
            log.warning(
                "sink %s: batch %d was committed before; nothing published again (a batch "
                "replayed after a failure, or a sinkId reused with a new checkpoint)",
                self.sink_id,
                batchId,
            )
        else:
            log.info("sink %s: batch %d published %d messages", self.sink_id, batchId, result.count)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.sink_id is None:
            return
        with PipelineConnection(self.options.connection) as connection:
            connection.abort_stage(self.sink_id, batchId)


class BatchSink(DataSourceArrowWriter):
    """`df.write.format("sluiceway")`: all rows published at once, or none."""

    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        self.options = options
        self.rows = SinkRows(options, schema)
        self.staged = options.guarantee is DeliveryGuarantee.EXACTLY_ONCE
        # One sink name per write (made on the driver, shipped to the tasks with the writer).
        prefix = (options.sink_id or "write")[:_MAX_SINK_PREFIX]
        self.sink = f"{prefix}-{uuid.uuid4().hex}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        task = _task_name()
        stage = f"{self.sink}/0/{task}" if self.staged else None
        return SinkCommit(task, self.rows.send(iterator, stage))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        tasks = _tasks(messages)
        if not self.staged or not tasks:
            return
        with PipelineConnection(self.options.connection) as connection:
            connection.commit_stage(self.sink, 0, [t.task for t in tasks], [t.count for t in tasks])

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if not self.staged:
            return
        with PipelineConnection(self.options.connection) as connection:
            connection.abort_stage(self.sink, 0)
