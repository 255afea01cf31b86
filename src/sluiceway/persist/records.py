"""The payloads of the broker's journal records, and of spilled messages.

The journal (store/journal.py) stores opaque (type, payload) records; this module gives them
meaning. All integers are little-endian; strings are UTF-8 with a u16 length prefix, bodies a
u32 length prefix.

| type | record | payload |
|---|---|---|
| 1 | ADD | a message (below), with its destination and seq |
| 2 | REMOVE | destination, seq u64, add u64: the message added at LSN `add` left the broker |
| 3 | DELIVERED | destination, seq u64, add u64: it was written to a queue consumer |
| 4 | SEQ | destination, seq u64: sequence numbers up to seq are spoken for |
| 5 | TX | count u32: the next `count` records are one committed transaction |
| 6 | DURABLE | sub id u32, topic name, client id, subscription name, selector, start seq u64 |
| 7 | DURABLE_END | sub id u32 |
| 8 | DURABLE_ACK | sub id u32, seq u64, add u64: durable subscription sub acknowledged it |
| 9 | DURABLE_DELIVERED | sub id u32, seq u64, add u64: it was written to that subscription |
| 11 | SNAPSHOT | count u32 of SEQ payloads, count u32 of DURABLE payloads: the state as of here |
| 12 | TX_CUT | tx u64: the transaction at LSN tx was cut by a crash; its records are void |
| 13 | DELIVERED_RUN | add u64, repeated: DELIVERED for each (the deliveries of one write) |
| 14 | REMOVE_RUN | add u64, repeated: REMOVE for each; all in the segment of the run |

A transaction's records follow its TX record without anything in between (the broker appends
them in one step), so a TX whose records do not all follow it was cut by a crash.

A destination is its kind (u8: 0 queue, 1 topic) and name. A message is: id, priority u8,
persistent u8, expires i64, timestamp i64, delivery count u32, header count u16 and
(name, value) pairs, body.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

from sluiceway.core.values.message import MAX_EXPIRES, Message
from sluiceway.errors import BadRequest
from sluiceway.naming import DestinationKind, DestinationName, parse_destination


class RecordType(enum.IntEnum):
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
    # Topic cursors and queue leases (their payloads are in core.lease_records).
    CURSOR = 20
    CURSOR_END = 21
    LEASE = 22
    LEASE_MARK = 23
    LEASE_END = 24
    LEASE_SNAPSHOT = 25
    # Stages, publishing a batch exactly once (their payloads are in core.stage_records).
    STAGE_OPEN = 30
    STAGE_ADD = 31
    STAGE_COMMIT = 32
    STAGE_DISCARD = 33
    STAGE_SNAPSHOT = 34


_U8: Final = struct.Struct("<B")
_U16: Final = struct.Struct("<H")
_U32: Final = struct.Struct("<I")
_U64: Final = struct.Struct("<Q")
_SEQ_ADD: Final = struct.Struct("<QQ")
_SUB_SEQ_ADD: Final = struct.Struct("<IQQ")
MAX_TEXT: Final = 0xFFFF  # bytes of one string: its length is a u16
_MESSAGE_FIXED: Final = struct.Struct("<BBqqIH")  # priority, persistent, expires, timestamp,
# delivery count, header count

assert (_U8.size, _U16.size, _U32.size, _U64.size) == (1, 2, 4, 8)
assert _SEQ_ADD.size == 16
assert _SUB_SEQ_ADD.size == 20
assert _MESSAGE_FIXED.size == 1 + 1 + 8 + 8 + 4 + 2

_DESTINATION_HEAD: Final = 3  # a destination's kind u8 and the u16 length of its name
_SEQ_ID: Final = struct.Struct("<QH")  # a message's seq, then the length of its id
_COUNT_AT: Final = 18  # where the delivery count u32 is in _MESSAGE_FIXED
# Read for every message recovered (peek_message): Final ints and bound methods are C statics
# when compiled, where a struct's `size` or `unpack_from` is an attribute lookup.
_U16_SIZE: Final = 2
_U32_SIZE: Final = 4
_SEQ_ID_SIZE: Final = 10
_FIXED_SIZE: Final = 24  # its header count, a u16, comes last
assert (_U16.size, _U32.size, _SEQ_ID.size, _MESSAGE_FIXED.size) == (2, 4, 10, 24)
assert struct.calcsize("<BBqq") == _COUNT_AT
_unpack_seq_id: Final = _SEQ_ID.unpack_from
_unpack_fixed: Final = _MESSAGE_FIXED.unpack_from

_KINDS: Final = (DestinationKind.QUEUE, DestinationKind.TOPIC)
_KIND_CODES: Final = {DestinationKind.QUEUE: 0, DestinationKind.TOPIC: 1}


class RecordError(ValueError):
    """A payload that does not decode: the journal's checksum passed, so this is a bug."""


# -- writing --------------------------------------------------------------------------------


def _text(value: str) -> bytes:
    data = value.encode()
    return _U16.pack(len(data)) + data


@lru_cache(maxsize=4096)  # a few names carry most records: each encoded once
def _destination(path: str) -> bytes:
    """The record form of a destination, from its wire form. Keyed by the path: a string keeps
    its hash, where DestinationName's __hash__ is Python code run at every call."""
    name = parse_destination(path)
    return _U8.pack(_KIND_CODES[name.kind]) + _text(name.name)


def encode_message(message: Message) -> bytes:
    """A message with its identity (destination, seq) and everything needed to deliver it;
    Unstorable when a field does not fit the format."""
    try:
        parts = [
            _destination(message.destination.path),
            _U64.pack(message.seq),
            _text(message.id),
            _MESSAGE_FIXED.pack(
                message.priority,
                int(message.persistent),
                message.expires,
                message.timestamp,
                message.delivery_count,
                len(message.headers),
            ),
        ]
        for name, value in message.headers:
            parts.append(_text(name))
            parts.append(_text(value))
        parts.append(_U32.pack(len(message.body)))
    except struct.error:
        raise _unstorable(message) from None
    parts.append(message.body)
    return b"".join(parts)


class Unstorable(BadRequest):
    """A message with a field the record format cannot hold: refused before any of it is kept
    (the SEND or the COMMIT that carries it)."""


def _unstorable(message: Message) -> Unstorable:
    """Which field of `message` does not fit its record, and what would."""
    where = f"a message for {message.destination}"
    numbers = (  # the ranges of _MESSAGE_FIXED and _U64 (the header layer narrows some)
        ("priority", message.priority, 0, 255),
        ("expires", message.expires, -MAX_EXPIRES - 1, MAX_EXPIRES),
        ("timestamp", message.timestamp, -MAX_EXPIRES - 1, MAX_EXPIRES),
        ("delivery count", message.delivery_count, 0, 2**32 - 1),
        ("sequence", message.seq, 0, 2**64 - 1),
        ("header count", len(message.headers), 0, MAX_TEXT),
        ("body size", len(message.body), 0, 2**32 - 1),
    )
    for field, number, low, high in numbers:
        if not low <= number <= high:
            return Unstorable(
                f"{field} out of range",
                f"the {field} of {where} is {number}; the journal keeps it as a number from "
                f"{low} to {high}",
            )
    texts = [("message id", "message id", message.id)]
    for header, value in message.headers:
        shown = repr(header[:40])
        texts += (
            ("header", f"name of header {shown}", header),
            ("header", f"header {shown}", value),
        )
    for kind, field, text in texts:
        size = len(text.encode())
        if size > MAX_TEXT:
            return Unstorable(
                f"{kind} too long",
                f"the {field} of {where} is {size} bytes; the journal keeps at most {MAX_TEXT} "
                "bytes in one header name or value: send less in it (a body has no such limit)",
            )
    return Unstorable("message cannot be stored", f"{where} does not fit a journal record")


def encode_position(destination: DestinationName, seq: int) -> bytes:
    """The payload of SEQ records."""
    return _destination(destination.path) + _U64.pack(seq)


def encode_mark(destination: DestinationName, seq: int, add: int) -> bytes:
    """The payload of REMOVE and DELIVERED records: the message and its ADD's LSN."""
    return _destination(destination.path) + _SEQ_ADD.pack(seq, add)


def encode_sub_mark(sub_id: int, seq: int, add: int) -> bytes:
    """The payload of DURABLE_ACK and DURABLE_DELIVERED records."""
    return _SUB_SEQ_ADD.pack(sub_id, seq, add)


def encode_sub(sub_id: int) -> bytes:
    return _U32.pack(sub_id)


@dataclass(frozen=True, slots=True)
class DurableRecord:
    """A durable subscription's definition (DURABLE records, and snapshots)."""

    sub_id: int
    topic: str
    client_id: str
    name: str
    selector: str
    start_seq: int


def encode_durable(record: DurableRecord) -> bytes:
    return (
        _U32.pack(record.sub_id)
        + _text(record.topic)
        + _text(record.client_id)
        + _text(record.name)
        + _text(record.selector)
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
        raise RecordError(f"a list of LSNs is {len(data)} bytes, not a multiple of 8")
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
    """Sequential decoding of one payload; raises RecordError on a short or bad payload."""

    __slots__ = ("_data", "_pos")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def take(self, size: int) -> bytes:
        end = self._pos + size
        if end > len(self._data):
            raise RecordError(f"payload ends at {len(self._data)} bytes, needed {end}")
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
        if self._pos + _DESTINATION_HEAD > len(self._data):
            self.take(_DESTINATION_HEAD)  # (raises: the payload is too short)
        (length,) = _U16.unpack_from(self._data, self._pos + 1)
        return _named(self.take(_DESTINATION_HEAD + length))

    def done(self) -> None:
        if self._pos != len(self._data):
            raise RecordError(f"{len(self._data) - self._pos} bytes left over in a payload")


@lru_cache(maxsize=4096)  # a few names carry most records: each decoded once, then shared
def _named(encoded: bytes) -> DestinationName:
    """A destination from its record form (kind u8, then its name as text)."""
    code = encoded[0]
    if code >= len(_KINDS):
        raise RecordError(f"unknown destination kind {code}")
    return DestinationName(_KINDS[code], encoded[_DESTINATION_HEAD:].decode())


def decode_message(data: bytes) -> Message:
    """A message from its encoding (RecordError if its lengths do not add up)."""
    return peek_message(data).decode()


class EncodedMessage:
    """A message in its encoding (an ADD record's payload, an entry of a spilled chunk), with
    the fields that say where it goes, read without decoding the rest: recovery files a message
    bound for the swap area as these bytes (core.restoring), since a spilled chunk holds
    messages in this same form; `decode` makes the Message."""

    __slots__ = (
        "count_at",
        "delivery_count",
        "destination",
        "id_at",
        "location",
        "marks",
        "payload",
        "priority",
        "seq",
        "size",
    )

    def __init__(self, payload: bytes, destination: DestinationName, seq: int) -> None:
        self.payload = payload
        self.destination = destination
        self.seq = seq
        self.priority = 0
        self.size = 0  # body bytes
        self.id_at = 0  # where in the payload its id starts; the fixed fields follow it
        self.count_at = 0  # where its delivery count is
        # The delivery count the payload holds; recovery sets the one it found instead, with
        # the ADD's LSN and marks, as for a decoded message.
        self.delivery_count = 0
        self.location = 0
        self.marks: list[int] | None = None

    def decode(self) -> Message:
        data, fixed_at = self.payload, self.count_at - _COUNT_AT
        _, persistent, expires, timestamp, _, header_count = _unpack_fixed(data, fixed_at)
        headers: list[tuple[str, str]] = []
        at = fixed_at + _FIXED_SIZE
        for _ in range(header_count):
            name_end = at + _U16_SIZE + _u16_at(data, at)
            value_end = name_end + _U16_SIZE + _u16_at(data, name_end)
            name = data[at + _U16_SIZE : name_end].decode()
            headers.append((name, data[name_end + _U16_SIZE : value_end].decode()))
            at = value_end
        return Message(
            id=data[self.id_at : fixed_at].decode(),
            destination=self.destination,
            body=data[len(data) - self.size :],
            headers=tuple(headers),
            priority=self.priority,
            expires=expires,
            persistent=bool(persistent),
            timestamp=timestamp,
            seq=self.seq,
            delivery_count=self.delivery_count,
            location=self.location,
            marks=self.marks,
        )

    def encoded(self) -> bytes:
        """The message as encode_message writes it: the payload, with the delivery count set
        (an ADD's payload holds the count the message had when it was added)."""
        payload, at = self.payload, self.count_at
        if _u32_at(payload, at) == self.delivery_count:
            return payload
        return payload[:at] + _U32.pack(self.delivery_count) + payload[at + _U32_SIZE :]


def peek_message(data: bytes) -> EncodedMessage:
    """An encoded message's destination, seq, priority, delivery count and body size, and where
    its other fields are. Its lengths are checked to add up to the payload's (RecordError if
    not); its text is not decoded."""
    try:
        at = _DESTINATION_HEAD + _u16_at(data, 1)
        seq: int
        id_length: int
        seq, id_length = _unpack_seq_id(data, at)
        message = EncodedMessage(data, _named(data[:at]), seq)
        message.id_at = at + _SEQ_ID_SIZE
        at = message.id_at + id_length
        message.priority = data[at]
        message.count_at = at + _COUNT_AT
        message.delivery_count = _u32_at(data, message.count_at)
        headers = _u16_at(data, at + _FIXED_SIZE - _U16_SIZE)
        at += _FIXED_SIZE
        for _ in range(2 * headers):  # each header's name and value
            at += _U16_SIZE + _u16_at(data, at)
        message.size = _u32_at(data, at)
    except (struct.error, IndexError):
        raise RecordError(f"a message of {len(data)} bytes is cut short") from None
    if at + _U32_SIZE + message.size != len(data):
        raise RecordError(f"a message's lengths do not add up to its {len(data)} bytes")
    return message


# Little-endian integers read byte by byte: a compiled index is a C array access, where
# struct's unpack_from is a method call and a tuple per field (peek_message reads several).
def _u16_at(data: bytes, at: int) -> int:
    return data[at] | data[at + 1] << 8


def _u32_at(data: bytes, at: int) -> int:
    return data[at] | data[at + 1] << 8 | data[at + 2] << 16 | data[at + 3] << 24


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
