"""The payloads of the journal records of stages (STAGE_OPEN, STAGE_ADD, STAGE_COMMIT,
STAGE_DISCARD, STAGE_SNAPSHOT), publishing a batch exactly once: their codecs.

The types are in persist.format's one table (RECORDS), the layouts byte by byte in
docs/persistence.md (Record format); the protocol is in docs/pipelines-protocol.md.
core.features.stages keeps the state, persist.stage_extension writes and replays the records.

A STAGE_ADD holds one staged message, written whatever its `persistent` header. `index` counts
the stage's earlier messages for the same destination, so the message's sequence number once
published is the stage's first sequence number for that destination plus `index`. `expires`
(ms since the epoch) is when the stage is discarded if nothing else is sent to it.

A STAGE_COMMIT is the one record that decides a COMMIT: it lists the stages it publishes, in
task order, each as stage id u64, count u16, then (destination, first sequence number u64) per
destination it has messages for; then the ids of the stages it discards (the batch's tasks not
listed, and stages of earlier batches of the sink). Its sink and batch become the sink's highest
committed batch.

A STAGE_SNAPSHOT restates, at the start of every new segment, what older segments may no longer
hold: the next stage id; the sinks, each as sink and highest committed batch u64; the open
stages, each a STAGE_OPEN payload; the published stages whose records may still be on disk, each
as commit LSN u64, last STAGE_ADD LSN u64, then a published stage as in STAGE_COMMIT. Each part
is a u32 count, then the items.
"""

from __future__ import annotations

import struct
from typing import Final

from sluiceway.core.values.message import Message
from sluiceway.core.values.message_codec import decode_message, encode_message, encode_text
from sluiceway.core.values.staging import (
    CommitRecord,
    OpenStage,
    PublishedStage,
    StagedHead,
    StageName,
    StageSnapshot,
)
from sluiceway.persist.format import Reader, encode_position

_U16: Final = struct.Struct("<H")
_U32: Final = struct.Struct("<I")
_U64: Final = struct.Struct("<Q")
_ADD_HEAD: Final = struct.Struct("<QQq")  # stage id, index, expires
_LSNS: Final = struct.Struct("<QQ")  # commit LSN, last STAGE_ADD LSN
assert (_U16.size, _U32.size, _U64.size) == (2, 4, 8)
assert _ADD_HEAD.size == 24
assert _LSNS.size == 16

# -- writing --------------------------------------------------------------------------------


def encode_open(stage: OpenStage) -> bytes:
    name = stage.name
    return (
        _U64.pack(stage.stage_id)
        + encode_text(name.sink)
        + _U64.pack(name.batch)
        + encode_text(name.task)
    )


def encode_add(head: StagedHead, message: Message) -> bytes:
    return _ADD_HEAD.pack(head.stage_id, head.index, head.expires) + encode_message(message)


def _published(stage: PublishedStage) -> bytes:
    parts = [_U64.pack(stage.stage_id), _U16.pack(len(stage.firsts))]
    parts.extend(encode_position(name, seq) for name, seq in stage.firsts)
    return b"".join(parts)


def _ids(ids: tuple[int, ...]) -> bytes:
    return _U32.pack(len(ids)) + b"".join(_U64.pack(i) for i in ids)


def encode_commit(record: CommitRecord) -> bytes:
    parts = [encode_text(record.sink), _U64.pack(record.batch), _U32.pack(len(record.published))]
    parts.extend(_published(stage) for stage in record.published)
    parts.append(_ids(record.discarded))
    return b"".join(parts)


def encode_discard(ids: tuple[int, ...]) -> bytes:
    return _ids(ids)


def encode_snapshot(snapshot: StageSnapshot) -> bytes:
    parts = [_U64.pack(snapshot.next_id), _U32.pack(len(snapshot.sinks))]
    parts.extend(encode_text(sink) + _U64.pack(batch) for sink, batch in snapshot.sinks)
    parts.append(_U32.pack(len(snapshot.open)))
    parts.extend(encode_open(stage) for stage in snapshot.open)
    parts.append(_U32.pack(len(snapshot.published)))
    for stage in snapshot.published:
        parts.append(_LSNS.pack(stage.commit_lsn, stage.last_lsn))
        parts.append(_published(stage))
    return b"".join(parts)


# -- reading --------------------------------------------------------------------------------


def _read_open(reader: Reader) -> OpenStage:
    stage_id = reader.u64()
    sink = reader.text()
    batch = reader.u64()
    return OpenStage(stage_id, StageName(sink, batch, reader.text()))


def _read_published(reader: Reader, commit_lsn: int = 0, last_lsn: int = 0) -> PublishedStage:
    stage_id = reader.u64()
    (count,) = reader.unpack(_U16)
    firsts = tuple((reader.destination(), reader.u64()) for _ in range(count))
    return PublishedStage(stage_id, firsts, commit_lsn, last_lsn)


def _read_ids(reader: Reader) -> tuple[int, ...]:
    return tuple(reader.u64() for _ in range(reader.u32()))


def decode_open(data: bytes) -> OpenStage:
    reader = Reader(data)
    stage = _read_open(reader)
    reader.done()
    return stage


def decode_add_head(data: bytes) -> StagedHead:
    """The stage id, index and expiry of a STAGE_ADD, without decoding its message."""
    stage_id, index, expires = _ADD_HEAD.unpack_from(data, 0)
    return StagedHead(stage_id, index, expires)


def decode_add(data: bytes) -> tuple[StagedHead, Message]:
    return decode_add_head(data), decode_message(data[_ADD_HEAD.size :])


def decode_commit(data: bytes) -> CommitRecord:
    reader = Reader(data)
    sink = reader.text()
    batch = reader.u64()
    published = tuple(_read_published(reader) for _ in range(reader.u32()))
    record = CommitRecord(sink, batch, published, _read_ids(reader))
    reader.done()
    return record


def decode_discard(data: bytes) -> tuple[int, ...]:
    reader = Reader(data)
    ids = _read_ids(reader)
    reader.done()
    return ids


def decode_snapshot(data: bytes) -> StageSnapshot:
    reader = Reader(data)
    next_id = reader.u64()
    sinks = tuple((reader.text(), reader.u64()) for _ in range(reader.u32()))
    open_stages = tuple(_read_open(reader) for _ in range(reader.u32()))
    published = []
    for _ in range(reader.u32()):
        commit_lsn, last_lsn = reader.unpack(_LSNS)
        published.append(_read_published(reader, commit_lsn, last_lsn))
    reader.done()
    return StageSnapshot(next_id, sinks, open_stages, tuple(published))
