"""The sink's record batches as packed SENDs (pipelines-protocol.md, "Packed sends"), built
from the Arrow buffers: the bodies go into a pack as Arrow holds them, with no Python object
per row. Rows with a headers column or a destination column of their own, or a body column with
nulls, take the row-by-row path (`SinkRows.messages`), packed by the client.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterator
from typing import Final

import pyarrow as pa

from sluiceway.client.pipeline import OutgoingPack
from sluiceway.protocol.pack import (
    MAX_PACK,
    PACK_BYTES,
    PERSISTENT,
    header_lines,
    little_endian,
    send_pack,
)
from sluiceway.spark.errors import SchemaMismatch
from sluiceway.spark.rows import Defaults, SinkColumns

_TEXT_LINE: Final = header_lines((("content-type", "text/plain;charset=utf-8"),))


def columnar(batch: pa.RecordBatch, columns: SinkColumns, defaults: Defaults) -> bool:
    """Whether `batch` can be packed from its buffers (`packs`)."""
    if columns.headers is not None or defaults.destination is None:
        return False
    body = batch.column(columns.body)
    plain = pa.types.is_binary(body.type) or pa.types.is_string(body.type)
    return bool(plain and body.null_count == 0)


def packs(
    batch: pa.RecordBatch, columns: SinkColumns, defaults: Defaults
) -> Iterator[OutgoingPack]:
    """The rows of `batch` (`columnar` said yes) as packs of at most MAX_PACK messages and
    PACK_BYTES of bodies (a body as large alone makes a pack of one)."""
    assert defaults.destination is not None
    body = batch.column(columns.body)
    count = len(body)
    if count == 0:
        return
    _, offset_buffer, data_buffer = body.buffers()
    offsets = array("i")
    offsets.frombytes(offset_buffer.slice(body.offset * 4, (count + 1) * 4).to_pybytes())
    if sys.byteorder != "little":
        offsets.byteswap()
    data = memoryview(data_buffer) if data_buffer is not None else memoryview(b"")
    priorities = _priorities(batch, columns, defaults, count)
    flags = _flags(batch, columns, defaults, count)
    text = pa.types.is_string(body.type)
    start = 0
    while start < count:
        end, base = start + 1, offsets[start]
        limit = min(count, start + MAX_PACK)
        while end < limit and offsets[end + 1] - base <= PACK_BYTES:
            end += 1
        size = end - start
        rebased = array("I", [offset - base for offset in offsets[start : end + 1]])
        if text:
            step = len(_TEXT_LINE)
            header_offsets = little_endian(array("I", range(0, (size + 1) * step, step)))
            headers = _TEXT_LINE * size
        else:
            header_offsets, headers = bytes(4 * (size + 1)), b""
        pack = send_pack(
            size,
            little_endian(rebased),
            bytes(data[base : offsets[end]]),
            expires=bytes(8 * size),
            priorities=priorities[start:end],
            flags=flags[start:end],
            header_offsets=header_offsets,
            headers=headers,
        )
        yield OutgoingPack(defaults.destination, size, pack)
        start = end


def _priorities(
    batch: pa.RecordBatch, columns: SinkColumns, defaults: Defaults, count: int
) -> bytes:
    if columns.priority is None:
        return bytes([defaults.priority]) * count
    values = [
        defaults.priority if v is None else v for v in batch.column(columns.priority).to_pylist()
    ]
    wrong = next((v for v in values if not 0 <= v <= 9), None)
    if wrong is not None:
        raise SchemaMismatch(f"a row has priority {wrong}; priorities are 0 to 9")
    return bytes(values)


def _flags(batch: pa.RecordBatch, columns: SinkColumns, defaults: Defaults, count: int) -> bytes:
    default = PERSISTENT if defaults.persistent else 0
    if columns.persistent is None:
        return bytes([default]) * count
    return bytes(
        [
            default if v is None else (PERSISTENT if v else 0)
            for v in batch.column(columns.persistent).to_pylist()
        ]
    )
