"""The encoding of a message as bytes, shared by the journal's ADD records and spilled chunks.

A message is kept in this one form wherever it leaves memory: an ADD record's payload
(persist.format) and an entry of a chunk written to the swap area (core.containers.pending).
Recovery relies on that: a message bound for the swap area is packed into its chunk as its
record holds it, never decoded and encoded again. Nothing here touches a file: bytes in,
Message out, and back.

All integers are little-endian; strings are UTF-8 with a u16 length prefix, the body a u32
length prefix. A destination is its kind (u8: 0 queue, 1 topic) and name. A message is: its
destination, seq u64, id, priority u8, persistent u8, expires i64, timestamp i64, delivery
count u32, header count u16 and (name, value) pairs, body.
"""

from __future__ import annotations

import struct
from functools import lru_cache
from typing import Final

from sluiceway.core.values.message import MAX_EXPIRES, Message
from sluiceway.errors import BadRequest, SluicewayError
from sluiceway.naming import DestinationKind, DestinationName, parse_destination

_U8: Final = struct.Struct("<B")
_U16: Final = struct.Struct("<H")
_U32: Final = struct.Struct("<I")
_U64: Final = struct.Struct("<Q")
MAX_TEXT: Final = 0xFFFF  # bytes of one string: its length is a u16
_MESSAGE_FIXED: Final = struct.Struct("<BBqqIH")  # priority, persistent, expires, timestamp,
# delivery count, header count

assert (_U8.size, _U16.size, _U32.size, _U64.size) == (1, 2, 4, 8)
assert _MESSAGE_FIXED.size == 1 + 1 + 8 + 8 + 4 + 2

DESTINATION_HEAD: Final = 3  # a destination's kind u8 and the u16 length of its name
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


class DecodeError(SluicewayError, ValueError):
    """Bytes that do not decode into what they should hold: the checksum of the record or chunk
    that held them passed, so this is a bug (or damage no checksum caught)."""


# -- writing --------------------------------------------------------------------------------


def encode_text(value: str) -> bytes:
    data = value.encode()
    return _U16.pack(len(data)) + data


@lru_cache(maxsize=4096)  # a few names carry most records: each encoded once
def encode_destination(path: str) -> bytes:
    """The encoded form of a destination, from its wire form. Keyed by the path: a string keeps
    its hash, where DestinationName's __hash__ is Python code run at every call."""
    name = parse_destination(path)
    return _U8.pack(_KIND_CODES[name.kind]) + encode_text(name.name)


def encode_message(message: Message) -> bytes:
    """A message with its identity (destination, seq) and everything needed to deliver it;
    Unstorable when a field does not fit the format."""
    try:
        parts = [
            encode_destination(message.destination.path),
            _U64.pack(message.seq),
            encode_text(message.id),
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
            parts.append(encode_text(name))
            parts.append(encode_text(value))
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


# -- reading --------------------------------------------------------------------------------


@lru_cache(maxsize=4096)  # a few names carry most records: each decoded once, then shared
def decode_destination(encoded: bytes) -> DestinationName:
    """A destination from its encoded form (kind u8, then its name as text)."""
    code = encoded[0]
    if code >= len(_KINDS):
        raise DecodeError(f"unknown destination kind {code}")
    return DestinationName(_KINDS[code], encoded[DESTINATION_HEAD:].decode())


def decode_message(data: bytes) -> Message:
    """A message from its encoding (DecodeError if its lengths do not add up)."""
    return peek_message(data).decode()


class EncodedMessage:
    """A message in its encoding (an ADD record's payload, an entry of a spilled chunk), with
    the fields that say where it goes, read without decoding the rest: recovery files a message
    bound for the swap area as these bytes (persist.restoring), since a spilled chunk holds
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
    its other fields are. Its lengths are checked to add up to the payload's (DecodeError if
    not); its text is not decoded."""
    try:
        at = DESTINATION_HEAD + _u16_at(data, 1)
        seq: int
        id_length: int
        seq, id_length = _unpack_seq_id(data, at)
        message = EncodedMessage(data, decode_destination(data[:at]), seq)
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
        raise DecodeError(f"a message of {len(data)} bytes is cut short") from None
    if at + _U32_SIZE + message.size != len(data):
        raise DecodeError(f"a message's lengths do not add up to its {len(data)} bytes")
    return message


# Little-endian integers read byte by byte: a compiled index is a C array access, where
# struct's unpack_from is a method call and a tuple per field (peek_message reads several).
def _u16_at(data: bytes, at: int) -> int:
    return data[at] | data[at + 1] << 8


def _u32_at(data: bytes, at: int) -> int:
    return data[at] | data[at + 1] << 8 | data[at + 2] << 16 | data[at + 3] << 24
