"""Rows in and out: the source's schema, a message as a row, a row as a message to send.

The source's columns, in this order (docs/spark.md describes each):
`body` binary, `text` string (the body decoded by its content-type's charset, UTF-8 by default;
null when it cannot be), `headers` map<string,string> (the producer's own headers; null with
includeHeaders=false), `message_id` string, `sequence` long, `destination` string, `priority`
int, `persistent` boolean, `timestamp` timestamp (when the broker accepted it), `expires`
timestamp (null: never), `redelivered` boolean, `delivery_count` int.

The sink takes `body` (binary, or string sent as UTF-8 text) and, optionally, `headers`,
`destination`, `priority` and `persistent`; the source's other columns are ignored, so a stream
read from one destination can be written to another as it is. Any other column is refused.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, NamedTuple

from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    Row,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from sluiceway.client.pipeline import OutgoingMessage, PipelineMessage
from sluiceway.protocol.frames import DELIVERY_HEADERS
from sluiceway.spark.errors import SchemaMismatch

SOURCE_SCHEMA: Final = StructType(
    [
        StructField("body", BinaryType()),
        StructField("text", StringType()),
        StructField("headers", MapType(StringType(), StringType())),
        StructField("message_id", StringType()),
        StructField("sequence", LongType()),
        StructField("destination", StringType()),
        StructField("priority", IntegerType()),
        StructField("persistent", BooleanType()),
        StructField("timestamp", TimestampType()),
        StructField("expires", TimestampType()),
        StructField("redelivered", BooleanType()),
        StructField("delivery_count", IntegerType()),
    ]
)

# Headers the broker sets on a MESSAGE (or the read adds): they have columns of their own or
# mean nothing outside the read, so the `headers` column leaves them out.
BROKER_HEADERS: Final = DELIVERY_HEADERS | {"lease", "browser"}

# The source's metadata columns, which the sink accepts and ignores.
_IGNORED_BY_SINK: Final = frozenset(field.name for field in SOURCE_SCHEMA) - {
    "body",
    "headers",
    "destination",
    "priority",
    "persistent",
}
_INTEGRAL: Final = (ByteType, ShortType, IntegerType, LongType)

Cell = bytes | str | int | bool | datetime.datetime | dict[str, str] | None
SourceRow = tuple[Cell, ...]


def check_source_schema(schema: StructType) -> None:
    """A user-given schema must be the source's (the rows are built in that order)."""
    if [f.name for f in schema.fields] != SOURCE_SCHEMA.fieldNames():
        raise SchemaMismatch(
            "the sluiceway source has a fixed schema; drop .schema(...) or give exactly: "
            + SOURCE_SCHEMA.simpleString()
        )


def _instant(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)


def message_row(message: PipelineMessage, include_headers: bool) -> SourceRow:
    """One message as a row of SOURCE_SCHEMA."""
    try:
        text: str | None = message.text
    except (UnicodeDecodeError, LookupError):
        text = None
    headers = None
    if include_headers:
        headers = {k: v for k, v in message.headers.items() if k not in BROKER_HEADERS}
    expires = message.expires
    return (
        message.body,
        text,
        headers,
        message.message_id,
        message.sequence,
        message.destination,
        message.priority,
        message.persistent,
        _instant(message.timestamp),
        _instant(expires) if expires else None,
        message.redelivered,
        message.delivery_count,
    )


class Defaults(NamedTuple):
    """What a row without the column gets: the sink's options."""

    destination: str | None
    persistent: bool
    priority: int


@dataclass(frozen=True, slots=True)
class SinkColumns:
    """Where the sink finds each of its columns in the input rows (None: absent)."""

    body: int
    headers: int | None
    destination: int | None
    priority: int | None
    persistent: int | None

    @classmethod
    def bind(cls, schema: StructType) -> SinkColumns:
        """Check `schema` and locate the columns; SchemaMismatch says what does not fit."""
        positions: dict[str, int] = {}
        for index, column in enumerate(schema.fields):
            name = column.name.lower()
            if name in _IGNORED_BY_SINK:
                continue
            check = _SINK_TYPES.get(name)
            if check is None:
                raise SchemaMismatch(
                    f"the sluiceway sink does not know column {column.name!r}; it writes body "
                    "(binary or string) and optionally headers (map<string,string>), "
                    "destination (string), priority (integer), persistent (boolean): select "
                    "or rename columns first"
                )
            expected = check(column.dataType)
            if expected is not None:
                raise SchemaMismatch(
                    f"column {column.name!r} is {column.dataType.simpleString()}; the sink "
                    f"needs {expected}"
                )
            positions[name] = index
        if "body" not in positions:
            raise SchemaMismatch(
                "the sluiceway sink needs a body column (binary or string); columns are: "
                + ", ".join(schema.fieldNames())
            )
        body = positions["body"]
        return cls(
            body=body,
            headers=positions.get("headers"),
            destination=positions.get("destination"),
            priority=positions.get("priority"),
            persistent=positions.get("persistent"),
        )

    def message(
        self, row: Row, default_destination: str | None, persistent: bool, priority: int
    ) -> OutgoingMessage:
        """The message a row stands for."""
        values = tuple(None if i is None else row[i] for i in self.positions)
        return self.message_of(values, Defaults(default_destination, persistent, priority))

    @property
    def positions(self) -> tuple[int | None, ...]:
        """Where body, headers, destination, priority and persistent are (None: absent)."""
        return (self.body, self.headers, self.destination, self.priority, self.persistent)

    def message_of(self, values: tuple[object, ...], defaults: Defaults) -> OutgoingMessage:
        """The message of one row's values, in the order of `positions` (None: the column is
        absent or null). The `destination` option, when set, wins over the column (as Kafka's
        `topic` option does), so a stream read from one destination and written to another
        with its columns as they are never loops back to its source."""
        body, own_headers, row_destination, row_priority, row_persistent = values
        headers: dict[str, str] = {}
        if isinstance(own_headers, Mapping | list):
            headers.update(own_headers)  # a Row's dict, or Arrow's (key, value) pairs
        destination, persistent, priority = defaults
        if isinstance(body, str):
            data = body.encode()
            headers.setdefault("content-type", "text/plain;charset=utf-8")
        elif isinstance(body, bytes | bytearray | memoryview):
            data = bytes(body)
        else:
            data = b""
        if destination is None and row_destination is not None:
            destination = str(row_destination)
        if not destination:
            raise SchemaMismatch(
                "a row has no destination: set the destination option, or give every row a "
                "destination column value"
            )
        if isinstance(row_priority, int):
            priority = row_priority
            if not 0 <= priority <= 9:
                raise SchemaMismatch(f"a row has priority {priority}; priorities are 0 to 9")
        if row_persistent is not None:
            persistent = bool(row_persistent)
        return OutgoingMessage(
            destination=str(destination),
            body=data,
            headers=headers,
            persistent=persistent,
            priority=priority,
        )


def _is(kinds: tuple[type[DataType], ...], name: str) -> Callable[[DataType], str | None]:
    def check(data_type: DataType) -> str | None:
        return None if isinstance(data_type, kinds) else name

    return check


def _string_map(data_type: DataType) -> str | None:
    if (
        isinstance(data_type, MapType)
        and isinstance(data_type.keyType, StringType)
        and isinstance(data_type.valueType, StringType)
    ):
        return None
    return "map<string,string>"


_SINK_TYPES: Final[dict[str, Callable[[DataType], str | None]]] = {
    "body": _is((BinaryType, StringType), "binary or string"),
    "headers": _string_map,
    "destination": _is((StringType,), "string"),
    "priority": _is(_INTEGRAL, "an integer type"),
    "persistent": _is((BooleanType,), "boolean"),
}
