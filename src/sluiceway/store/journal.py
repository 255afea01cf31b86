"""The write-ahead journal: append-only, segmented, checksummed.

Records are opaque bytes with a small integer type (0-255). Each gets a log sequence number (LSN):
1 for the first record ever, then one more per record, across segments.

On-disk format (integers little-endian)
---------------------------------------
A directory of segment files named by their base LSN, zero-padded to 20 digits, suffix `.log`
(`00000000000000000001.log`). A segment holds the records with LSNs from its base up to, not
including, the next segment's base. Segment header, 16 bytes, `<4sIQ`::

    0   4s   magic b"SWJ1"
    4   u32  format version: 1
    8   u64  base LSN (the number in the file name)

A compacted segment (see `Journal.rewrite_segment`) has format version 2 and a 24-byte header,
`<4sIQQ`: the same fields, then the u64 end LSN (the next segment's base when it was compacted).
Its records keep their LSNs, so there may be gaps between them; all lie in [base, end).

Record: a 17-byte header `<IIQB`, then the payload::

    0   u32  payload length, bytes
    4   u32  CRC-32 (zlib.crc32) of header bytes 8..17 then the payload (LSN, type, payload)
    8   u64  LSN
    16  u8   record type (opaque to the journal)

Also in the directory: `discarded/<segment name>.<offset>.bytes` (or `.<offset>.<n>.bytes` when
that name holds other bytes) keeps what recovery cut or skipped; `<segment name>.compact` is a
compaction interrupted by a crash (the segment itself is intact), removed by recovery.

Recovery (`Journal.recover`) reads segments in base-LSN order. A record is valid when its header
and payload are complete, its length is at most max_record_size, its CRC matches and its LSN is the
next one (in a compacted segment: higher than the previous and below the segment's end). At the
first invalid record, the rest of the segment is scanned byte by byte for a valid record:

- one is found: damage in the middle, raised as CorruptJournal unless skip_corrupt, which saves the
  damaged bytes aside, reports them and goes on from that record;
- none, in the last segment: the end of the journal. A record cut short (its header or payload
  runs past the end of the file, or is zeros) is a write a crash interrupted, never fsynced and
  so never confirmed: the bytes are saved aside and the segment truncated (a "torn tail"). A
  record whose bytes are all there but fail their checksum was damaged after it was written and
  may have been confirmed: CorruptJournal, unless skip_corrupt (saved aside, cut, reported as a
  DamagedRecord);
- none, in a segment that was complete on disk (a compacted one, fsynced whole before it replaced
  the old one, or one with a later segment after it): corruption, as in the middle.

A last segment that ends inside its header was being created when a crash came: it held no
record, is reported and removed. Any other segment that ends inside its header, and a gap or an
overlap between the LSNs of consecutive segments, is corruption. "Saved aside" means copied to
`discarded/` and fsynced before anything is cut: recovery never deletes unsaved data.

A failed write (ENOSPC, EDQUOT, EFBIG, EIO) is survived: whatever part of it reached the file
is cut off again (back to the end of the last record written whole), and its records stay
buffered, in order, at the offsets they were given; appends go on into the buffer, `flush` writes
nothing, and `retry_write` tries again (`write_error` says why the journal waits). No new
segment is started meanwhile: the buffered records belong to the active one. A failed fsync is
not survived (see `_fsync_failed`), nor a write whose partial bytes cannot be cut off.

Durability: under every policy a segment is fsynced before the next segment's file is created
(the new file and the directory are fsynced too), so a later segment on disk proves every earlier
one complete: a gap in the LSNs between segments is corruption, never the trace of a crash. Under
OS that is the only fsync of records: a process crash loses nothing flushed, and a power cut only
what the operating system had not written of the newest segment.
"""

from __future__ import annotations

import contextlib
import enum
import os
import re
import struct
import threading
import time
import zlib
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, NoReturn, TypeVar

from sluiceway.errors import SluicewayError
from sluiceway.store.files import OS_FILES, Files

MAGIC: Final = b"SWJ1"
VERSION: Final = 1
COMPACTED_VERSION: Final = 2

_HEADER: Final = struct.Struct("<4sIQ")
_COMPACTED_HEADER: Final = struct.Struct("<4sIQQ")
_RECORD: Final = struct.Struct("<IIQB")
_LEN_CRC: Final = struct.Struct("<II")  # the record header's first 8 bytes
_LSN_TYPE: Final = struct.Struct("<QB")  # its last 9, which the CRC covers
_U64: Final = struct.Struct("<Q")
assert (_HEADER.size, _COMPACTED_HEADER.size, _RECORD.size, _U64.size) == (16, 24, 17, 8)
assert _LEN_CRC.size + _LSN_TYPE.size == _RECORD.size
SEGMENT_HEADER_SIZE: Final = _HEADER.size  # bytes of a (not compacted) segment's header
# Read for every record recovered: a Final int is a C constant when compiled, where a struct's
# `size` is an attribute lookup.
_RECORD_SIZE: Final = 17
_CRC_FROM: Final = 8  # the record header's bytes from here on are under its CRC
assert (_RECORD.size, _LEN_CRC.size) == (_RECORD_SIZE, _CRC_FROM)
_LEN_SIZE: Final = 4  # the record header's length field; its CRC follows
_crc32: Final = zlib.crc32

_NAME: Final = re.compile(r"[0-9]{20}\.log")
_TEMP_SUFFIX: Final = ".compact"
_CHUNK: Final = 1 << 20  # bytes per read while recovering, and per write while compacting
_JOIN_TIMEOUT: Final = 30.0  # seconds close() waits for the fsync thread's last round
_NONZERO: Final = re.compile(rb"[^\x00]")
_PAGE: Final = 4096  # bytes: the unit in which a file's data reaches the disk
_T = TypeVar("_T")


class SyncPolicy(enum.Enum):
    """When flushed records are made durable."""

    ALWAYS = "always"  # every flush is fsynced before flush() returns (in the caller's thread)
    GROUP = "group"  # a background thread fsyncs; flushes made during one fsync share the next
    OS = "os"  # fsync a segment only once it is full; the OS writes the rest when it likes


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


class JournalError(SluicewayError):
    """The journal cannot do what was asked; the message says why and what to do."""


class JournalWriteError(JournalError):
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
class _Segment:
    base: int
    path: Path
    size: int  # bytes on disk (for the active segment, see Journal._end)
    end: int | None = None  # compacted segments: the end of their LSN range


@dataclass(frozen=True, slots=True)
class _Damage:
    offset: int  # of the first invalid byte
    length: int
    resume: int | None  # offset of the next valid record; None when no valid record follows


def _open(files: Files, path: Path, flags: int) -> int:
    try:
        return files.open(path, flags)
    except OSError as error:
        raise JournalError(f"cannot open {path}: {error}") from error


def _write_all(files: Files, fd: int, data: bytes) -> None:
    written = files.write(fd, data)
    while written < len(data):  # a short write: the rest, without copying it
        written += files.write(fd, memoryview(data)[written:])


def _pread(files: Files, fd: int, size: int, offset: int) -> bytes:
    """`size` bytes at `offset`, fewer only at the end of the file."""
    parts: list[bytes] = []
    while size > 0 and (part := files.pread(fd, size, offset)):
        parts.append(part)
        size, offset = size - len(part), offset + len(part)
    return b"".join(parts)


# A record header's integers (little-endian) read byte by byte: a compiled index is a C array
# access, where struct's unpack_from is a method call and a tuple per header.
def _u32_at(data: bytes, at: int) -> int:
    return data[at] | data[at + 1] << 8 | data[at + 2] << 16 | data[at + 3] << 24


def _u64_at(data: bytes, at: int) -> int:
    return _u32_at(data, at) | _u32_at(data, at + 4) << 32


_SAMPLE: Final = _RECORD.pack(0xFFFEFDFC, 0x04030201, 0xF8F7F6F5F4F3F2F1, 0xEE)
assert _RECORD.unpack(_SAMPLE) == (
    _u32_at(_SAMPLE, 0),
    _u32_at(_SAMPLE, _LEN_SIZE),
    _u64_at(_SAMPLE, _CRC_FROM),
    _SAMPLE[_RECORD_SIZE - 1],
)


def _crc(header_tail: bytes, payload: bytes) -> int:
    return zlib.crc32(payload, zlib.crc32(header_tail))


def _fsync_failed(what: object, error: OSError) -> str:
    # After a failed fsync the kernel may have dropped the dirty pages, and a retry could report
    # success for data that is gone: the journal stops for good.
    return (
        f"fsync of {what} failed ({error}): records may not be durable, so the journal accepts no"
        " more; restart the broker (recovery keeps every record that reached the disk)"
    )


def _bad_type(type: object) -> JournalError:
    return JournalError(f"record type {type!r} is out of range: use 0 to 255")


def _not_a_segment(path: Path, why: str) -> JournalError:
    return JournalError(
        f"{path} is not a valid journal segment: {why}; move it out of the directory"
    )


class _SegmentFile:
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
            if size > _CHUNK:
                return _pread(self.files, self.fd, size, offset), 0
            self._buffer = _pread(self.files, self.fd, _CHUNK, offset)
            self._view = memoryview(self._buffer)
            self._buffer_at, start = offset, 0
        return self._buffer, start

    def read_header(self) -> None:
        head = self.get(0, _COMPACTED_HEADER.size)
        if len(head) < _HEADER.size:
            # "A segment too short for its header is fine": a crash while it was created.
            if not _HEADER.pack(MAGIC, VERSION, self.base).startswith(head):
                raise _not_a_segment(self.path, "too short for a header, and not the start of one")
            self.header_cut = len(head)
            return
        magic, version, base = _HEADER.unpack_from(head)
        if magic != MAGIC or version not in (VERSION, COMPACTED_VERSION):
            why = f"magic {magic!r} version {version} (expected {MAGIC!r} version 1 or 2)"
            raise _not_a_segment(self.path, why)
        if base != self.base:
            raise _not_a_segment(
                self.path, f"its header says base LSN {base}, its name {self.base}"
            )
        self.data_start = _HEADER.size
        if version == COMPACTED_VERSION:
            if len(head) < _COMPACTED_HEADER.size:
                raise _not_a_segment(self.path, "its compacted header is truncated")
            self.end, self.data_start = _COMPACTED_HEADER.unpack(head)[3], _COMPACTED_HEADER.size

    def records(self, last: int) -> Iterator[Record | _Damage]:
        """The valid records and damaged regions in file order; `last`: the LSN before them."""
        offset = self.data_start
        while offset < self.size:
            record = self._parse(offset, last, self._upper(last, offset, offset))
            if record is None:
                resume = self._find(offset, last)
                yield _Damage(offset, (self.size if resume is None else resume) - offset, resume)
                if resume is None:
                    return
                record = self._parse(resume, last, self._upper(last, resume, offset))
                assert record is not None
            yield record
            last = record.position.lsn
            offset = record.position.offset + _RECORD_SIZE + len(record.payload)

    def _upper(self, last: int, offset: int, damaged: int) -> int:
        """The highest LSN a record at `offset` may have when damage starts at `damaged`."""
        if self.end is not None:
            return self.end - 1  # compaction leaves gaps: any LSN of the segment's range
        # The record at `damaged` should have had LSN last + 1; each record takes 17 bytes or more.
        return last + 1 + (offset - damaged) // _RECORD.size

    def parse(self, offset: int, lsn: int) -> Record | None:
        """The record `lsn` at `offset`, or None if that is not a valid record `lsn`."""
        return self._parse(offset, lsn - 1, lsn)

    def _parse(self, offset: int, last: int, upper: int) -> Record | None:
        """The record at `offset` if it is valid with an LSN in (last, upper]."""
        buffer, start = self.window(offset, _RECORD_SIZE)
        if start + _RECORD_SIZE > len(buffer):
            return None
        lsn = _u64_at(buffer, start + _CRC_FROM)
        length = _u32_at(buffer, start)
        if not last < lsn <= upper or length > self.max_record_size:
            return None
        if offset + _RECORD_SIZE + length > self.size:
            return None
        buffer, start = self.window(offset, _RECORD_SIZE + length)
        end = start + _RECORD_SIZE + length
        # The CRC covers the header's LSN and type, then the payload: bytes that follow each
        # other, so one call over the buffer checks them (a view: no copy).
        view = self._view if buffer is self._buffer else memoryview(buffer)
        if _crc32(view[start + _CRC_FROM : end]) != _u32_at(buffer, start + _LEN_SIZE):
            return None
        kind = buffer[start + _RECORD_SIZE - 1]
        return Record(Position(lsn, self.base, offset), kind, buffer[start + _RECORD_SIZE : end])

    def complete(self, offset: int, last: int) -> DamagedRecord | None:
        """The invalid record at `offset`, the last the file holds, if its bytes were all
        written, or None if a crash cut its write short. A crash leaves the bytes of a record
        correct up to where the write stopped, then nothing, or zeros where the file's new size
        reached the disk and its data did not (whole pages of them). So a record is complete
        when its header is there, not zeros, and either its payload fits in the file (its LSN
        the next one, or its length reaching the file's end exactly) or its checksum matches
        the bytes to the end of the file (its length field was damaged)."""
        tail = self.get(offset, self.size - offset)
        if len(tail) < _RECORD.size or not _NONZERO.search(tail):
            return None
        length, crc, lsn, kind = _RECORD.unpack_from(tail)
        body = memoryview(tail)[_RECORD.size :]
        fits = length <= len(body) and length <= self.max_record_size
        if fits and (lsn == last + 1 or length == len(body)):
            if _zero_pages_at_end(offset, tail[: _RECORD.size + length]):
                return None
            return DamagedRecord(self.path, offset, lsn, kind, bytes(body[:length]))
        if zlib.crc32(body, zlib.crc32(tail[_LEN_CRC.size : _RECORD.size])) == crc:
            return DamagedRecord(self.path, offset, lsn, kind, bytes(body))
        return None

    def _find(self, damaged: int, last: int) -> int | None:
        """Rule 3: scan byte by byte for a valid record after the invalid one at `damaged`."""
        pos = damaged + 1
        while pos + _RECORD.size <= self.size:
            window = self.get(pos, _CHUNK)
            count, i = len(window) - _RECORD.size + 1, 0
            while i < count:
                lsn = _U64.unpack_from(window, i + 8)[0]
                upper = self._upper(last, pos + i, damaged)
                if last < lsn <= upper and self._parse(pos + i, last, upper) is not None:
                    return pos + i
                if lsn == 0:  # skip zero runs fast (a file extended but never written)
                    nonzero = _NONZERO.search(window, i + 8)
                    i = max(i + 1, (len(window) if nonzero is None else nonzero.start()) - 15)
                else:
                    i += 1
            pos += count
        return None


class Journal:
    """An append-only journal of typed records in a directory of segment files.

    Call `recover()` once and exhaust it, then use the journal from one thread. Under GROUP a
    daemon thread fsyncs and calls `on_synced` (which must be thread-safe); `close()` stops it.
    """

    def __init__(
        self,
        directory: Path,
        *,
        segment_size: int = 64 * 1024 * 1024,
        sync: SyncPolicy = SyncPolicy.GROUP,
        on_synced: Callable[[int], None] | None = None,
        skip_corrupt: bool = False,
        max_record_size: int = 128 * 1024 * 1024,
        sync_delay: float = 0.0,
        files: Files = OS_FILES,
        sync_thread: bool = True,
    ) -> None:
        if segment_size < _COMPACTED_HEADER.size + _RECORD.size:
            raise JournalError(f"segment_size {segment_size} is too small: use 41 bytes or more")
        if not 0 <= max_record_size <= 0xFFFFFFFF:
            raise JournalError(f"max_record_size {max_record_size} must be 0 to 2**32-1 bytes")
        if not 0.0 <= sync_delay <= 1.0:
            raise JournalError(f"sync_delay {sync_delay} must be 0 to 1 second")
        self._directory = Path(directory)
        self._segment_size, self._sync, self._on_synced = segment_size, sync, on_synced
        self._skip_corrupt, self._max_record_size = skip_corrupt, max_record_size
        self._sync_delay = sync_delay
        self.report = RecoveryReport()
        # Why operations are refused (None: accepted): one attribute test per append.
        self._blocked: str | None = "call recover() and exhaust it before appending"
        self._cause: BaseException | None = None
        self._failed = self._recover_called = self._closed = False
        self._segments: dict[int, _Segment] = {}  # by base LSN, oldest first, the active one last
        self._chunks: list[bytes] = []
        # Why the buffered records could not be written (None: they can); see the module doc.
        self._write_error: OSError | None = None
        self._bytes_written = 0  # to the active segments since the journal opened (estimates)
        self._next_lsn, self._reported_lsn = 1, 0  # _reported_lsn: the last passed to on_synced
        self._active_base = 0
        self._end = self._written_end = 0  # bytes in the active segment: appended, written
        # Shared with the fsync thread under GROUP, guarded by _cond (so are _blocked, _failed).
        self._cond = threading.Condition(threading.Lock())
        self._active_fd, self._written_lsn, self._synced_lsn = -1, 0, 0
        self._retired: list[int] = []  # fds of older segments the thread fsyncs, then closes
        self._dirty = self._stopping = False  # _dirty: written data no fsync round has taken yet
        self._wanted_lsn = 0  # the furthest LSN something waits to see durable (request_sync)
        self._syncer: threading.Thread | None = None  # fsyncs under GROUP
        self._files = files
        self._sync_thread = sync_thread  # False: under GROUP, sync_round() runs the rounds
        self.fsync: Callable[[int], None] = files.fsync  # the one place files are fsynced (tests
        # replace it to count, slow or fail the fsyncs)

    # -- recovery ------------------------------------------------------------------------------

    def recover(self) -> Iterator[Record]:
        """Yield every valid record in LSN order, streaming (see Recovery in the module doc)."""
        if self._recover_called:
            raise JournalError("recover() was already called; a journal is recovered once")
        self._recover_called = True
        return self._recover()

    def _recover(self) -> Iterator[Record]:
        found = self._list_directory()
        expected: int | None = None  # the base LSN the next segment must have
        for index, (base, path) in enumerate(found):
            if expected is not None and base != expected:
                self._lsn_jump(path, expected, base)
            expected = yield from self._recover_segment(base, path, last=index + 1 == len(found))
        self._next_lsn = 1 if expected is None else expected
        self._written_lsn = self._synced_lsn = self._reported_lsn = self._next_lsn - 1
        self._open_active()
        self._blocked = None
        if self._sync is SyncPolicy.GROUP and self._sync_thread:
            name = f"journal-fsync {self._directory}"
            self._syncer = threading.Thread(target=self._sync_loop, name=name, daemon=True)
            self._syncer.start()

    def _list_directory(self) -> list[tuple[int, Path]]:
        try:
            names = self._files.names(self._directory)
        except OSError as error:
            raise JournalError(
                f"cannot open journal directory {self._directory}: {error}"
            ) from error
        found: list[tuple[int, Path]] = []
        for name in names:
            if _NAME.fullmatch(name):
                found.append((int(name[:20]), self._directory / name))
            elif _NAME.fullmatch(name.removesuffix(_TEMP_SUFFIX)):
                # An interrupted compaction: "a crash at any moment leaves either the old or the
                # new file", and this is neither; the old segment is intact.
                self._unlink(self._directory / name)
        return sorted(found)

    def _lsn_jump(self, path: Path, expected: int, base: int) -> None:
        """Rule 1: LSNs continue without gaps across segments."""
        if base < expected:
            problem = f"base LSN {base} overlaps the previous segment, which reaches {expected - 1}"
            raise CorruptJournal(path, 0, problem, skippable=False)
        if not self._skip_corrupt:
            problem = f"LSNs {expected} to {base - 1} are missing before it (a segment was lost)"
            raise CorruptJournal(path, 0, problem)
        self.report.lsn_gaps.append((expected - 1, base))

    def _recover_segment(
        self, base: int, path: Path, *, last: bool
    ) -> Generator[Record, None, int]:
        """Yield a segment's valid records; return the next segment's base. `last`: no later
        segment exists (one that does proves this one complete on disk: it was fsynced first)."""
        fd = _open(self._files, path, os.O_RDWR)
        try:
            segment = _SegmentFile(self._files, fd, path, base, self._max_record_size)
            segment.read_header()
            self.report.segments += 1
            if segment.header_cut is not None:
                self._header_cut(segment, last=last)
            end, size = base, segment.size
            for item in segment.records(base - 1):
                if isinstance(item, _Damage):
                    if item.resume is None and segment.end is None and last:
                        size = self._cut_tail(segment, item.offset, end - 1)
                        break
                    self._skip(segment, item)
                    continue
                if item.position.lsn != end and segment.end is None:
                    self.report.lsn_gaps.append((end - 1, item.position.lsn))
                end = item.position.lsn + 1
                self.report.records += 1
                yield item
            if self._sync is not SyncPolicy.OS:
                self._sync_fd(fd, path)  # what an earlier run under OS wrote is durable from now
        finally:
            self._files.close(fd)
        self._segments[base] = _Segment(base, path, size, segment.end)
        return end if segment.end is None else segment.end

    def _header_cut(self, segment: _SegmentFile, *, last: bool) -> None:
        """The file ends inside its header: a crash while it was created, if it is the last."""
        if last:
            self.report.headers_cut.append((segment.path, segment.size))
            return
        problem = (
            f"it ends inside its {_HEADER.size}-byte header ({segment.size} bytes), yet a later "
            "segment exists, so it was complete on disk once: whatever it held is lost"
        )
        if not self._skip_corrupt:
            raise CorruptJournal(segment.path, 0, problem)
        _add_new(self.report.skipped, (segment.path, 0, segment.size))

    def _cut_tail(self, segment: _SegmentFile, offset: int, last_lsn: int) -> int:
        """Rule 3: nothing valid after the damage at the end of the journal. A record cut short
        is a write a crash interrupted: cut. A complete record failing its checksum is damage
        to a record that may have been confirmed: refused unless skip_corrupt."""
        length = segment.size - offset
        damaged = segment.complete(offset, last_lsn)
        if damaged is not None:
            if not self._skip_corrupt:
                what = f"its last record (LSN {damaged.lsn}, type {damaged.type}, "
                if len(damaged.payload) > self._max_record_size:
                    what += f"{len(damaged.payload)} bytes) is larger than max_record_size"
                    raise CorruptJournal(segment.path, offset, what, skippable=False)
                problem = what + (
                    f"{len(damaged.payload)} bytes) is complete but fails its checksum: the disk "
                    "damaged it after it was written, and it may have been confirmed to a client"
                )
                raise CorruptJournal(segment.path, offset, problem, damaged=damaged)
            self.report.damaged.append(damaged)
            _add_new(self.report.skipped, (segment.path, offset, length))
        self._save_aside(segment.fd, segment.path, offset, length)
        self._files.truncate(segment.fd, offset)
        self._sync_fd(segment.fd, segment.path)
        if damaged is None:
            self.report.torn_bytes += length
            self.report.torn.append((segment.path, offset, length))
        return offset

    def _skip(self, segment: _SegmentFile, damage: _Damage) -> None:
        if not self._skip_corrupt:
            after = (
                "nothing valid follows, yet the segment was complete on disk (it was compacted, "
                "or a later segment exists)"
                if damage.resume is None
                else f"a valid record follows at offset {damage.resume}"
            )
            raise CorruptJournal(segment.path, damage.offset, f"an invalid record, and {after}")
        self._save_aside(segment.fd, segment.path, damage.offset, damage.length)
        _add_new(self.report.skipped, (segment.path, damage.offset, damage.length))

    def _save_aside(self, fd: int, path: Path, offset: int, length: int) -> None:
        """Rule 5: copy bytes to discarded/ and fsync them before they are cut or skipped."""
        folder = self._directory / "discarded"
        if not self._files.exists(folder):
            self._files.make_directory(folder)
            self._sync_dir(self._directory)
        target, n = folder / f"{path.name}.{offset}.bytes", 0
        while self._files.exists(target):
            if self._same_bytes(target, fd, offset, length):  # saved by an earlier recovery
                _add_new(self.report.saved, target)
                return
            n += 1
            target = folder / f"{path.name}.{offset}.{n}.bytes"
        out = _open(self._files, target, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            for start in range(offset, offset + length, _CHUNK):
                size = min(_CHUNK, offset + length - start)
                _write_all(self._files, out, _pread(self._files, fd, size, start))
            self._sync_fd(out, target)
        finally:
            self._files.close(out)
        self._sync_dir(folder)
        _add_new(self.report.saved, target)

    def _same_bytes(self, path: Path, fd: int, offset: int, length: int) -> bool:
        """Whether the file at `path` holds exactly the `length` bytes of `fd` at `offset`."""
        files = self._files
        saved = _open(files, path, os.O_RDONLY)
        try:
            return files.size(saved) == length and all(
                _pread(files, saved, n, start - offset) == _pread(files, fd, n, start)
                for start in range(offset, offset + length, _CHUNK)
                if (n := min(_CHUNK, offset + length - start))
            )
        finally:
            files.close(saved)

    def _unlink(self, path: Path) -> None:
        try:
            self._files.remove(path)
        except OSError as error:
            raise JournalError(f"cannot delete {path}: {error}") from error

    def _open_active(self) -> None:
        """Rule 6: the last segment takes the appends unless it is full (or compacted)."""
        last = next(reversed(self._segments.values()), None)
        if last is not None and last.end is None and last.size < self._segment_size:
            if last.size >= _HEADER.size:
                self._active_fd = _open(self._files, last.path, os.O_RDWR | os.O_APPEND)
                self._active_base, self._end = last.base, last.size
                self._written_end = self._end
                return
            # A crash while it was created: its bytes are a prefix of the header written below.
            self._unlink(last.path)
            del self._segments[last.base]
        self._active_fd = self._create_segment(self._next_lsn)
        self._active_base, self._end, self._written_end = self._next_lsn, _HEADER.size, _HEADER.size

    def segment_path(self, base: int) -> Path:
        """The file of the segment with base LSN `base` (whether or not it exists)."""
        return self._directory / f"{base:020d}.log"

    def _create_segment(self, base: int) -> int:
        path = self.segment_path(base)
        fd = _open(self._files, path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND)
        try:
            _write_all(self._files, fd, _HEADER.pack(MAGIC, VERSION, base))
            self._sync_fd(fd, path)
            self._sync_dir(self._directory)  # the file's existence is durable too
        except BaseException as error:
            self._files.close(fd)
            if not isinstance(error, OSError):
                raise
            self._drop_new_segment(path, error)
            refused = JournalWriteError(f"cannot create segment {path}: {error}")
            refused.__cause__ = error  # set, not `raise from`: compiled code ignores `from`
            raise refused  # noqa: B904  (the cause is set on the line above)
        self._segments[base] = _Segment(base, path, _HEADER.size)
        return fd

    def _drop_new_segment(self, path: Path, error: OSError) -> None:
        """A partial header left between segments would read as an overlap on recovery: it goes,
        durably (the records that follow go to the old segment, under the same LSNs), or the
        journal stops."""
        try:
            self._files.remove(path)
        except OSError as cut:
            message = (
                f"creating {path} failed ({error}), and removing it failed too ({cut}): fix the"
                " disk, move the file out of the journal directory and restart the broker"
            )
            raise self._fail(message, cut) from error
        self._sync_dir(self._directory)  # (a failed fsync stops the journal: it says so)

    # -- appending -----------------------------------------------------------------------------

    def append(self, type: int, payload: bytes) -> Position:
        """Buffer a record (no syscall) and return its position; `payload` must not change."""
        offset = self._end
        lsn = self.add(type, payload)
        return Position(lsn, self._active_base, offset)

    def add(self, type: int, payload: bytes) -> int:
        """`append`, returning only the record's LSN (no Position made: the hot path)."""
        if self._blocked is not None:
            self._refuse()
        size = len(payload)
        if size > self._max_record_size:
            raise self._too_large(size)
        lsn = self._next_lsn
        try:
            crc = zlib.crc32(payload, zlib.crc32(_LSN_TYPE.pack(lsn, type)))
        except struct.error:
            raise _bad_type(type) from None
        offset = self._end
        chunks = self._chunks
        chunks.append(_RECORD.pack(size, crc, lsn, type))
        chunks.append(payload)
        self._end = offset + _RECORD.size + size
        self._next_lsn = lsn + 1
        return lsn

    def add_all(self, records: Sequence[tuple[int, bytes]]) -> int:
        """Buffer `records` (type, payload) as one unit and return the LSN of the first: every
        record is checked before any is buffered, so either all are or, raising, none is (a
        transaction's TX record must never be left without the records it announces)."""
        if self._blocked is not None:
            self._refuse()
        first = lsn = self._next_lsn
        end = self._end
        chunks: list[bytes] = []
        for type, payload in records:
            size = len(payload)
            if size > self._max_record_size:
                raise self._too_large(size)
            try:
                crc = zlib.crc32(payload, zlib.crc32(_LSN_TYPE.pack(lsn, type)))
            except struct.error:
                raise _bad_type(type) from None
            chunks += (_RECORD.pack(size, crc, lsn, type), payload)
            end += _RECORD.size + size
            lsn += 1
        self._chunks += chunks
        self._end, self._next_lsn = end, lsn
        return first

    def _too_large(self, size: int) -> JournalError:
        return JournalError(
            f"a record of {size} bytes exceeds max_record_size ({self._max_record_size} bytes);"
            " raise the limit or store less per record"
        )

    def flush(self) -> int:
        """Hand every buffered record to the OS in one write; return the last LSN written.

        While a failed write's records wait (`write_error`), nothing is written: `retry_write`.
        """
        if self._blocked is not None:
            self._refuse()
        if self._chunks and self._write_error is None:
            self._write_buffered()
        return self._written_lsn

    def retry_write(self) -> bool:
        """Write the records that wait since a write failed; True once none waits (False: the
        write failed again, and `write_error` says how)."""
        if self._blocked is not None:
            self._refuse()
        if self._write_error is None:
            return True
        # (Not read again below: compiled code would take it for the None assigned here.)
        self._write_error = None
        return not self._chunks or self._write_buffered()

    def _write_buffered(self) -> bool:
        """Write the buffered records; False when the write failed (they wait, see _stall)."""
        data, lsn = b"".join(self._chunks), self._next_lsn - 1
        self._chunks = [data]  # kept until written: a failed write leaves them, in order
        try:
            _write_all(self._files, self._active_fd, data)
        except OSError as error:
            self._stall(len(data), error)
            return False
        self._chunks = []
        self._bytes_written += len(data)
        self._written_end = self._end
        if self._sync is SyncPolicy.GROUP:
            with self._cond:
                # The thread is woken when these records start its wait for sync_delay, or when
                # something already waits for them: not once per flush.
                wake = not self._dirty or self._wanted_lsn > self._synced_lsn
                self._written_lsn, self._dirty = lsn, True
                if wake:
                    self._cond.notify()
            return True
        self._written_lsn = lsn
        if self._sync is SyncPolicy.ALWAYS:
            self._sync_fd(self._active_fd, self._segments[self._active_base].path)
        self._synced_lsn = self._reported_lsn = lsn
        if self._on_synced is not None:
            self._on_synced(lsn)
        return True

    def take_back(self, lsn: int) -> None:
        """Unbuffer the records from `lsn` on, none of them written: a unit whose writer gives
        up on it because the disk refused it (a COMMIT refused, which must not be written
        later). The records before it still wait, and `lsn` is the next LSN again."""
        if not self._written_lsn < lsn <= self._next_lsn:
            raise JournalError(
                f"records from {lsn} cannot be taken back: only unwritten ones can"
                f" ({self._written_lsn + 1} to {self._next_lsn - 1})"
            )
        data, offset = b"".join(self._chunks), 0
        for _ in range(lsn - self._written_lsn - 1):  # (each record's length, then its bytes)
            offset += _RECORD.size + _LEN_CRC.unpack_from(data, offset)[0]
        self._chunks = [data[:offset]] if offset else []
        self._end, self._next_lsn = self._written_end + offset, lsn

    def _stall(self, size: int, error: OSError) -> None:
        """A write failed. Cut off what of it reached the file, so that the file ends with a
        whole record (else recovery would cut it as a torn tail, and a retry, appending, would
        leave it in the middle); the records then wait to be written at the offsets they have."""
        path = self._segments[self._active_base].path
        try:
            self._files.truncate(self._active_fd, self._written_end)
        except OSError as cut:
            message = (
                f"writing {size} bytes to {path} failed ({error}), and cutting off what it wrote"
                f" failed too ({cut}): the segment may end with a partial record, so the journal"
                " accepts no more; fix the disk and restart the broker (recovery cuts it off)"
            )
            failure = self._fail(message, cut)
            failure.__cause__ = error  # set, not `raise from`: compiled code ignores `from`
            raise failure  # noqa: B904  (the cause is set on the line above)
        self._write_error = error

    def waiting_error(self, what: str) -> JournalWriteError:
        """The refusal of `what`, which needs the records that wait for the disk written first."""
        error = self._write_error
        refused = JournalWriteError(
            f"cannot {what}: {self._end - self._written_end} bytes of records wait to be written"
            f" to {self._segments[self._active_base].path} since a write failed ({error}); free"
            " space on that disk (the records are kept in memory and written when it takes them)"
        )
        refused.__cause__ = error
        return refused

    @property
    def write_error(self) -> OSError | None:
        """Why records wait in memory for the disk (the last failed write), or None."""
        return self._write_error

    @property
    def waiting_bytes(self) -> int:
        """Bytes of records appended and not yet written (buffered, or waiting for the disk)."""
        return self._end - self._written_end

    @property
    def bytes_written(self) -> int:
        """Bytes of records written since the journal opened (grows by each write)."""
        return self._bytes_written

    @property
    def directory(self) -> Path:
        return self._directory

    def free_space(self) -> tuple[int, int]:
        """(bytes free for the broker, bytes in all) on the disk holding the journal."""
        return self._files.free_space(self._directory)

    @property
    def failure(self) -> str | None:
        """Why the journal stopped for good (a failed fsync...), or None while it works."""
        return self._blocked if self._failed else None

    @property
    def buffered(self) -> bool:
        return bool(self._chunks)

    @property
    def next_lsn(self) -> int:
        return self._next_lsn

    @property
    def written_lsn(self) -> int:
        return self._written_lsn

    @property
    def synced_lsn(self) -> int:
        return self._synced_lsn

    def request_sync(self, lsn: int) -> None:
        """Something waits for `lsn` to be durable (a RECEIPT): under GROUP a round starts now
        for what is written, instead of up to sync_delay later. Does not block."""
        if self._syncer is None or lsn <= self._wanted_lsn:
            return  # asked already (it only grows): no lock taken, as on most calls
        with self._cond:
            self._wanted_lsn = max(self._wanted_lsn, lsn)
            if self._dirty and lsn > self._synced_lsn:
                self._cond.notify()

    def sync_active(self) -> None:
        """Flush, then fsync the active segment now, whatever the policy (older segments are
        fsynced when they stop being active): every record written is durable on return."""
        lsn = self.flush()
        self._sync_fd(self._active_fd, self._segments[self._active_base].path)
        with self._cond:
            self._synced_lsn = max(self._synced_lsn, lsn)

    def wait_synced(self, lsn: int, timeout: float | None = None) -> bool:
        """Block until `lsn` is durable (True) or `timeout` seconds pass (False).

        Raises JournalError once the journal has failed: the wait could never end well. Without
        the GROUP thread only the caller's own flush() syncs, so this does not block.
        """
        self.request_sync(lsn)
        with self._cond:
            if self._syncer is not None:
                self._cond.wait_for(
                    lambda: self._synced_lsn >= lsn or self._failed or self._stopping, timeout
                )
            if self._synced_lsn < lsn and self._failed:
                self._refuse()
            return self._synced_lsn >= lsn

    # -- segments ------------------------------------------------------------------------------

    @property
    def should_rotate(self) -> bool:
        """The active segment has reached segment_size, buffered records included."""
        return self._end >= self._segment_size

    def rotate(self) -> int:
        """Flush, then start a new active segment at next_lsn; return its base LSN.

        An active segment without records is kept: its base already is next_lsn. Refused
        (JournalWriteError) while records wait for the disk: they belong to the active segment.
        When the new segment cannot be created the active one stays, and so do the records
        appended next, waiting as after a failed write.
        """
        self.flush()
        if self._write_error is not None:
            raise self.waiting_error("start a new segment")
        if self._end == _HEADER.size:
            return self._active_base
        old = self._segments[self._active_base]
        if self._sync is not SyncPolicy.ALWAYS:  # (which synced it in flush)
            self._sync_fd(self._active_fd, old.path)  # complete on disk before a later segment
        base = self._next_lsn
        try:
            fd = self._create_segment(base)
        except JournalWriteError as refused:
            cause = refused.__cause__
            self._write_error = cause if isinstance(cause, OSError) else OSError(str(refused))
            raise
        old.size = self._end
        with self._cond:
            old_fd, self._active_fd = self._active_fd, fd
            if self._sync is SyncPolicy.GROUP:
                self._retired.append(old_fd)  # the thread may be fsyncing it: it closes it
                self._dirty = True
                self._cond.notify()
        if self._sync is not SyncPolicy.GROUP:
            self._files.close(old_fd)
        self._active_base, self._end, self._written_end = base, _HEADER.size, _HEADER.size
        return base

    def segments(self) -> list[SegmentInfo]:
        active = self._active_base
        return [
            SegmentInfo(s.base, s.path, self._end if s.base == active else s.size, s.base == active)
            for s in self._segments.values()
        ]

    def delete_segment(self, base_lsn: int) -> None:
        """Delete a non-active segment whose records are all dead.

        Only the oldest file goes: a file missing in the middle reads as lost data on recovery
        ("a gap between complete segments is corruption"). A later segment is emptied instead
        (compacted, 24 bytes) and removed once it is the oldest.
        """
        segment = self._non_active(base_lsn)
        if base_lsn != next(iter(self._segments)):
            if segment.end is None or segment.size > _COMPACTED_HEADER.size:  # not emptied yet
                self.rewrite_segment(base_lsn, lambda _record: False)
            return
        self._remove(segment)
        for later in list(self._segments.values()):
            if later.end is None or later.size > _COMPACTED_HEADER.size:
                break
            self._remove(later)
        self._sync_dir(self._directory)

    def _remove(self, segment: _Segment) -> None:
        try:
            self._files.remove(segment.path)
        except OSError as error:
            raise JournalError(f"cannot delete segment {segment.path}: {error}") from error
        del self._segments[segment.base]

    def rewrite_segment(self, base_lsn: int, keep: Callable[[Record], bool]) -> dict[int, Position]:
        """Compact a non-active segment to the records `keep` accepts; return their positions.

        They keep their LSNs and types. The copy is fsynced, renamed over the segment, then the
        directory is fsynced: a crash at any moment leaves the old file or the new one.
        """
        segment = self._non_active(base_lsn)
        bases = list(self._segments)
        end = bases[bases.index(base_lsn) + 1]
        temp = segment.path.with_name(segment.path.name + _TEMP_SUFFIX)
        fd = _open(self._files, temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            positions, size = self._copy_kept(segment, end, keep, fd)
            self._sync_fd(fd, temp)
        except BaseException as error:
            self._files.close(fd)
            with contextlib.suppress(FileNotFoundError):
                self._files.remove(temp)
            if isinstance(error, OSError):  # the segment is untouched: free space and retry
                raise JournalError(f"cannot compact {segment.path}: {error}") from error
            raise
        self._files.close(fd)
        self._files.replace(temp, segment.path)
        self._sync_dir(self._directory)
        segment.size, segment.end = size, end
        return positions

    def _copy_kept(
        self, segment: _Segment, end: int, keep: Callable[[Record], bool], out: int
    ) -> tuple[dict[int, Position], int]:
        chunks = [_COMPACTED_HEADER.pack(MAGIC, COMPACTED_VERSION, segment.base, end)]
        size = pending = _COMPACTED_HEADER.size
        positions: dict[int, Position] = {}
        for record in self._segment_records(segment):
            if keep(record):
                lsn, payload = record.position.lsn, record.payload
                positions[lsn] = Position(lsn, segment.base, size)
                tail = _LSN_TYPE.pack(lsn, record.type)
                chunks += (_LEN_CRC.pack(len(payload), _crc(tail, payload)), tail, payload)
                size, pending = size + _RECORD.size + len(payload), pending + len(payload)
            if pending >= _CHUNK:
                _write_all(self._files, out, b"".join(chunks))
                chunks, pending = [], 0
        _write_all(self._files, out, b"".join(chunks))
        return positions, size

    def scan(self) -> Iterator[Record]:
        """Read every valid record on disk again, in LSN order (records not flushed are not)."""
        if self._blocked is not None and not self._failed:
            self._refuse()  # not recovered yet, or closed
        for segment in list(self._segments.values()):
            yield from self._segment_records(segment)

    def _segment_records(self, segment: _Segment) -> Iterator[Record]:
        fd = _open(self._files, segment.path, os.O_RDONLY)
        try:
            reader = _SegmentFile(
                self._files, fd, segment.path, segment.base, self._max_record_size
            )
            reader.read_header()
            for item in reader.records(segment.base - 1):
                if isinstance(item, _Damage):
                    self._skip(reader, item)  # a complete segment has no torn tail
                else:
                    yield item
        finally:
            self._files.close(fd)

    def _non_active(self, base: int) -> _Segment:
        if self._blocked is not None:
            self._refuse()
        if base == self._active_base:
            raise JournalError(f"segment {base} is the active segment; rotate() first")
        if base not in self._segments:
            raise JournalError(f"no segment has base LSN {base}; segments() lists them")
        return self._segments[base]

    def read(self, position: Position) -> Record:
        """The record at `position`, read with pread and checked against its CRC."""
        if self._closed:
            raise JournalError("the journal is closed")
        base, offset, segment = (
            position.segment,
            position.offset,
            self._segments.get(position.segment),
        )
        if segment is None:
            raise JournalError(f"no segment has base LSN {base}: it was deleted")
        if base == self._active_base and offset >= self._written_end:
            raise JournalError(f"record {position.lsn} is not flushed yet; flush() before reading")
        active = base == self._active_base
        fd = self._active_fd if active else _open(self._files, segment.path, os.O_RDONLY)
        try:
            header = _pread(self._files, fd, _RECORD.size, offset)
            length, crc, lsn, kind = _RECORD.unpack(header.ljust(_RECORD.size, b"\0"))
            if lsn == position.lsn and length <= self._max_record_size:
                payload = _pread(self._files, fd, length, offset + _RECORD.size)
                if len(payload) == length and _crc(header[_LEN_CRC.size :], payload) == crc:
                    return Record(position, kind, payload)
        finally:
            if fd != self._active_fd:
                self._files.close(fd)
        raise JournalError(
            f"no valid record {position.lsn} at offset {offset} of {segment.path}: the bytes are"
            " damaged, or the segment was rewritten since (use the positions rewrite returned)"
        )

    def read_many(self, base: int, lsns: Sequence[int], offsets: Sequence[int]) -> Iterator[Record]:
        """The records `lsns` of segment `base`, at `offsets` (in file order): each checked
        against its CRC, as `read` does, and all read through one read-ahead buffer, so that
        going over many of them costs one pread per megabyte rather than two per record
        (recovery's second pass)."""
        if self._closed:
            raise JournalError("the journal is closed")
        segment = self._segments.get(base)
        if segment is None:
            raise JournalError(f"no segment has base LSN {base}: it was deleted")
        fd = _open(self._files, segment.path, os.O_RDONLY)
        try:
            reader = _SegmentFile(self._files, fd, segment.path, base, self._max_record_size)
            for lsn, offset in zip(lsns, offsets, strict=True):
                record = reader.parse(offset, lsn)
                if record is None or (base == self._active_base and offset >= self._written_end):
                    raise JournalError(
                        f"no valid record {lsn} at offset {offset} of {segment.path}: the bytes"
                        " are damaged, or the segment was rewritten since"
                    )
                yield record
        finally:
            self._files.close(fd)

    # -- durability ----------------------------------------------------------------------------

    def _sync_fd(self, fd: int, path: Path) -> None:
        try:
            self.fsync(fd)
        except OSError as error:
            raise self._fail(_fsync_failed(path, error), error) from error

    def _sync_dir(self, path: Path) -> None:
        fd = _open(self._files, path, os.O_RDONLY)
        try:
            self._sync_fd(fd, path)
        finally:
            self._files.close(fd)

    def _fail(self, message: str, cause: BaseException) -> JournalError:
        """Refuse every later operation: "never continue silently after a failed fsync"."""
        with self._cond:
            if not self._failed:
                self._failed, self._blocked, self._cause = True, message, cause
            self._cond.notify_all()
        return JournalError(message)

    def _refuse(self) -> NoReturn:
        refused = JournalError(self._blocked)
        refused.__cause__ = self._cause  # set, not `raise from`: compiled code ignores `from`
        raise refused

    def _sync_loop(self) -> None:
        """GROUP: one fsync round covers every flush made before it started. A round starts as
        soon as something waits for written records (request_sync), else sync_delay after the
        first write it takes, so records nothing waits for do not hold up a round that a
        RECEIPT will wait for (on a busy broker most rounds have a waiter)."""
        while True:
            with self._cond:
                self._wait_for_round()
                if not self._dirty or self._failed:
                    return
                self._dirty = False
                target, retired, active = self._written_lsn, list(self._retired), self._active_fd
            if not self._sync_round(target, retired, active):
                return

    def sync_round(self) -> bool:
        """Under GROUP without its thread (`sync_thread=False`, for tests that decide when the
        disk syncs): run one round now, as the thread would. False when nothing was written
        since the last round, or the round failed (the journal then refuses everything)."""
        with self._cond:
            if self._syncer is not None or not self._dirty or self._failed:
                return False
            self._dirty = False
            target, retired, active = self._written_lsn, list(self._retired), self._active_fd
        return self._sync_round(target, retired, active)

    def _wait_for_round(self) -> None:
        """Return (holding _cond) when a round is due or the journal stops."""
        deadline = 0.0
        while not self._stopping:
            if not self._dirty:
                deadline = 0.0
                self._cond.wait()
                continue
            if self._wanted_lsn > self._synced_lsn:
                return
            now = time.monotonic()
            if not deadline:
                deadline = now + self._sync_delay
            if now >= deadline:
                return
            self._cond.wait(deadline - now)

    def _sync_round(self, target: int, retired: list[int], active: int) -> bool:
        try:
            # Older segments first: no LSN of a segment is reported before earlier ones are durable.
            for fd in (*retired, active):
                self.fsync(fd)
        except OSError as error:
            self._fail(_fsync_failed(f"{self._directory} (LSNs to {target})", error), error)
            return False
        # synced_lsn is published before on_synced runs: a caller woken by the callback must
        # find synced_lsn at least as far as the LSN it was told about.
        with self._cond:
            for fd in retired:
                self._files.close(fd)
            del self._retired[: len(retired)]
            self._synced_lsn = max(self._synced_lsn, target)
            self._cond.notify_all()
        if target > self._reported_lsn and self._on_synced is not None:
            self._reported_lsn = target
            try:
                self._on_synced(target)
            except Exception as error:  # a bug in the callback stops the journal, not silently
                self._fail(f"on_synced({target}) raised {error!r}; the journal stopped", error)
                return False
        return True

    def close(self) -> None:
        """Flush, make durable (except under OS), stop the fsync thread, close the files.

        Raises JournalError if the journal failed, even when an append already reported it,
        and JournalWriteError if records still wait for the disk after a last try (they are
        lost; nothing that waited for them was confirmed).
        """
        if self._closed:
            return
        self._closed = True
        unwritten: JournalWriteError | None = None
        try:
            if self._blocked is None:
                self.retry_write()
                self.flush()
                self.sync_round()  # (without the GROUP thread; otherwise it runs the last round)
                if self._write_error is not None:
                    unwritten = self._lost_on_close()
        finally:
            stopped = self._stop_thread()
            with self._cond:
                self._blocked = self._blocked if self._failed else "the journal is closed"
            if stopped:  # otherwise the thread may still use the files
                for fd in (*self._retired, self._active_fd):
                    if fd >= 0:
                        self._files.close(fd)
                self._retired, self._active_fd = [], -1
        if not stopped:
            raise JournalError(
                f"the fsync thread did not finish in {_JOIN_TIMEOUT} s: records may not be durable"
            )
        if self._failed:
            self._refuse()
        if unwritten is not None:
            raise unwritten

    def _lost_on_close(self) -> JournalWriteError:
        error = self._write_error
        lost = JournalWriteError(
            f"closed with records {self._written_lsn + 1} to {self._next_lsn - 1}"
            f" ({self.waiting_bytes} bytes) never written to"
            f" {self._segments[self._active_base].path}: the disk refused them ({error}); no"
            " client was told they were kept (a RECEIPT waits for its records)"
        )
        lost.__cause__ = error
        return lost

    def _stop_thread(self) -> bool:
        if self._syncer is None:
            return True
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._syncer.join(_JOIN_TIMEOUT)
        return not self._syncer.is_alive()


def _zero_pages_at_end(offset: int, data: bytes) -> bool:
    """Whether `data`, at `offset` in its file, ends with zeros from a page boundary on."""
    nonzero = _NONZERO.search(data[::-1])
    if nonzero is None:
        return True
    zeros_from = offset + len(data) - nonzero.start()
    boundary = -(-zeros_from // _PAGE) * _PAGE
    return boundary < offset + len(data)


def _add_new(items: list[_T], item: _T) -> None:
    """Append unless present: a later pass over a damaged segment reports it once."""
    if item not in items:
        items.append(item)
