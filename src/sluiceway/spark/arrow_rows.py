"""Messages to Arrow record batches: what the source's read() yields.

A read() that yields tuples has Spark's Python worker convert each row, field by field, into
Arrow before it goes to the JVM; that conversion costs more than reading the message. The
source yields `pyarrow.RecordBatch`es instead, with the same values `rows.message_row` gives
(`tests/spark/test_readers.py` holds them to the same rows), in the Arrow schema Spark expects
for SOURCE_SCHEMA. A pack (the broker's columns, protocol.pack) becomes a record batch mostly
without a Python step per message: its bodies, ids and numbers are taken as Arrow buffers as
they came; only texts in a charset other than UTF-8, and the producers' own headers, are
decoded message by message. `RowColumns` builds a batch from messages one at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema

from sluiceway.client.pipeline import PipelineMessage
from sluiceway.client.pipeline_packs import MessagePack
from sluiceway.protocol.pack import PERSISTENT, REDELIVERED
from sluiceway.spark.rows import BROKER_HEADERS, SOURCE_SCHEMA

# Rows per record batch: big enough that the per-batch cost vanishes, small enough that a
# partition is never held in memory (a batch of 1 KiB messages is about 8 MiB).
BATCH_ROWS: Final = 8192
# Messages per packed frame a read asks for (the broker also closes a pack at about 1 MiB of
# bodies, protocol.pack.PACK_BYTES).
PACK: Final = 4096

ARROW_SCHEMA: Final = to_arrow_schema(SOURCE_SCHEMA, timezone="UTC")
_MS_TO_US: Final = 1000


class RowColumns:
    """The columns of the rows added since the last `batch()`."""

    def __init__(self, include_headers: bool) -> None:
        self.include_headers = include_headers
        self._clear()

    def _clear(self) -> None:
        self.bodies: list[bytes] = []
        self.texts: list[str | None] = []
        self.headers: list[list[tuple[str, str]] | None] = []
        self.ids: list[str] = []
        self.sequences: list[int] = []
        self.destinations: list[str] = []
        self.priorities: list[int] = []
        self.persistent: list[bool] = []
        self.timestamps: list[int] = []
        self.expires: list[int | None] = []
        self.redelivered: list[bool] = []
        self.delivery_counts: list[int] = []

    def __len__(self) -> int:
        return len(self.bodies)

    def add(self, message: PipelineMessage) -> None:
        headers = message.headers
        self.bodies.append(message.body)
        try:
            self.texts.append(message.text)
        except (UnicodeDecodeError, LookupError):
            self.texts.append(None)
        if self.include_headers:
            own = [(k, v) for k, v in headers.items() if k not in BROKER_HEADERS]
            self.headers.append(own)
        else:
            self.headers.append(None)
        self.ids.append(headers.get("message-id", ""))
        self.sequences.append(int(headers.get("sequence", "0")))
        self.destinations.append(headers.get("destination", ""))
        self.priorities.append(int(headers.get("priority", "4")))
        self.persistent.append(headers.get("persistent") == "true")
        self.timestamps.append(int(headers.get("timestamp", "0")) * _MS_TO_US)
        expires = int(headers.get("expires", "0"))
        self.expires.append(expires * _MS_TO_US if expires else None)
        self.redelivered.append(headers.get("redelivered") == "true")
        self.delivery_counts.append(int(headers.get("delivery-count", "1")))

    def batch(self) -> pa.RecordBatch:
        """The rows added so far, as one record batch; the columns start empty again."""
        columns = (
            self.bodies,
            self.texts,
            self.headers,
            self.ids,
            self.sequences,
            self.destinations,
            self.priorities,
            self.persistent,
            self.timestamps,
            self.expires,
            self.redelivered,
            self.delivery_counts,
        )
        arrays = [
            pa.array(values, type=field.type)
            for values, field in zip(columns, ARROW_SCHEMA, strict=True)
        ]
        self._clear()
        return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def pack_batches(packs: Iterable[MessagePack], include_headers: bool) -> Iterator[pa.RecordBatch]:
    """Each pack as a record batch."""
    for pack in packs:
        if pack.count:
            yield pack_batch(pack, include_headers)


def record_batches(
    messages: Iterable[PipelineMessage], include_headers: bool
) -> Iterator[pa.RecordBatch]:
    """`messages` as record batches of at most BATCH_ROWS rows, yielded as they fill."""
    columns = RowColumns(include_headers)
    for message in messages:
        columns.add(message)
        if len(columns) >= BATCH_ROWS:
            yield columns.batch()
    if len(columns):
        yield columns.batch()


_TIMESTAMP: Final = ARROW_SCHEMA.field("timestamp").type
_HEADERS: Final = ARROW_SCHEMA.field("headers").type


def pack_batch(messages: MessagePack, include_headers: bool) -> pa.RecordBatch:
    """A pack's messages as one record batch."""
    pack, count = messages.pack, messages.count
    raw = pack.raw
    bodies = pa.Array.from_buffers(
        pa.binary(), count, [None, pa.py_buffer(raw[0]), pa.py_buffer(raw[1])]
    )
    ids = pa.Array.from_buffers(
        pa.string(), count, [None, pa.py_buffer(raw[2]), pa.py_buffer(raw[3])]
    )
    own = pack.header_offsets[-1] > 0  # some message has headers of its producer's
    flags = pa.Array.from_buffers(pa.uint8(), count, [None, pa.py_buffer(raw[8])])
    expires = _numbers(pa.int64(), count, raw[6])
    arrays = [
        bodies,
        _texts(messages, bodies) if own else _utf8(messages, bodies),
        _headers(messages) if include_headers else pa.nulls(count, _HEADERS),
        ids,
        _numbers(pa.int64(), count, raw[4]),
        pa.repeat(pa.scalar(messages.destination, pa.string()), count),
        _numbers(pa.uint8(), count, raw[7]).cast(pa.int32()),
        pc.not_equal(pc.bit_wise_and(flags, pa.scalar(PERSISTENT, pa.uint8())), 0),
        _instants(_numbers(pa.int64(), count, raw[5])),
        pc.if_else(pc.equal(expires, 0), pa.scalar(None, _TIMESTAMP), _instants(expires)),
        pc.not_equal(pc.bit_wise_and(flags, pa.scalar(REDELIVERED, pa.uint8())), 0),
        _numbers(pa.uint32(), count, raw[9]).cast(pa.int32()),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def _numbers(kind: pa.DataType, count: int, data: memoryview) -> pa.Array:
    return pa.Array.from_buffers(kind, count, [None, pa.py_buffer(data)])


def _instants(milliseconds: pa.Array) -> pa.Array:
    return pc.multiply(milliseconds, _MS_TO_US).cast(_TIMESTAMP)


def _utf8(messages: MessagePack, bodies: pa.Array) -> pa.Array:
    """The bodies as UTF-8 text (no content-type names another charset: none has headers)."""
    try:
        return bodies.cast(pa.string())
    except pa.ArrowInvalid:  # some body is not UTF-8: those rows get null
        return _texts(messages, bodies)


def _texts(messages: MessagePack, bodies: pa.Array) -> pa.Array:
    texts: list[str | None] = []
    for index in range(messages.count):
        try:
            texts.append(messages.message(index).text)
        except (UnicodeDecodeError, LookupError):
            texts.append(None)
    return pa.array(texts, pa.string())


def _headers(messages: MessagePack) -> pa.Array:
    pack, count = messages.pack, messages.count
    if pack.header_offsets[-1] == 0:  # none has headers of its own: every map is empty
        empty = pa.array([], pa.string())
        return pa.MapArray.from_arrays(pa.array([0] * (count + 1), pa.int32()), empty, empty)
    rows = [
        [(k, v) for k, v in pack.own_headers(index) if k not in BROKER_HEADERS]
        for index in range(count)
    ]
    return pa.array(rows, _HEADERS)
