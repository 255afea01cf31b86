"""The payloads of the journal records of topic cursors and queue leases (CURSOR, CURSOR_END,
LEASE, LEASE_MARK, LEASE_END, LEASE_SNAPSHOT): their codecs, and how recovery applies them.

The types are in persist.format's one table (RECORDS), the layouts byte by byte in
docs/persistence.md (Record format); the protocol is in docs/pipelines-protocol.md. Topic and
queue names are names without the prefix. Their lifetimes are persist.lease_extension's. Lease
ids are never reused (the snapshot carries the next one), so a mark always names the lease that
took the message last.

Acknowledging a lease writes its LEASE_END, then a REMOVE for each message. A message whose last
mark names an acknowledged lease is therefore consumed by recovery: an acknowledgement cut short
by a crash completes at the next start instead of leaving a lease half consumed.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Final, TypeVar

from sluiceway.core.values.leasing import (
    CursorRecord,
    GroupRecord,
    LeaseRecord,
    LeaseSnapshot,
    LeaseState,
    RecoveredLeases,
)
from sluiceway.core.values.message_codec import DecodeError, encode_text
from sluiceway.persist.format import Reader, RecordType

T = TypeVar("T")

_STATE_CODES: Final = {LeaseState.ACKNOWLEDGED: 1, LeaseState.EXPIRED: 2}
_CODE_STATES: Final = {code: state for state, code in _STATE_CODES.items()}

_U8: Final = struct.Struct("<B")
_U16: Final = struct.Struct("<H")
_U32: Final = struct.Struct("<I")
_U64: Final = struct.Struct("<Q")
_I64: Final = struct.Struct("<q")
_MARK: Final = struct.Struct("<QQQ")  # lease id, seq, add
_END: Final = struct.Struct("<QB")  # lease id, state
_FINISHED: Final = struct.Struct("<QQB")  # lease id, number, state
assert (_U8.size, _U16.size, _U32.size, _U64.size, _I64.size) == (1, 2, 4, 8, 8)
assert (_MARK.size, _END.size, _FINISHED.size) == (24, 9, 17)

# The record types recovery hands to replay_lease_record (LEASE_MARK is a mark, not state).
STATE_RECORDS: Final = frozenset(
    {
        RecordType.CURSOR,
        RecordType.CURSOR_END,
        RecordType.LEASE,
        RecordType.LEASE_END,
        RecordType.LEASE_SNAPSHOT,
    }
)


# -- writing --------------------------------------------------------------------------------


def encode_cursor(record: CursorRecord) -> bytes:
    return encode_text(record.topic) + encode_text(record.group) + _U64.pack(record.position)


def encode_cursor_end(topic: str, group: str) -> bytes:
    return encode_text(topic) + encode_text(group)


def encode_lease(record: LeaseRecord) -> bytes:
    return (
        _U64.pack(record.lease_id)
        + encode_text(record.queue)
        + encode_text(record.group)
        + _U64.pack(record.number)
        + _I64.pack(record.expires)
    )


def encode_lease_mark(lease_id: int, seq: int, add: int) -> bytes:
    return _MARK.pack(lease_id, seq, add)


def encode_lease_end(lease_id: int, state: LeaseState) -> bytes:
    return _END.pack(lease_id, _STATE_CODES[state])


def _group(record: GroupRecord) -> bytes:
    parts = [
        encode_text(record.queue),
        encode_text(record.group),
        _U64.pack(record.high),
        _U32.pack(len(record.finished)),
    ]
    for number, (lease_id, state) in record.finished.items():
        parts.append(_FINISHED.pack(lease_id, number, _STATE_CODES[state]))
    return b"".join(parts)


def _counted(payloads: list[bytes]) -> bytes:
    return _U32.pack(len(payloads)) + b"".join(_U32.pack(len(p)) + p for p in payloads)


def encode_lease_snapshot(snapshot: LeaseSnapshot) -> bytes:
    return (
        _U64.pack(snapshot.next_id)
        + _counted([encode_cursor(cursor) for cursor in snapshot.cursors])
        + _counted([_group(group) for group in snapshot.groups])
        + _counted([encode_lease(lease) for lease in snapshot.leases])
    )


# -- reading --------------------------------------------------------------------------------


def _state(code: int) -> LeaseState:
    state = _CODE_STATES.get(code)
    if state is None:
        raise DecodeError(f"unknown lease state {code}")
    return state


def _read_cursor(reader: Reader) -> CursorRecord:
    return CursorRecord(reader.text(), reader.text(), reader.u64())


def _read_lease(reader: Reader) -> LeaseRecord:
    lease_id = reader.u64()
    queue, group = reader.text(), reader.text()
    number = reader.u64()
    (expires,) = reader.unpack(_I64)
    return LeaseRecord(lease_id, queue, group, number, expires)


def _read_group(reader: Reader) -> GroupRecord:
    record = GroupRecord(reader.text(), reader.text(), reader.u64())
    for _ in range(reader.u32()):
        lease_id, number, code = reader.unpack(_FINISHED)
        record.finished[number] = (lease_id, _state(code))
    return record


def _whole(data: bytes, read: Callable[[Reader], T]) -> T:
    """Decode a payload that `read` must consume entirely."""
    reader = Reader(data)
    value = read(reader)
    reader.done()
    return value


def decode_cursor(data: bytes) -> CursorRecord:
    return _whole(data, _read_cursor)


def decode_cursor_end(data: bytes) -> tuple[str, str]:
    return _whole(data, lambda reader: (reader.text(), reader.text()))


def decode_lease(data: bytes) -> LeaseRecord:
    return _whole(data, _read_lease)


def decode_lease_mark(data: bytes) -> tuple[int, int, int]:
    reader = Reader(data)
    lease_id, seq, add = reader.unpack(_MARK)
    reader.done()
    return lease_id, seq, add


def decode_lease_end(data: bytes) -> tuple[int, LeaseState]:
    reader = Reader(data)
    lease_id, code = reader.unpack(_END)
    reader.done()
    return lease_id, _state(code)


def decode_lease_snapshot(data: bytes) -> LeaseSnapshot:
    reader = Reader(data)
    next_id = reader.u64()
    cursors = [decode_cursor(reader.blob()) for _ in range(reader.u32())]
    groups = [_whole(reader.blob(), _read_group) for _ in range(reader.u32())]
    leases = [decode_lease(reader.blob()) for _ in range(reader.u32())]
    reader.done()
    return LeaseSnapshot(next_id, cursors, groups, leases)


# -- recovery -------------------------------------------------------------------------------


# -- recovery -------------------------------------------------------------------------------


def replay_lease_record(recovered: RecoveredLeases, kind: RecordType, payload: bytes) -> None:
    """Apply one state record (a type in STATE_RECORDS) to `recovered`, in journal order."""
    if kind is RecordType.CURSOR:
        cursor = decode_cursor(payload)
        recovered.cursors[cursor.topic, cursor.group] = cursor.position
    elif kind is RecordType.CURSOR_END:
        recovered.cursors.pop(decode_cursor_end(payload), None)
    elif kind is RecordType.LEASE:
        recovered.opened(decode_lease(payload))
    elif kind is RecordType.LEASE_END:
        recovered.ended(*decode_lease_end(payload))
    elif kind is RecordType.LEASE_SNAPSHOT:
        recovered.restate(decode_lease_snapshot(payload))
