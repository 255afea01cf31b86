"""Segment files: the journal's on-disk format, and reading one back record by record.

On-disk format (integers little-endian)
---------------------------------------
A directory of segment files named by their base LSN, zero-padded to 20 digits, suffix `.log`
(`00000000000000000001.log`). A segment holds the records with LSNs from its base up to, not
including, the next segment's base. Segment header, 16 bytes, `<4sIQ`::

    0   4s   magic b"SWJ1"
    4   u32  format version: 1
    8   u64  base LSN (the number in the file name)

A compacted segment (see `Journal.rewrite_segment` in persist/journal.py) has format version 2
and a 24-byte header, `<4sIQQ`: the same fields, then the u64 end LSN (the next segment's base
when it was compacted).
Its records keep their LSNs, so there may be gaps between them; all lie in [base, end).

Record: a 17-byte header `<IIQB`, then the payload::

    0   u32  payload length, bytes
    4   u32  CRC-32 (zlib.crc32) of header bytes 8..17 then the payload (LSN, type, payload)
    8   u64  LSN
    16  u8   record type (opaque to the journal)

Also in the directory: `discarded/<segment name>.<offset>.bytes` (or `.<offset>.<n>.bytes` when
that name holds other bytes) keeps what recovery cut or skipped; `<segment name>.compact` is a
compaction interrupted by a crash (the segment itself is intact), removed by recovery.

`SegmentFile` reads one segment through pread with a read-ahead buffer and validates each record
as it goes (length, LSN, CRC); where a record is invalid it finds the next valid one, and tells a
write a crash cut short from a record damaged on disk (`SegmentFile.complete`).
"""

from __future__ import annotations

import os
import re
import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from sluiceway.core.model.store import StoreError, StoreWriteError
from sluiceway.persist.files import Data, Files

MAGIC: Final = b"SWJ1"
VERSION: Final = 1
COMPACTED_VERSION: Final = 2

HEADER: Final = struct.Struct("<4sIQ")
COMPACTED_HEADER: Final = struct.Struct("<4sIQQ")
RECORD: Final = struct.Struct("<IIQB")
LEN_CRC: Final = struct.Struct("<II")  # the record header's first 8 bytes
LSN_TYPE: Final = struct.Struct("<QB")  # its last 9, which the CRC covers
# The most buffers one vectored write takes (Linux: 1024).
IOV_MAX: Final = os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 16
U64: Final = struct.Struct("<Q")
assert (HEADER.size, COMPACTED_HEADER.size, RECORD.size, U64.size) == (16, 24, 17, 8)
assert LEN_CRC.size + LSN_TYPE.size == RECORD.size
SEGMENT_HEADER_SIZE: Final = HEADER.size  # bytes of a (not compacted) segment's header
# Read for every record recovered: a Final int is a C constant when compiled, where a struct's
# `size` is an attribute lookup.
RECORD_SIZE: Final = 17
CRC_FROM: Final = 8  # the record header's bytes from here on are under its CRC
assert (RECORD.size, LEN_CRC.size) == (RECORD_SIZE, CRC_FROM)
LEN_SIZE: Final = 4  # the record header's length field; its CRC follows
crc32: Final = zlib.crc32

NAME: Final = re.compile(r"[0-9]{20}\.log")
TEMP_SUFFIX: Final = ".compact"
CHUNK: Final = 1 << 20  # bytes per read while recovering, and per write while compacting
NONZERO: Final = re.compile(rb"[^\x00]")
PAGE: Final = 4096  # bytes: the unit in which a file's data reaches the disk


# Position and Record are not frozen, and write their __init__ out: recovery makes one of each
# per record, and a frozen dataclass's generated __init__ runs as interpreted Python in the
# compiled build (about 5,000 instructions each, against 200 written out). Nothing changes one
# once made.
@dataclass(slots=True, init=False)
class Position:
    lsn: int
    segment: int  # base LSN of the segment file holding the record
    offset: int  # byte offset of the record header in that file

    def __init__(self, lsn: int, segment: int, offset: int) -> None:
        self.lsn = lsn
        self.segment = segment
        self.offset = offset


@dataclass(slots=True, init=False)
class Record:
    position: Position
    type: int
    payload: bytes

    def __init__(self, position: Position, type: int, payload: bytes) -> None:
        self.position = position
        self.type = type
        self.payload = payload


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    base_lsn: int
    path: Path
    size: int  # bytes; for the active segment, buffered records included
    active: bool  # the segment appends go to


@dataclass(frozen=True, slots=True)
class DamagedRecord:
    """A record whose bytes are all on disk but fail their checksum: damaged after it was
    written (a write cut short by a crash leaves a record incomplete instead). It may have been
    confirmed to a client. Its header and payload are as read, so any decoding is a guess."""

    segment: Path
    offset: int
    lsn: int
    type: int
    payload: bytes


@dataclass
class RecoveryReport:
    """What `Journal.recover()` found and did."""

    segments: int = 0  # segment files read
    records: int = 0  # valid records yielded
    torn_bytes: int = 0  # bytes of records cut short by a crash, cut from the end of the journal
    # (segment, offset, length) of each such cut
    torn: list[tuple[Path, int, int]] = field(default_factory=list)
    saved: list[Path] = field(default_factory=list)  # where cut or skipped bytes were saved
    # (segment, offset, length) of corrupt regions skipped under skip_corrupt
    skipped: list[tuple[Path, int, int]] = field(default_factory=list)
    # Complete records that fail their checksum, skipped under skip_corrupt (each also in skipped)
    damaged: list[DamagedRecord] = field(default_factory=list)
    # (segment, bytes) of a last segment that ended inside its header: a crash while it was
    # created, before it held any record (it is removed)
    headers_cut: list[tuple[Path, int]] = field(default_factory=list)
    # (last LSN before, first LSN after) where LSNs jump past skipped damage or a missing segment
    lsn_gaps: list[tuple[int, int]] = field(default_factory=list)


class JournalError(StoreError):
    """The journal cannot do what was asked; the message says why and what to do."""


class JournalWriteError(JournalError, StoreWriteError):
    """A write failed and its records wait in memory (`Journal.write_error`): what was asked
    needs them on disk first. Free space, then `retry_write`."""


class CorruptJournal(JournalError):
    """A segment holds damage that is not a torn tail, at `offset` in the file `segment`."""

    def __init__(
        self,
        segment: Path,
        offset: int,
        problem: str,
        *,
        skippable: bool = True,
        damaged: DamagedRecord | None = None,
    ):
        hint = (
            "to recover the records after it, open the journal with skip_corrupt (the damaged"
            " bytes are saved in discarded/ first)"
            if skippable
            else "this cannot be skipped: move the segment out of the journal directory"
        )
        super().__init__(
            f"journal segment {segment} is corrupt at offset {offset}: {problem}; {hint}"
        )
        self.segment = segment
        self.offset = offset
        self.skippable = skippable
        self.damaged = damaged  # the complete record that fails its checksum, if that is it


@dataclass(slots=True)
class SegmentEntry:
    base: int
    path: Path
    size: int  # bytes on disk (for the active segment, see Journal._end)
    end: int | None = None  # compacted segments: the end of their LSN range


@dataclass(frozen=True, slots=True)
class Damage:
    offset: int  # of the first invalid byte
    length: int
    resume: int | None  # offset of the next valid record; None when no valid record follows


def open_file(files: Files, path: Path, flags: int) -> int:
    try:
        return files.open(path, flags)
    except OSError as error:
        raise JournalError(f"cannot open {path}: {error}") from error


def remove_file(files: Files, path: Path) -> None:
    try:
        files.remove(path)
    except OSError as error:
        raise JournalError(f"cannot delete {path}: {error}") from error


def write_all(files: Files, fd: int, data: bytes) -> None:
    written = files.write(fd, data)
    while written < len(data):  # a short write: the rest, without copying it
        written += files.write(fd, memoryview(data)[written:])


def write_all_parts(files: Files, fd: int, parts: Sequence[bytes]) -> None:
    """Write `parts` one after the other with vectored writes (no copy into one buffer),
    IOV_MAX at a time, resuming after a short write where it stopped."""
    pending: list[Data] = list(parts)
    start = 0
    while start < len(pending):
        written = files.writev(fd, pending[start : start + IOV_MAX])
        while start < len(pending) and written >= len(pending[start]):
            written -= len(pending[start])
            start += 1
        if written:
            pending[start] = memoryview(pending[start])[written:]


def pread(files: Files, fd: int, size: int, offset: int) -> bytes:
    """`size` bytes at `offset`, fewer only at the end of the file."""
    parts: list[bytes] = []
    while size > 0 and (part := files.pread(fd, size, offset)):
        parts.append(part)
        size, offset = size - len(part), offset + len(part)
    return b"".join(parts)


# A record header's integers (little-endian) read byte by byte: a compiled index is a C array
# access, where struct's unpack_from is a method call and a tuple per header.
def u32_at(data: bytes, at: int) -> int:
    return data[at] | data[at + 1] << 8 | data[at + 2] << 16 | data[at + 3] << 24


def u64_at(data: bytes, at: int) -> int:
    return u32_at(data, at) | u32_at(data, at + 4) << 32


_SAMPLE: Final = RECORD.pack(0xFFFEFDFC, 0x04030201, 0xF8F7F6F5F4F3F2F1, 0xEE)
assert RECORD.unpack(_SAMPLE) == (
    u32_at(_SAMPLE, 0),
    u32_at(_SAMPLE, LEN_SIZE),
    u64_at(_SAMPLE, CRC_FROM),
    _SAMPLE[RECORD_SIZE - 1],
)


def checksum(header_tail: bytes, payload: bytes) -> int:
    return zlib.crc32(payload, zlib.crc32(header_tail))


def bad_type(type: object) -> JournalError:
    return JournalError(f"record type {type!r} is out of range: use 0 to 255")


def not_a_segment(path: Path, why: str) -> JournalError:
    return JournalError(
        f"{path} is not a valid journal segment: {why}; move it out of the directory"
    )


class SegmentFile:
    """One segment file, read through pread with a read-ahead buffer, validated as it goes."""

    def __init__(self, files: Files, fd: int, path: Path, base: int, max_record_size: int) -> None:
        self.files, self.fd, self.path, self.base = files, fd, path, base
        self.max_record_size = max_record_size
        self.size = files.size(fd)
        self.end: int | None = None  # compacted segments: the end of their LSN range
        self.data_start = self.size  # no records until a complete header is read
        self.header_cut: int | None = None  # bytes, when the file ends inside its header
        self._buffer, self._buffer_at = b"", 0
        self._view = memoryview(self._buffer)  # of _buffer, for CRCs without a copy

    def get(self, offset: int, size: int) -> bytes:
        buffer, start = self.window(offset, size)
        return buffer[start : start + size]

    def window(self, offset: int, size: int) -> tuple[bytes, int]:
        """A buffer holding the `size` bytes at `offset` (fewer at the end of the file), and
        where in it they start: records are parsed in place, without a copy of each header."""
        start = offset - self._buffer_at
        if start < 0 or start + size > len(self._buffer):
            if size > CHUNK:
                return pread(self.files, self.fd, size, offset), 0
            self._buffer = pread(self.files, self.fd, CHUNK, offset)
            self._view = memoryview(self._buffer)
            self._buffer_at, start = offset, 0
        return self._buffer, start

    def read_header(self) -> None:
        head = self.get(0, COMPACTED_HEADER.size)
        if len(head) < HEADER.size:
            # "A segment too short for its header is fine": a crash while it was created.
            if not HEADER.pack(MAGIC, VERSION, self.base).startswith(head):
                raise not_a_segment(self.path, "too short for a header, and not the start of one")
            self.header_cut = len(head)
            return
        magic, version, base = HEADER.unpack_from(head)
        if magic != MAGIC or version not in (VERSION, COMPACTED_VERSION):
            why = f"magic {magic!r} version {version} (expected {MAGIC!r} version 1 or 2)"
            raise not_a_segment(self.path, why)
        if base != self.base:
            raise not_a_segment(self.path, f"its header says base LSN {base}, its name {self.base}")
        self.data_start = HEADER.size
        if version == COMPACTED_VERSION:
            if len(head) < COMPACTED_HEADER.size:
                raise not_a_segment(self.path, "its compacted header is truncated")
            self.end, self.data_start = COMPACTED_HEADER.unpack(head)[3], COMPACTED_HEADER.size

    def records(self, last: int) -> Iterator[Record | Damage]:
        """The valid records and damaged regions in file order; `last`: the LSN before them."""
        offset = self.data_start
        while offset < self.size:
            record = self._parse(offset, last, self._upper(last, offset, offset))
            if record is None:
                resume = self._find(offset, last)
                yield Damage(offset, (self.size if resume is None else resume) - offset, resume)
                if resume is None:
                    return
                record = self._parse(resume, last, self._upper(last, resume, offset))
                assert record is not None
            yield record
            last = record.position.lsn
            offset = record.position.offset + RECORD_SIZE + len(record.payload)

    def _upper(self, last: int, offset: int, damaged: int) -> int:
        """The highest LSN a record at `offset` may have when damage starts at `damaged`."""
        if self.end is not None:
            return self.end - 1  # compaction leaves gaps: any LSN of the segment's range
        # The record at `damaged` should have had LSN last + 1; each record takes 17 bytes or more.
        return last + 1 + (offset - damaged) // RECORD.size

    def parse(self, offset: int, lsn: int) -> Record | None:
        """The record `lsn` at `offset`, or None if that is not a valid record `lsn`."""
        return self._parse(offset, lsn - 1, lsn)

    def _parse(self, offset: int, last: int, upper: int) -> Record | None:
        """The record at `offset` if it is valid with an LSN in (last, upper]."""
        buffer, start = self.window(offset, RECORD_SIZE)
        if start + RECORD_SIZE > len(buffer):
            return None
        lsn = u64_at(buffer, start + CRC_FROM)
        length = u32_at(buffer, start)
        if not last < lsn <= upper or length > self.max_record_size:
            return None
        if offset + RECORD_SIZE + length > self.size:
            return None
        buffer, start = self.window(offset, RECORD_SIZE + length)
        end = start + RECORD_SIZE + length
        # The CRC covers the header's LSN and type, then the payload: bytes that follow each
        # other, so one call over the buffer checks them (a view: no copy).
        view = self._view if buffer is self._buffer else memoryview(buffer)
        if crc32(view[start + CRC_FROM : end]) != u32_at(buffer, start + LEN_SIZE):
            return None
        kind = buffer[start + RECORD_SIZE - 1]
        return Record(Position(lsn, self.base, offset), kind, buffer[start + RECORD_SIZE : end])

    def complete(self, offset: int, last: int) -> DamagedRecord | None:
        """The invalid record at `offset`, the last the file holds, if its bytes were all
        written, or None if a crash cut its write short. A crash leaves the bytes of a record
        correct up to where the write stopped, then nothing, or zeros where the file's new size
        reached the disk and its data did not (whole pages of them). So a record is complete
        when its header is there, not zeros, and either its payload fits in the file (its LSN
        the next one, or its length reaching the file's end exactly) or its checksum matches
        the bytes to the end of the file (its length field was damaged)."""
        tail = self.get(offset, self.size - offset)
        if len(tail) < RECORD.size or not NONZERO.search(tail):
            return None
        length, crc, lsn, kind = RECORD.unpack_from(tail)
        body = memoryview(tail)[RECORD.size :]
        fits = length <= len(body) and length <= self.max_record_size
        if fits and (lsn == last + 1 or length == len(body)):
            if zero_pages_at_end(offset, tail[: RECORD.size + length]):
                return None
            return DamagedRecord(self.path, offset, lsn, kind, bytes(body[:length]))
        if zlib.crc32(body, zlib.crc32(tail[LEN_CRC.size : RECORD.size])) == crc:
            return DamagedRecord(self.path, offset, lsn, kind, bytes(body))
        return None

    def _find(self, damaged: int, last: int) -> int | None:
        """Rule 3: scan byte by byte for a valid record after the invalid one at `damaged`."""
        pos = damaged + 1
        while pos + RECORD.size <= self.size:
            window = self.get(pos, CHUNK)
            count, i = len(window) - RECORD.size + 1, 0
            while i < count:
                lsn = U64.unpack_from(window, i + 8)[0]
                upper = self._upper(last, pos + i, damaged)
                if last < lsn <= upper and self._parse(pos + i, last, upper) is not None:
                    return pos + i
                if lsn == 0:  # skip zero runs fast (a file extended but never written)
                    nonzero = NONZERO.search(window, i + 8)
                    i = max(i + 1, (len(window) if nonzero is None else nonzero.start()) - 15)
                else:
                    i += 1
            pos += count
        return None


def zero_pages_at_end(offset: int, data: bytes) -> bool:
    """Whether `data`, at `offset` in its file, ends with zeros from a page boundary on."""
    nonzero = NONZERO.search(data[::-1])
    if nonzero is None:
        return True
    zeros_from = offset + len(data) - nonzero.start()
    boundary = -(-zeros_from // PAGE) * PAGE
    return boundary < offset + len(data)
