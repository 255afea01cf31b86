"""Packed reads: many messages in one MESSAGE frame, column by column (pipelines-protocol.md,
"Packed reads").

A range, cursor or lease read with `pack:N` gets its messages in frames of up to N each, so
neither side pays a frame's cost per message, and a reader that wants columns (the Spark source
builds Arrow arrays) takes them without parsing a message at a time. A pack's body, all integers
little-endian:

    b"SWP1", u32 count K, then 12 sections, each a u32 byte length and its bytes:
     0 body offsets     (K+1) x u32, from 0     1 bodies, one after the other
     2 id offsets       (K+1) x u32, from 0     3 message ids, UTF-8
     4 sequence numbers K x i64                 5 timestamps (ms since the epoch) K x i64
     6 expiry times     K x i64 (0: never)      7 priorities K x u8
     8 flags            K x u8: 1 persistent, 2 redelivered
     9 delivery counts  K x u32
    10 header offsets   (K+1) x u32, from 0    11 the producers' headers of each message,
                                                 `name:value` lines each ended by a newline,
                                                 escaped as STOMP 1.2 headers are

The destination, and the lease of a lease read, are the frame's own headers: the same for
every message of the pack.

A packed SEND (`pack-count:K`, "Packed sends") carries a pack the other way: the sender gives
the bodies, expiry times, priorities, the persistent flag and the headers; the broker sets the
rest, which the sender leaves zero (`send_pack`).
"""

from __future__ import annotations

import itertools
import struct
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from sluiceway.errors import RemoteProtocolError

MAGIC: Final = b"SWP1"
SECTIONS: Final = 12
PERSISTENT: Final = 1
REDELIVERED: Final = 2
# The most messages one pack may hold, whatever a reader asks for.
MAX_PACK: Final = 10_000
# A pack is closed once its bodies reach this many bytes (one message always fits), so a frame
# stays small enough to be written and read in one go.
PACK_BYTES: Final = 1 << 20

_LITTLE: Final = sys.byteorder == "little"
_U32: Final = struct.Struct("<I")
_ESCAPES: Final = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", ":": "\\c"}
_UNESCAPES: Final = {"\\": "\\", "n": "\n", "r": "\r", "c": ":"}


def little_endian(values: array[int]) -> bytes:
    """The bytes of `values`, little-endian whatever this machine is."""
    if not _LITTLE:
        values = array(values.typecode, values)
        values.byteswap()
    return values.tobytes()


def _escape(text: str) -> str:
    if "\\" in text or "\n" in text or "\r" in text or ":" in text:
        return "".join(_ESCAPES.get(c, c) for c in text)
    return text


class Packable(Protocol):
    """What a pack takes of a message (the core's Message has these attributes)."""

    @property
    def id(self) -> str: ...
    @property
    def body(self) -> bytes: ...
    @property
    def seq(self) -> int: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def expires(self) -> int: ...
    @property
    def priority(self) -> int: ...
    @property
    def persistent(self) -> bool: ...
    @property
    def delivery_count(self) -> int: ...
    @property
    def headers(self) -> Sequence[tuple[str, str]]: ...


def _offsets(parts: list[bytes]) -> bytes:
    offsets = array("I", [0])
    offsets.extend(itertools.accumulate(map(len, parts)))
    return little_endian(offsets)


def _own_lines(headers: Sequence[tuple[str, str]], left_out: frozenset[str]) -> bytes:
    return "".join(f"{_escape(k)}:{_escape(v)}\n" for k, v in headers if k not in left_out).encode()


def pack_messages(messages: Sequence[Packable], left_out: frozenset[str] = frozenset()) -> bytes:
    """The body of a pack of `messages`, their headers named in `left_out` left out. One pass
    per column over the messages: no step per message in Python but the list building."""
    bodies = [m.body for m in messages]
    ids = [m.id.encode() for m in messages]
    headers = [_own_lines(m.headers, left_out) if m.headers else b"" for m in messages]
    sections = (
        _offsets(bodies),
        b"".join(bodies),
        _offsets(ids),
        b"".join(ids),
        little_endian(array("q", [m.seq for m in messages])),
        little_endian(array("q", [m.timestamp for m in messages])),
        little_endian(array("q", [m.expires for m in messages])),
        bytes([m.priority for m in messages]),
        bytes(
            [
                (PERSISTENT if m.persistent else 0) | (REDELIVERED if m.delivery_count > 1 else 0)
                for m in messages
            ]
        ),
        little_endian(array("I", [m.delivery_count for m in messages])),
        _offsets(headers),
        b"".join(headers),
    )
    return _join(len(messages), sections)


def _join(count: int, sections: Sequence[bytes]) -> bytes:
    parts = [MAGIC, _U32.pack(count)]
    for section in sections:
        parts.append(_U32.pack(len(section)))
        parts.append(section)
    return b"".join(parts)


def offsets_of(parts: list[bytes]) -> bytes:
    """The (K+1) u32 offsets section of `parts` laid end to end."""
    return _offsets(parts)


def header_lines(headers: Sequence[tuple[str, str]]) -> bytes:
    """A message's own headers as a pack holds them (section 11)."""
    return _own_lines(headers, frozenset())


def send_pack(
    count: int,
    body_offsets: bytes,
    bodies: bytes,
    *,
    expires: bytes,
    priorities: bytes,
    flags: bytes,
    header_offsets: bytes,
    headers: bytes,
) -> bytes:
    """The body of a packed SEND: the columns a sender gives (each as its section's bytes),
    and zeros for those the broker sets (ids, sequence numbers, timestamps, delivery counts)."""
    sections = (
        body_offsets,
        bodies,
        bytes(4 * (count + 1)),
        b"",
        bytes(8 * count),
        bytes(8 * count),
        expires,
        priorities,
        flags,
        bytes(4 * count),
        header_offsets,
        headers,
    )
    return _join(count, sections)


@dataclass(frozen=True, slots=True)
class Record:
    """One message to pack, given field by field (PackWriter)."""

    id: str
    body: bytes
    seq: int
    timestamp: int
    expires: int
    priority: int
    persistent: bool
    delivery_count: int
    headers: Sequence[tuple[str, str]]


class PackWriter:
    """The messages of one pack, added one by one, then its body."""

    __slots__ = ("_records",)

    def __init__(self) -> None:
        self._records: list[Record] = []

    def __len__(self) -> int:
        return len(self._records)

    def add(
        self,
        message_id: str,
        body: bytes,
        *,
        sequence: int,
        timestamp: int,
        expires: int,
        priority: int,
        persistent: bool,
        delivery_count: int,
        headers: Sequence[tuple[str, str]],
    ) -> None:
        self._records.append(
            Record(
                message_id,
                body,
                sequence,
                timestamp,
                expires,
                priority,
                persistent,
                delivery_count,
                headers,
            )
        )

    def finish(self) -> bytes:
        """The pack's body."""
        return pack_messages(self._records)


def _numbers(typecode: str, data: memoryview, count: int, what: str) -> array[int]:
    values = array(typecode)
    if len(data) != count * values.itemsize:
        raise RemoteProtocolError(
            f"a pack's {what} take {len(data)} bytes, not {count * values.itemsize}"
        )
    values.frombytes(data)
    if not _LITTLE:
        values.byteswap()
    return values


@dataclass(frozen=True, slots=True)
class Pack:
    """A pack's columns, as read (`read_pack`); the bodies, ids and headers as their raw
    sections with offsets, so a columnar reader takes them as they are."""

    count: int
    body_offsets: array[int]
    bodies: memoryview
    id_offsets: array[int]
    ids: memoryview
    sequences: array[int]
    timestamps: array[int]
    expires: array[int]
    priorities: bytes
    flags: bytes
    delivery_counts: array[int]
    header_offsets: array[int]
    headers: memoryview
    raw: Sequence[memoryview]  # the 12 sections as they came

    def body(self, index: int) -> bytes:
        return bytes(self.bodies[self.body_offsets[index] : self.body_offsets[index + 1]])

    def message_id(self, index: int) -> str:
        return str(self.ids[self.id_offsets[index] : self.id_offsets[index + 1]], "utf-8")

    def own_headers(self, index: int) -> list[tuple[str, str]]:
        """The producer's headers of message `index`, in order."""
        start, end = self.header_offsets[index], self.header_offsets[index + 1]
        if start == end:
            return []
        lines = str(self.headers[start:end], "utf-8").split("\n")
        return [_header(line) for line in lines[:-1]]


def _header(line: str) -> tuple[str, str]:
    name, colon, value = line.partition(":")
    if not colon:
        raise RemoteProtocolError(f"a pack holds a header line without a colon: {line!r}")
    return _unescape(name), _unescape(value)


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out: list[str] = []
    chars = iter(text)
    for c in chars:
        if c == "\\":
            nxt = next(chars, "")
            if nxt not in _UNESCAPES:
                raise RemoteProtocolError(f"a pack holds an invalid escape \\{nxt} in {text!r}")
            out.append(_UNESCAPES[nxt])
        else:
            out.append(c)
    return "".join(out)


def read_pack(body: bytes) -> Pack:
    """The columns of a pack's body; RemoteProtocolError when it is not one."""
    data = memoryview(body)
    if bytes(data[:4]) != MAGIC or len(data) < 8:
        raise RemoteProtocolError("a packed MESSAGE does not start with a pack (SWP1)")
    count = _U32.unpack_from(data, 4)[0]
    position, sections = 8, []
    for _ in range(SECTIONS):
        if position + 4 > len(data):
            raise RemoteProtocolError("a pack ends before its last section")
        size = _U32.unpack_from(data, position)[0]
        position += 4
        if position + size > len(data):
            raise RemoteProtocolError("a pack's section runs past its end")
        sections.append(data[position : position + size])
        position += size
    offsets = [_numbers("I", sections[i], count + 1, "offsets") for i in (0, 2, 10)]
    for values, section in zip(offsets, (sections[1], sections[3], sections[11]), strict=True):
        # Offsets never go down (sorting what is sorted is one pass, in C).
        if values[0] != 0 or values[-1] != len(section) or values.tolist() != sorted(values):
            raise RemoteProtocolError("a pack's offsets do not match its data")
    for index in (7, 8):
        if len(sections[index]) != count:
            raise RemoteProtocolError(f"a pack's section {index} has the wrong length")
    return Pack(
        count=count,
        body_offsets=offsets[0],
        bodies=sections[1],
        id_offsets=offsets[1],
        ids=sections[3],
        sequences=_numbers("q", sections[4], count, "sequence numbers"),
        timestamps=_numbers("q", sections[5], count, "timestamps"),
        expires=_numbers("q", sections[6], count, "expiry times"),
        priorities=bytes(sections[7]),
        flags=bytes(sections[8]),
        delivery_counts=_numbers("I", sections[9], count, "delivery counts"),
        header_offsets=offsets[2],
        headers=sections[11],
        raw=sections,
    )
