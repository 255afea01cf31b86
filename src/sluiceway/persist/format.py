"""The journal's record format: every record type in one table, and the core records' payloads.

The journal (persist.journal, persist.segments) stores opaque (type, payload) records; this
module gives them meaning. `RECORDS` below is the one table of every record type, the broker's
own and its extensions' (topic cursors and queue leases, stages): each type's code, name,
payload layout, the module whose codec writes and reads it, and, for a state record, the
snapshot record that restates it at the start of every segment. docs/persistence.md (Record
format) lays every payload out byte by byte.

All integers are little-endian; strings are UTF-8 with a u16 length prefix, bodies a u32 length
prefix; a destination is its kind (u8: 0 queue, 1 topic) and name; a message is encoded as
core.values.message_codec says (the same bytes a spilled chunk holds). `add` is the LSN of the
record that holds a message (its ADD, or a published stage's STAGE_ADD).

A transaction's records follow its TX record without anything in between (the broker appends
them in one step), so a TX whose records do not all follow it was cut by a crash.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Final

from sluiceway.core.values.durable_record import DurableRecord
from sluiceway.core.values.message_codec import (
    DESTINATION_HEAD,
    DecodeError,
    decode_destination,
    decode_message,
    encode_destination,
    encode_text,
)
from sluiceway.naming import DestinationName


class RecordType(enum.IntEnum):
    """The type byte of every record (RECORDS says what each holds)."""

    ADD = 1
    REMOVE = 2
    DELIVERED = 3
    SEQ = 4
    TX = 5
    DURABLE = 6
    DURABLE_END = 7
    DURABLE_ACK = 8
    DURABLE_DELIVERED = 9
    SNAPSHOT = 11
    TX_CUT = 12
    DELIVERED_RUN = 13
    REMOVE_RUN = 14
    # Topic cursors and queue leases (persist.lease_extension).
    CURSOR = 20
    CURSOR_END = 21
    LEASE = 22
    LEASE_MARK = 23
    LEASE_END = 24
    LEASE_SNAPSHOT = 25
    # Stages, publishing a batch exactly once (persist.stage_extension).
    STAGE_OPEN = 30
    STAGE_ADD = 31
    STAGE_COMMIT = 32
    STAGE_DISCARD = 33
    STAGE_SNAPSHOT = 34


@dataclass(frozen=True, slots=True)
class RecordSpec:
    """One record type: what its payload holds, the module whose codec writes and reads it,
    and for a state record the snapshot record that restates it (it lives until then)."""

    type: RecordType
    payload: str
    codec: str
    restated_by: RecordType | None = None


_CORE: Final = "persist.format"
_LEASES: Final = "persist.lease_payloads"
_STAGES: Final = "persist.stage_payloads"
_S, _LS, _SS = RecordType.SNAPSHOT, RecordType.LEASE_SNAPSHOT, RecordType.STAGE_SNAPSHOT

# Every record type the journal holds, by type. Lifetimes not given here: an ADD lives while its
# message is in the broker; DELIVERED*, DURABLE_ACK, DURABLE_DELIVERED and LEASE_MARK are marks,
# live while their message is; a REMOVE lives while the segment of its ADD does; REMOVE_RUN, TX
# and TX_CUT only matter to recovery; a STAGE_ADD lives while its stage is open (then as the ADD
# of the message it published).
RECORDS: Final = {
    spec.type: spec
    for spec in (
        RecordSpec(RecordType.ADD, "a message, with its destination and seq", _CORE),
        RecordSpec(RecordType.REMOVE, "destination, seq u64, add u64: it left the broker", _CORE),
        RecordSpec(
            RecordType.DELIVERED, "destination, seq u64, add u64 (written by older versions)", _CORE
        ),
        RecordSpec(RecordType.SEQ, "destination, seq u64: spoken for up to seq", _CORE, _S),
        RecordSpec(RecordType.TX, "count u32: the next `count` records are one commit", _CORE),
        RecordSpec(
            RecordType.DURABLE,
            "sub id u32, topic, client id, subscription name, selector, start seq u64",
            _CORE,
            _S,
        ),
        RecordSpec(RecordType.DURABLE_END, "sub id u32", _CORE, _S),
        RecordSpec(RecordType.DURABLE_ACK, "sub id u32, seq u64, add u64", _CORE),
        RecordSpec(RecordType.DURABLE_DELIVERED, "sub id u32, seq u64, add u64", _CORE),
        RecordSpec(RecordType.SNAPSHOT, "counted SEQ, counted DURABLE payloads", _CORE, _S),
        RecordSpec(RecordType.TX_CUT, "tx u64: the transaction at LSN tx is void", _CORE),
        RecordSpec(RecordType.DELIVERED_RUN, "add u64, repeated: one delivery of each", _CORE),
        RecordSpec(RecordType.REMOVE_RUN, "add u64, repeated, all in the run's segment", _CORE),
        RecordSpec(RecordType.CURSOR, "topic, group, position u64", _LEASES, _LS),
        RecordSpec(RecordType.CURSOR_END, "topic, group", _LEASES, _LS),
        RecordSpec(
            RecordType.LEASE, "lease id u64, queue, group, number u64, expires i64", _LEASES, _LS
        ),
        RecordSpec(RecordType.LEASE_MARK, "lease id u64, seq u64, add u64", _LEASES),
        RecordSpec(RecordType.LEASE_END, "lease id u64, state u8", _LEASES, _LS),
        RecordSpec(
            RecordType.LEASE_SNAPSHOT,
            "next lease id u64, counted CURSORs, groups, LEASEs",
            _LEASES,
            _LS,
        ),
        RecordSpec(RecordType.STAGE_OPEN, "stage id u64, sink, batch u64, task", _STAGES, _SS),
        RecordSpec(
            RecordType.STAGE_ADD, "stage id u64, index u64, expires i64, a message", _STAGES
        ),
        RecordSpec(
            RecordType.STAGE_COMMIT,
            "sink, batch u64, counted published stages, counted discarded ids",
            _STAGES,
            _SS,
        ),
        RecordSpec(RecordType.STAGE_DISCARD, "counted stage ids u64", _STAGES, _SS),
        RecordSpec(
            RecordType.STAGE_SNAPSHOT,
            "next stage id u64, counted sinks, open stages, published stages",
            _STAGES,
            _SS,
        ),
    )
}
assert set(RECORDS) == set(RecordType), "every record type has its row in RECORDS"

# The snapshot record that restates each kind of state record at the start of every segment.
RESTATED_BY: Final = {
    kind: spec.restated_by for kind, spec in RECORDS.items() if spec.restated_by is not None
}


_U16: Final = struct.Struct("<H")
_U32: Final = struct.Struct("<I")
_U64: Final = struct.Struct("<Q")
_SEQ_ADD: Final = struct.Struct("<QQ")
_SUB_SEQ_ADD: Final = struct.Struct("<IQQ")

assert (_U16.size, _U32.size, _U64.size) == (2, 4, 8)
assert _SEQ_ADD.size == 16
assert _SUB_SEQ_ADD.size == 20


# -- writing --------------------------------------------------------------------------------


def encode_position(destination: DestinationName, seq: int) -> bytes:
    """The payload of SEQ records."""
    return encode_destination(destination.path) + _U64.pack(seq)


def encode_mark(destination: DestinationName, seq: int, add: int) -> bytes:
    """The payload of REMOVE and DELIVERED records: the message and its ADD's LSN."""
    return encode_destination(destination.path) + _SEQ_ADD.pack(seq, add)


def encode_sub_mark(sub_id: int, seq: int, add: int) -> bytes:
    """The payload of DURABLE_ACK and DURABLE_DELIVERED records."""
    return _SUB_SEQ_ADD.pack(sub_id, seq, add)


def encode_sub(sub_id: int) -> bytes:
    return _U32.pack(sub_id)


def encode_durable(record: DurableRecord) -> bytes:
    return (
        _U32.pack(record.sub_id)
        + encode_text(record.topic)
        + encode_text(record.client_id)
        + encode_text(record.name)
        + encode_text(record.selector)
        + _U64.pack(record.start_seq)
    )


def encode_tx(count: int) -> bytes:
    return _U32.pack(count)


def encode_lsn(lsn: int) -> bytes:
    return _U64.pack(lsn)


def encode_lsns(lsns: list[int]) -> bytes:
    """The payload of DELIVERED_RUN and REMOVE_RUN records."""
    return struct.pack(f"<{len(lsns)}Q", *lsns)


def decode_lsns(data: bytes) -> tuple[int, ...]:
    if len(data) % _U64.size:
        raise DecodeError(f"a list of LSNs is {len(data)} bytes, not a multiple of 8")
    return struct.unpack(f"<{len(data) // _U64.size}Q", data)


def decode_lsn(data: bytes) -> int:
    reader = Reader(data)
    lsn = reader.u64()
    reader.done()
    return lsn


def encode_snapshot(
    seqs: list[tuple[DestinationName, int]], durables: list[DurableRecord]
) -> bytes:
    parts = [_U32.pack(len(seqs))]
    for destination, seq in seqs:
        payload = encode_position(destination, seq)
        parts.append(_U32.pack(len(payload)) + payload)
    parts.append(_U32.pack(len(durables)))
    for durable in durables:
        payload = encode_durable(durable)
        parts.append(_U32.pack(len(payload)) + payload)
    return b"".join(parts)


# -- reading --------------------------------------------------------------------------------


class Reader:
    """Sequential decoding of one payload; raises DecodeError on a short or bad payload."""

    __slots__ = ("_data", "_pos")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def take(self, size: int) -> bytes:
        end = self._pos + size
        if end > len(self._data):
            raise DecodeError(f"payload ends at {len(self._data)} bytes, needed {end}")
        chunk = self._data[self._pos : end]
        self._pos = end
        return chunk

    def unpack(self, fmt: struct.Struct) -> tuple[int, ...]:
        return fmt.unpack(self.take(fmt.size))

    def u32(self) -> int:
        return self.unpack(_U32)[0]

    def u64(self) -> int:
        return self.unpack(_U64)[0]

    def text(self) -> str:
        (length,) = self.unpack(_U16)
        return self.take(length).decode()

    def blob(self) -> bytes:
        return self.take(self.u32())

    def destination(self) -> DestinationName:
        if self._pos + DESTINATION_HEAD > len(self._data):
            self.take(DESTINATION_HEAD)  # (raises: the payload is too short)
        (length,) = _U16.unpack_from(self._data, self._pos + 1)
        return decode_destination(self.take(DESTINATION_HEAD + length))

    def done(self) -> None:
        if self._pos != len(self._data):
            raise DecodeError(f"{len(self._data) - self._pos} bytes left over in a payload")


def decode_position(data: bytes) -> tuple[DestinationName, int]:
    reader = Reader(data)
    destination = reader.destination()
    seq = reader.u64()
    reader.done()
    return destination, seq


def decode_mark(data: bytes) -> tuple[DestinationName, int, int]:
    reader = Reader(data)
    destination = reader.destination()
    seq, add = reader.unpack(_SEQ_ADD)
    reader.done()
    return destination, seq, add


def decode_sub_mark(data: bytes) -> tuple[int, int, int]:
    reader = Reader(data)
    sub_id, seq, add = reader.unpack(_SUB_SEQ_ADD)
    reader.done()
    return sub_id, seq, add


def decode_sub(data: bytes) -> int:
    reader = Reader(data)
    sub_id = reader.u32()
    reader.done()
    return sub_id


def decode_durable(data: bytes) -> DurableRecord:
    reader = Reader(data)
    record = DurableRecord(
        sub_id=reader.u32(),
        topic=reader.text(),
        client_id=reader.text(),
        name=reader.text(),
        selector=reader.text(),
        start_seq=reader.u64(),
    )
    reader.done()
    return record


def decode_tx(data: bytes) -> int:
    reader = Reader(data)
    count = reader.u32()
    reader.done()
    return count


def decode_snapshot(data: bytes) -> tuple[list[tuple[DestinationName, int]], list[DurableRecord]]:
    reader = Reader(data)
    seqs = [decode_position(reader.blob()) for _ in range(reader.u32())]
    durables = [decode_durable(reader.blob()) for _ in range(reader.u32())]
    reader.done()
    return seqs, durables


# -- reporting damage -------------------------------------------------------------------------

_LOST: Final = {
    RecordType.ADD: "a persistent message: lost",
    RecordType.REMOVE: "the consumption of a message: it may be delivered again",
    RecordType.REMOVE_RUN: "the consumption of messages: they may be delivered again",
    RecordType.DELIVERED: "a delivery: the message may come back without redelivered:true",
    RecordType.DELIVERED_RUN: "deliveries: the messages may come back without redelivered:true",
    RecordType.DURABLE_ACK: "a durable subscription's acknowledgement: it may be delivered again",
    RecordType.TX: "the start of a transaction: it is void",
    RecordType.STAGE_ADD: "a staged message: lost from its stage",
    RecordType.STAGE_COMMIT: "a stage COMMIT: its stages are back to open",
}


def describe_damaged(kind: int, payload: bytes) -> str:
    """What a damaged record held, for recovery's report: its meaning by type, and for a message
    what its bytes still say (they are damaged, so that part is a guess)."""
    try:
        record_type = RecordType(kind)
    except ValueError:
        return f"a record of unknown type {kind}"
    meaning = _LOST.get(record_type, "broker state, restated at the start of every segment")
    if record_type is RecordType.ADD:
        try:
            message = decode_message(payload)
        except (ValueError, struct.error):
            meaning += " (its bytes are too damaged to tell which)"
        else:
            meaning += (
                f" (its damaged bytes read: id {message.id!r} to {message.destination.path}, "
                f"{len(message.body)} body bytes)"
            )
    return f"{record_type.name}, {meaning}"
