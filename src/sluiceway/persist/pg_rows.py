"""The jdbc store's rows: how the operations of one commit become SQL, and how committed bytes
are read back (persist.pg_files keeps what is pending and decides when to commit).

A file is one row of sluiceway_file (its name and size) and its bytes are rows of
sluiceway_chunk keyed by the offset they start at, each at most ROW_BYTES long: the writes one
commit makes to one file go in as one run, cut into rows of that size, so a journal that group
commits writes one row per file per commit. A read selects the rows overlapping its range (the
bound on a row's length lets the primary key find the first one) and has the database cut them
to the range, so it never loads more than it asked for.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, LiteralString

if TYPE_CHECKING:
    from collections.abc import Iterable

    import psycopg

    Connection = psycopg.Connection[tuple[object, ...]]

ROW_BYTES: Final = 1 << 20  # bytes: the largest chunk row; a read selects rows this far back


class Kind(enum.Enum):
    CREATE = "create"
    WRITE = "write"
    TRUNCATE = "truncate"
    REPLACE = "replace"
    REMOVE = "remove"


@dataclass(frozen=True, slots=True)
class Change:
    """One operation on the store's files, as the tables take it."""

    kind: Kind
    name: str
    target: str = ""  # replace: the new name
    position: int = 0  # write: the offset; truncate: the length
    data: bytes = b""


def apply_changes(connection: Connection, key: tuple[str, str], changes: Iterable[Change]) -> None:
    """Make `changes` in the caller's transaction, in order; `key`: (cluster_id, broker_id)."""
    _Apply(connection, key).run(changes)


def select_range(
    connection: Connection, key: tuple[str, str], name: str, start: int, end: int
) -> list[tuple[int, bytes]]:
    """The committed bytes of `name` from `start` to `end`: (position, bytes) per row, each cut
    by the database to the range."""
    rows = connection.execute(
        "SELECT position, substr(data, "
        "(greatest(%(start)s - position, 0) + 1)::integer, "
        "(%(end)s - greatest(position, %(start)s))::integer) FROM sluiceway_chunk "
        "WHERE cluster_id = %(cluster)s AND broker_id = %(broker)s AND name = %(name)s "
        "AND position > %(start)s - %(row)s AND position < %(end)s "
        "AND position + length(data) > %(start)s",
        {
            "start": start,
            "end": end,
            "cluster": key[0],
            "broker": key[1],
            "name": name,
            "row": ROW_BYTES,
        },
    ).fetchall()
    found = []
    for position, data in rows:
        assert isinstance(position, int)
        assert isinstance(data, bytes)
        found.append((position, data))
    return found


def list_files(connection: Connection, key: tuple[str, str]) -> dict[str, int]:
    """Every committed file of the store, and its size."""
    rows = connection.execute(
        "SELECT name, size FROM sluiceway_file WHERE cluster_id = %s AND broker_id = %s", key
    ).fetchall()
    found = {}
    for name, size in rows:
        assert isinstance(name, str)
        assert isinstance(size, int)
        found[name] = size
    return found


def read_files(connection: Connection, key: tuple[str, str]) -> dict[str, bytes]:
    """Every committed file's content, by name (whole files: for tests and inspection)."""
    rows = connection.execute(
        "SELECT f.name, f.size, c.position, c.data FROM sluiceway_file f "
        "LEFT JOIN sluiceway_chunk c USING (cluster_id, broker_id, name) "
        "WHERE f.cluster_id = %s AND f.broker_id = %s ORDER BY f.name, c.position",
        key,
    ).fetchall()
    found: dict[str, bytearray] = {}
    for name, size, position, data in rows:
        assert isinstance(name, str)
        assert isinstance(size, int)
        content = found.setdefault(name, bytearray(size))
        if isinstance(position, int) and isinstance(data, bytes):
            content[position : position + len(data)] = data
    return {name: bytes(content) for name, content in found.items()}


class _Apply:
    """One commit's operations as SQL, in order, in the caller's transaction: the writes of
    each file merged into rows of up to ROW_BYTES, flushed before any other operation."""

    def __init__(self, connection: Connection, key: tuple[str, str]) -> None:
        self._connection, self._key = connection, key
        self._runs: dict[str, tuple[int, bytearray]] = {}  # by name: (position, bytes) to insert

    def run(self, ops: Iterable[Change]) -> None:
        for op in ops:
            if op.kind is Kind.WRITE:
                self._write(op.name, op.position, op.data)
                continue
            self._flush()
            self._metadata(op)
        self._flush()

    def _write(self, name: str, position: int, data: bytes) -> None:
        run = self._runs.get(name)
        if run is not None and run[0] + len(run[1]) == position:
            run[1].extend(data)
        else:
            if run is not None:
                self._flush()
            self._runs[name] = (position, bytearray(data))

    def _flush(self) -> None:
        if not self._runs:
            return
        chunks: list[tuple[str, str, str, int, memoryview]] = []
        sizes: list[tuple[int, str, str, str]] = []
        for name, (position, data) in self._runs.items():
            view = memoryview(data)
            for start in range(0, len(data), ROW_BYTES):
                chunks.append((*self._key, name, position + start, view[start : start + ROW_BYTES]))
            sizes.append((position + len(data), *self._key, name))
        self._runs = {}
        with self._connection.cursor() as cursor:
            cursor.executemany(_SQL["insert"], chunks)
            cursor.executemany(_SQL["size"], sizes)

    def _metadata(self, op: Change) -> None:
        execute, key = self._connection.execute, self._key
        if op.kind is Kind.CREATE:
            execute(_SQL["create"], (*key, op.name))
        elif op.kind is Kind.TRUNCATE:
            length = op.position
            execute(_SQL["cut rows"], (*key, op.name, length))
            execute(_SQL["cut row"], (length, *key, op.name, length))
            execute(_SQL["size"], (length, *key, op.name))
        elif op.kind is Kind.REPLACE:
            for statement in ("drop rows", "drop file"):
                execute(_SQL[statement], (*key, op.target))
            for statement in ("rename rows", "rename file"):
                execute(_SQL[statement], (op.target, *key, op.name))
        else:
            for statement in ("drop rows", "drop file"):
                execute(_SQL[statement], (*key, op.name))


# The statements of a commit; each names one file's rows by (cluster_id, broker_id, name).
_SQL: Final[dict[str, LiteralString]] = {
    "create": "INSERT INTO sluiceway_file (cluster_id, broker_id, name, size) "
    "VALUES (%s, %s, %s, 0)",
    "insert": "INSERT INTO sluiceway_chunk (cluster_id, broker_id, name, position, data) "
    "VALUES (%s, %s, %s, %s, %s)",
    "size": "UPDATE sluiceway_file SET size = %s "
    "WHERE cluster_id = %s AND broker_id = %s AND name = %s",
    "cut rows": "DELETE FROM sluiceway_chunk "
    "WHERE cluster_id = %s AND broker_id = %s AND name = %s AND position >= %s",
    "cut row": "UPDATE sluiceway_chunk SET data = substr(data, 1, (%s - position)::integer) "
    "WHERE cluster_id = %s AND broker_id = %s AND name = %s AND position + length(data) > %s",
    "drop rows": "DELETE FROM sluiceway_chunk "
    "WHERE cluster_id = %s AND broker_id = %s AND name = %s",
    "drop file": "DELETE FROM sluiceway_file "
    "WHERE cluster_id = %s AND broker_id = %s AND name = %s",
    "rename rows": "UPDATE sluiceway_chunk SET name = %s "
    "WHERE cluster_id = %s AND broker_id = %s AND name = %s",
    "rename file": "UPDATE sluiceway_file SET name = %s "
    "WHERE cluster_id = %s AND broker_id = %s AND name = %s",
}
