"""The readers and writers without a Spark session: offsets, batch planning, rows, columns,
pickling (what Spark does to ship them to executors) and the sink's name."""

from __future__ import annotations

import datetime
import pickle
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes, ReadMaxRows
from pyspark.sql.types import Row, StructType

from sluiceway.client.pipeline import OutgoingMessage, PipelineConnection, PipelineMessage
from sluiceway.client.pipeline_packs import MessagePack
from sluiceway.naming import parse_destination
from sluiceway.spark.arrow_rows import ARROW_SCHEMA, pack_batch, record_batches
from sluiceway.spark.errors import DataLossError, SchemaMismatch
from sluiceway.spark.offsets import (
    LeasePartition,
    QueueBatch,
    QueueOffset,
    RangePartition,
    TopicBatch,
    TopicOffset,
    lease_names,
    split_range,
)
from sluiceway.spark.options import sink_options, source_options
from sluiceway.spark.queue import QueueStreamReader
from sluiceway.spark.reading import Caps
from sluiceway.spark.rows import SOURCE_SCHEMA, SinkColumns, message_row
from sluiceway.spark.sharing import fair_shares, rotated, spread
from sluiceway.spark.sink import SinkRows, checkpoint_query_id
from sluiceway.spark.topic import TopicStreamReader
from sluiceway.testing import BrokerThread
from tests.conftest import BrokerFactory
from tests.spark.conftest import publish, settings

T = TypeVar("T")


def shipped_copy(value: T) -> T:
    """`value` after a round trip through pickle, as Spark ships readers to executors."""
    copy = pickle.loads(pickle.dumps(value))  # noqa: S301  (bytes this test made just now)
    return cast("T", copy)


def queue_reader(**options: str) -> QueueStreamReader:
    return QueueStreamReader(source_options({"destination": "/queue/q", "group": "g", **options}))


def test_offsets_are_kept_per_destination_and_older_ones_still_read() -> None:
    topics = TopicBatch({"/topic/t": TopicOffset("/topic/t", 100, 250)})
    topics.entries["/topic/u"] = TopicOffset("/topic/u", 7, 7)
    assert topics.to_json() == {
        "destinations": {
            "/topic/t": {"start": 100, "sequence": 250},
            "/topic/u": {"start": 7, "sequence": 7},
        }
    }
    assert TopicBatch.parse(topics.to_json()) == topics
    assert TopicOffset.parse(topics.to_json(), "/topic/u") == TopicOffset("/topic/u", 7, 7)
    queue = QueueOffset("/queue/q", 5_000_003, 2, 3, 500, 4096, 1200)
    queues = QueueBatch({"/queue/q": queue}, 4096, 3)
    assert QueueBatch.parse(queues.to_json()) == queues
    assert QueueOffset.parse(queues.to_json(), "/queue/q") == queue
    assert list(queue.lease_numbers()) == [5_000_002, 5_000_003]
    # Offsets of one destination, written before sources read several, read as that one's.
    old_topic = {"destination": "/topic/t", "start": 100, "sequence": 250}
    assert TopicBatch.parse(old_topic).entries == {"/topic/t": TopicOffset("/topic/t", 100, 250)}
    old_queue = {"destination": "/queue/q", "lease": 9, "leases": 1, "partitions": 1, "size": 5}
    old = QueueBatch.parse({**old_queue, "bytes": 0})
    assert (old.entries["/queue/q"], old.bytes, old.turn, old.made) == (
        QueueOffset("/queue/q", 9, 1, 1, 5, 0),
        0,
        0,
        False,
    )
    assert QueueBatch.parse({**old_queue, "bytes": 0, "total": 5}).made
    assert list(lease_names("g", queue)) == [
        "g/5000002",
        "g/5000003",
        "g.1/5000002",
        "g.1/5000003",
        "g.2/5000002",
        "g.2/5000003",
    ]
    with pytest.raises(SchemaMismatch, match="no position for '/topic/other'"):
        TopicOffset.parse(topics.to_json(), "/topic/other")
    with pytest.raises(SchemaMismatch, match="not a sluiceway offset"):
        TopicOffset.parse({"destination": "/topic/t", "start": 1, "sequence": "x"}, "/topic/t")
    with pytest.raises(SchemaMismatch, match="new checkpoint location"):
        TopicBatch.parse({"index": 3})


def test_a_range_is_cut_into_contiguous_partitions() -> None:
    parts = split_range("/topic/t", 10, 20, 3)
    assert [(p.start, p.end) for p in parts] == [(10, 13), (13, 16), (16, 20)]
    assert [(p.start, p.end) for p in split_range("/topic/t", 5, 7, 4)] == [(5, 6), (6, 7)]
    assert split_range("/topic/t", 7, 7, 2) == []


def test_a_queue_batch_is_planned_as_leases_under_the_caps() -> None:
    reader = queue_reader(minPartitions="3")
    reader._makes_leases = True  # the driver makes the leases, within the batch's caps
    begin = QueueOffset("/queue/q", 1000, 0, 0, 0, 0)
    plan = reader._plan(begin, 1000, 3)
    assert (plan.lease, plan.leases, plan.partitions, plan.size, plan.total) == (
        1001,
        1,
        3,
        334,
        1000,
    )
    small = reader._plan(begin, 2, 2)
    assert (small.partitions, small.size, small.total) == (2, 1, 2)
    assert reader._batch({"/queue/q": small}, 4096, 1).bytes == 4096
    assert reader._plan(begin, 0, 0) == QueueOffset("/queue/q", 1000, 0, 0, 0, 0)
    # A batch beyond what one lease may hold takes several leases per partition.
    plan = reader._plan(begin, 250_000, 1)
    assert (plan.lease, plan.leases, plan.size, plan.total) == (1003, 3, 83_334, 250_000)
    # A broker that does not make leases for the driver: each is made by its read, within an
    # equal share of the caps.
    reader._makes_leases = False
    small = reader._plan(begin, 2, 2)
    assert (small.partitions, small.size, small.total) == (2, 1, None)
    assert reader._batch({"/queue/q": small}, 4096, 1).bytes == 2048


def test_read_limits_from_spark_become_caps() -> None:
    reader = queue_reader(maxMessagesPerTrigger="500", maxBytesPerTrigger="1k")
    driver = reader.driver
    assert driver.caps(ReadMaxRows(200)) == Caps(200, 1024)
    assert driver.caps(ReadAllAvailable()) == Caps(None, None)
    assert driver.caps(ReadMaxBytes(10)) == Caps(500, 10)


def test_readers_pickle_without_their_sockets(broker: BrokerThread) -> None:
    options = {"destination": "/topic/t", "group": "g", "port": str(broker.port)}
    reader = TopicStreamReader(source_options(options))
    reader.initialOffset()
    assert reader.driver.connection.connected
    shipped = shipped_copy(reader)
    assert not shipped.driver.connection.connected
    reader.stop()
    assert not reader.driver.connection.connected


def test_the_initial_offset_is_computed_once(make_broker: BrokerFactory) -> None:
    broker = make_broker()
    options = {"destination": "/topic/t", "group": "g", "startingOffsets": "latest"}
    reader = TopicStreamReader(source_options({**options, "port": str(broker.port)}))
    first = reader.initialOffset()
    publish(broker, "/topic/t", 0, 5)
    assert reader.initialOffset() == first
    reader.stop()


def test_a_message_becomes_a_row_of_the_source_schema() -> None:
    headers = {
        "message-id": "q-1",
        "destination": "/queue/q",
        "sequence": "42",
        "priority": "7",
        "persistent": "true",
        "timestamp": "1700000000000",
        "expires": "0",
        "redelivered": "true",
        "delivery-count": "2",
        "content-type": "text/plain;charset=latin-1",
        "region": "EU",
        "lease": "g/1",
        "subscription": "p1",
    }
    row = message_row(PipelineMessage("café".encode("latin-1"), headers), include_headers=True)
    assert len(row) == len(SOURCE_SCHEMA.fields)
    as_dict = dict(zip(SOURCE_SCHEMA.fieldNames(), row, strict=True))
    assert as_dict["text"] == "café"
    assert as_dict["headers"] == {"content-type": "text/plain;charset=latin-1", "region": "EU"}
    assert as_dict["sequence"] == 42
    assert as_dict["timestamp"] == datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=datetime.UTC)
    assert as_dict["expires"] is None
    assert (as_dict["redelivered"], as_dict["delivery_count"], as_dict["priority"]) == (True, 2, 7)
    binary = message_row(PipelineMessage(b"\xff\xfe", {}), include_headers=False)
    assert binary[1] is None  # not text
    assert binary[2] is None  # includeHeaders=false


def test_sink_columns_are_checked_and_rows_become_messages() -> None:
    schema = StructType.fromJson(
        {
            "type": "struct",
            "fields": [
                {"name": "body", "type": "string", "nullable": True, "metadata": {}},
                {"name": "sequence", "type": "long", "nullable": True, "metadata": {}},
                {"name": "priority", "type": "integer", "nullable": True, "metadata": {}},
                {"name": "destination", "type": "string", "nullable": True, "metadata": {}},
            ],
        }
    )
    columns = SinkColumns.bind(schema)
    message = columns.message(
        Row(body="hé", sequence=9, priority=8, destination="/queue/row"), None, True, 4
    )
    assert message.body == "hé".encode()
    assert message.headers == {"content-type": "text/plain;charset=utf-8"}
    assert (message.priority, message.destination) == (8, "/queue/row")
    # The destination option wins over the column, as Kafka's topic option does.
    assert columns.message(
        Row(body="x", sequence=1, priority=None, destination="/queue/row"), "/queue/opt", True, 4
    ).destination == ("/queue/opt")
    with pytest.raises(SchemaMismatch, match="no destination"):
        columns.message(Row(body="x", sequence=1, priority=None, destination=None), None, True, 4)
    bad = StructType.fromJson(
        {
            "type": "struct",
            "fields": [{"name": "body", "type": "integer", "nullable": True, "metadata": {}}],
        }
    )
    with pytest.raises(SchemaMismatch, match="binary or string"):
        SinkColumns.bind(bad)


def test_the_sink_takes_sparks_record_batches_as_it_takes_rows() -> None:
    schema = StructType.fromJson(
        {
            "type": "struct",
            "fields": [
                {"name": "body", "type": "binary", "nullable": True, "metadata": {}},
                {
                    "name": "headers",
                    "type": {
                        "type": "map",
                        "keyType": "string",
                        "valueType": "string",
                        "valueContainsNull": True,
                    },
                    "nullable": True,
                    "metadata": {},
                },
                {"name": "priority", "type": "integer", "nullable": True, "metadata": {}},
                {"name": "persistent", "type": "boolean", "nullable": True, "metadata": {}},
            ],
        }
    )
    options = sink_options({"destination": "/queue/out", "persistent": "false"})
    rows = SinkRows(options, schema)
    batch = pa.RecordBatch.from_pydict(
        {
            "body": [b"a", None, b"c"],
            "headers": [[("k", "v")], None, []],
            "priority": [1, None, 9],
            "persistent": [None, True, False],
        },
        schema=pa.schema(
            [
                ("body", pa.binary()),
                ("headers", pa.map_(pa.string(), pa.string())),
                ("priority", pa.int32()),
                ("persistent", pa.bool_()),
            ]
        ),
    )
    from_arrow = list(rows.messages(iter([batch])))
    columns = SinkColumns.bind(schema)
    from_rows = [
        columns.message(Row(**values), "/queue/out", False, 4) for values in batch.to_pylist()
    ]
    assert from_arrow == from_rows
    assert [(m.body, m.headers, m.priority, m.persistent) for m in from_arrow] == [
        (b"a", {"k": "v"}, 1, False),
        (b"", {}, 4, True),
        (b"c", {}, 9, False),
    ]


def test_the_sink_name_comes_from_the_checkpoints_query_id(tmp_path: Path) -> None:
    (tmp_path / "metadata").write_text('{"id":"25e2479c-25f3-40fc-8d12-12a10baf9ff0"}\n')
    assert checkpoint_query_id(str(tmp_path)) == "25e2479c-25f3-40fc-8d12-12a10baf9ff0"
    assert checkpoint_query_id(f"file:{tmp_path}") == "25e2479c-25f3-40fc-8d12-12a10baf9ff0"
    assert checkpoint_query_id(str(tmp_path / "missing")) is None
    assert checkpoint_query_id("s3a://bucket/checkpoint") is None
    assert sink_options({"sinkId": "fixed"}).sink_id == "fixed"


def test_partitions_pickle() -> None:
    part = RangePartition("/topic/t", 1, 5)
    assert shipped_copy(part) == part


def topic_reader(broker: BrokerThread, **options: str) -> TopicStreamReader:
    base = {"destination": "/topic/t", "group": "g", "port": str(broker.port)}
    return TopicStreamReader(source_options({**base, **options}))


def test_max_bytes_per_trigger_cuts_a_topic_batch(broker: BrokerThread) -> None:
    reader = topic_reader(broker, maxBytesPerTrigger="350", startingOffsets="earliest")
    start = reader.initialOffset()  # opens the cursor, so the topic keeps what follows
    with PipelineConnection(settings(broker)) as connection:
        connection.send_many(OutgoingMessage("/topic/t", bytes(100)) for _ in range(10))
    end = TopicOffset.parse(reader.latestOffset(start, ReadMaxRows(1000)), "/topic/t")
    assert (end.start, end.sequence) == (1, 4)  # three bodies of 100 bytes; a fourth is too many
    whole = TopicOffset.parse(reader.latestOffset(start, ReadAllAvailable()), "/topic/t")
    assert whole.sequence == 11
    reader.stop()


@pytest.mark.parametrize("fail", [True, False])
def test_messages_released_under_a_batch_are_reported(broker: BrokerThread, fail: bool) -> None:
    reader = topic_reader(broker, failOnDataLoss=str(fail).lower(), startingOffsets="earliest")
    start = reader.initialOffset()
    publish(broker, "/topic/t", 0, 10)
    end = reader.latestOffset(start, ReadMaxRows(1000))
    # Another query on the same group commits past this one: messages 1 to 5 are released.
    with PipelineConnection(settings(broker)) as connection:
        connection.commit_cursor("/topic/t", "g", 6)
    if fail:
        with pytest.raises(DataLossError, match="1 to 5 may be gone"):
            reader.partitions(start, end)
    else:
        parts = reader.partitions(start, end)
        assert [(p.start, p.end) for p in parts if isinstance(p, RangePartition)] == [(1, 11)]
    reader.stop()


def test_a_broker_restart_gap_in_sequence_numbers_is_not_a_loss(
    make_broker: BrokerFactory, tmp_path: Path
) -> None:
    data = {"imq.persist.file.directory": str(tmp_path / "data")}
    broker = make_broker(data)
    reader = topic_reader(broker, startingOffsets="earliest")
    start = reader.initialOffset()
    publish(broker, "/topic/t", 0, 3)
    end = reader.latestOffset(start, ReadMaxRows(1000))
    assert TopicOffset.parse(end, "/topic/t").sequence == 4
    reader.commit(end)
    reader.stop()
    broker.stop()
    # After a restart the broker hands out sequence numbers from a new block.
    restarted = make_broker(data)
    reader = topic_reader(restarted)
    publish(restarted, "/topic/t", 3, 2)
    later = reader.latestOffset(end, ReadMaxRows(1000))
    batch = TopicOffset.parse(later, "/topic/t")
    assert batch.start == 4
    parts = reader.partitions(end, later)  # no DataLossError
    assert (
        sum(p.end - p.start for p in parts if isinstance(p, RangePartition)) == batch.sequence - 4
    )
    reader.stop()


def test_a_queue_batch_reads_its_leases_under_the_byte_cap(broker: BrokerThread) -> None:
    options = {"port": str(broker.port), "maxBytesPerTrigger": "350", "minPartitions": "2"}
    reader = queue_reader(**options)
    with PipelineConnection(settings(broker)) as connection:
        connection.send_many(OutgoingMessage("/queue/q", bytes(100)) for _ in range(10))
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(1000))
    parts = reader.partitions(start, end)
    assert [p.group for p in parts if isinstance(p, LeasePartition)] == ["g", "g.1"]
    # The driver made the leases in order: the first took 300 bytes, the second nothing (the
    # next message would take the batch over 350). The tasks read them.
    rows = [row for part in parts for batch in reader.read(part) for row in batch.to_pylist()]
    assert sum(len(row["body"]) for row in rows) == 300
    assert len(rows) == 3
    reader.commit(end)
    with PipelineConnection(settings(broker)) as connection:
        assert connection.head("/queue/q").message_count == 7
    reader.stop()


QUEUE_HEADER = {"destination": "/queue/q"}  # every message of a pack has the same


@pytest.mark.parametrize("include_headers", [True, False])
def test_record_batches_hold_the_rows_message_row_makes(include_headers: bool) -> None:
    messages = [
        PipelineMessage(
            b"caf\xe9",
            {
                "message-id": "m-1",
                "sequence": "7",
                "destination": "/queue/q",
                "priority": "9",
                "persistent": "true",
                "timestamp": "1700000000123",
                "expires": "1700000999000",
                "redelivered": "true",
                "delivery-count": "3",
                "content-type": "text/plain;charset=latin-1",
                "region": "eu",
                "lease": "g/1",
            },
        ),
        PipelineMessage(b"\xff\xfe", {"message-id": "m-2", "sequence": "8", **QUEUE_HEADER}),
        PipelineMessage(
            b"", {"message-id": "m-3", "sequence": "9", "timestamp": "1", **QUEUE_HEADER}
        ),
    ]
    expected = [
        dict(zip(SOURCE_SCHEMA.fieldNames(), message_row(m, include_headers), strict=True))
        for m in messages
    ]
    # Built message by message, and from the columns of a pack of the same messages (with
    # and without producers' headers, which take the slower path for texts and maps).
    bare = [PipelineMessage(m.body, {**m.headers, "content-type": ""}) for m in messages[1:]]
    bare_expected = [
        dict(zip(SOURCE_SCHEMA.fieldNames(), message_row(m, include_headers), strict=True))
        for m in bare
    ]
    for batch, wanted in (
        (next(record_batches(messages, include_headers)), expected),
        (pack_batch(MessagePack.of(messages), include_headers), expected),
        (pack_batch(MessagePack.of(bare[1:]), include_headers), bare_expected[1:]),
        (pack_batch(MessagePack.of(bare), include_headers), bare_expected),
    ):
        assert batch.schema == ARROW_SCHEMA
        got = batch.to_pylist()
        for row in got:
            if row["headers"] is not None:
                row["headers"] = dict(row["headers"])
        assert got == wanted
    assert expected[0]["text"] == "café"
    assert expected[1]["text"] is None  # not UTF-8


# -- several destinations ------------------------------------------------------------------------


def test_a_batch_s_caps_and_partitions_are_shared_among_its_destinations() -> None:
    # Max-min fair: what has less than an equal share takes it all; the odd units turn.
    assert fair_shares({"a": 100, "b": 3, "c": 0}, 20) == {"a": 17, "b": 3, "c": 0}
    assert fair_shares({"a": 9, "b": 9, "c": 9}, 10, turn=0) == {"a": 4, "b": 3, "c": 3}
    assert fair_shares({"a": 9, "b": 9, "c": 9}, 10, turn=1) == {"a": 3, "b": 4, "c": 3}
    assert fair_shares({"a": 5, "b": 5}, 1, turn=1) == {"a": 0, "b": 1}
    assert fair_shares({"a": 5, "b": 5}, None) == {"a": 5, "b": 5}
    assert fair_shares({"a": 2, "b": 3}, 10) == {"a": 2, "b": 3}
    assert rotated(["a", "b", "c"], 4) == ["b", "c", "a"]
    # Partitions in proportion to the messages, at least one each, at most one per message.
    assert spread(4, {"a": 17, "b": 3, "c": 0}) == {"a": 3, "b": 1}
    assert spread(1, {"a": 5, "b": 5}) == {"a": 1, "b": 1}
    assert spread(8, {"a": 2, "b": 30}) == {"a": 1, "b": 7}
    assert spread(8, {"a": 1, "b": 2}) == {"a": 1, "b": 2}
    assert spread(3, {}) == {}


def rows_of(reader: QueueStreamReader | TopicStreamReader, parts: Sequence[Any]) -> list[Any]:
    return [row for part in parts for batch in reader.read(part) for row in batch.to_pylist()]


def destroy(broker: BrokerThread, path: str) -> None:
    assert broker.broker is not None
    core = broker.broker
    broker.call(lambda: core.destroy_destination(parse_destination(path)))


def test_queues_of_a_pattern_share_the_batch_and_one_destroyed_is_dropped(
    broker: BrokerThread,
) -> None:
    with PipelineConnection(settings(broker)) as connection:
        connection.send_many(OutgoingMessage("/queue/q.a", bytes(100)) for _ in range(100))
        connection.send_many(OutgoingMessage("/queue/q.b", bytes(10)) for _ in range(3))
        connection.head("/queue/q.c")  # made, empty
    options = {"destination": "/queue/q.*", "port": str(broker.port), "minPartitions": "4"}
    reader = queue_reader(maxMessagesPerTrigger="20", **options)
    start = reader.initialOffset()
    assert sorted(QueueBatch.parse(start).entries) == ["/queue/q.a", "/queue/q.b", "/queue/q.c"]
    end = reader.latestOffset(start, ReadMaxRows(20))
    assert reader.reportLatestOffset() == {
        "destinations": {q: {"waiting": n} for q, n in (("/queue/q.a", 100), ("/queue/q.b", 3))}
        | {"/queue/q.c": {"waiting": 0}}
    }
    planned = QueueBatch.parse(end)
    assert {q: e.total for q, e in planned.entries.items()} == {
        "/queue/q.a": 17,
        "/queue/q.b": 3,
        "/queue/q.c": None,
    }
    parts = reader.partitions(start, end)
    assert [(p.destination, p.group) for p in parts if isinstance(p, LeasePartition)] == [
        ("/queue/q.a", "g"),
        ("/queue/q.a", "g.1"),
        ("/queue/q.a", "g.2"),
        ("/queue/q.b", "g"),
    ]
    rows = rows_of(reader, parts)
    assert Counter(row["destination"] for row in rows) == {"/queue/q.a": 17, "/queue/q.b": 3}
    reader.commit(end)
    reader.stop()
    # A queue that is gone is dropped; the byte cap holds for the whole batch.
    destroy(broker, "/queue/q.b")
    capped = queue_reader(maxBytesPerTrigger="530", **options)
    later = capped.latestOffset(end, ReadMaxRows(1000))
    assert sorted(QueueBatch.parse(later).entries) == ["/queue/q.a", "/queue/q.c"]
    rows = rows_of(capped, capped.partitions(end, later))
    assert len(rows) == 5  # five of q.a's 100-byte messages: a sixth would pass 530 bytes
    capped.stop()


def test_a_topic_pattern_picks_a_new_topic_up_from_its_start_and_drops_a_destroyed_one(
    broker: BrokerThread,
) -> None:
    reader = topic_reader(broker, destination="/topic/t.*")
    with PipelineConnection(settings(broker)) as connection:
        connection.head("/topic/t.a")
    start = reader.initialOffset()  # opens t.a's cursor
    publish(broker, "/topic/t.a", 0, 5)
    with PipelineConnection(settings(broker)) as connection:
        connection.head("/topic/t.b")  # a topic that appears while the query runs
    found = reader.latestOffset(start, ReadMaxRows(1000))
    assert TopicBatch.parse(found).entries == {
        "/topic/t.a": TopicOffset("/topic/t.a", 1, 6),
        "/topic/t.b": TopicOffset("/topic/t.b", 1, 1),  # its cursor opened: it keeps from here
    }
    publish(broker, "/topic/t.b", 5, 3)
    later = reader.latestOffset(found, ReadMaxRows(1000))
    assert TopicOffset.parse(later, "/topic/t.b") == TopicOffset("/topic/t.b", 1, 4)
    assert reader.reportLatestOffset() == {
        "destinations": {"/topic/t.a": {"sequence": 6}, "/topic/t.b": {"sequence": 4}}
    }
    rows = rows_of(reader, reader.partitions(found, later))
    assert [(row["destination"], row["text"]) for row in rows] == [
        ("/topic/t.b", f"m{i}") for i in range(5, 8)
    ]
    reader.commit(later)
    destroy(broker, "/topic/t.a")
    assert TopicBatch.parse(reader.latestOffset(later, ReadMaxRows(1000))).entries == {
        "/topic/t.b": TopicOffset("/topic/t.b", 4, 4)
    }
    reader.stop()


def test_the_byte_cap_holds_for_all_topics_of_a_batch_shared_between_them(
    broker: BrokerThread,
) -> None:
    topics = ("/topic/u.a", "/topic/u.b")
    reader = topic_reader(
        broker, destination=",".join(topics), maxBytesPerTrigger="450", startingOffsets="earliest"
    )
    start = reader.initialOffset()
    with PipelineConnection(settings(broker)) as connection:
        for topic in topics:
            connection.send_many(OutgoingMessage(topic, bytes(100)) for _ in range(10))
    end = reader.latestOffset(start, ReadMaxRows(1000))
    # u.a first, within half of 450 bytes: two messages; u.b within the 250 left: two more.
    assert {t: e.width for t, e in TopicBatch.parse(end).entries.items()} == dict.fromkeys(
        topics, 2
    )
    assert sum(len(row["body"]) for row in rows_of(reader, reader.partitions(start, end))) == 400
    reader.stop()
