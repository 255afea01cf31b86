"""The journal's segment files: which exist, creating one, reading one's records back,
deleting and compacting the old ones (their format is in persist/segments.py).

Every change is durable when it returns, and a crash in the middle leaves the old state or the
new one: a new segment's header and the directory are fsynced before it is used; a segment
emptied or compacted is copied, the copy fsynced and renamed over it, the directory fsynced; a
deleted one is gone once the directory is fsynced.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from sluiceway.persist.files import Files
from sluiceway.persist.segments import (
    CHUNK,
    COMPACTED_HEADER,
    COMPACTED_VERSION,
    HEADER,
    LEN_CRC,
    LSN_TYPE,
    MAGIC,
    RECORD,
    TEMP_SUFFIX,
    VERSION,
    Damage,
    JournalError,
    JournalWriteError,
    Position,
    Record,
    SegmentEntry,
    SegmentFile,
    checksum,
    open_file,
    pread,
    write_all,
)

Sync = Callable[[int, Path], None]  # fsync a descriptor (its path for the message), or raise
Fail = Callable[[str, BaseException], JournalError]  # stop the journal for good
Skip = Callable[[SegmentFile, Damage], None]  # damage in a complete segment: raise, or skip it


@dataclass(frozen=True, slots=True)
class Active:
    """The segment appends go to: its base LSN, descriptor, and how far it is written."""

    base: int
    fd: int
    written_end: int


class SegmentSet:
    """The segment files of one journal directory, by base LSN, oldest first."""

    def __init__(
        self,
        directory: Path,
        files: Files,
        *,
        max_record_size: int,
        sync: Sync,
        fail: Fail,
        skip: Skip,
    ) -> None:
        self.directory, self._files, self._max_record_size = directory, files, max_record_size
        self._sync, self._fail, self._skip = sync, fail, skip
        self.entries: dict[int, SegmentEntry] = {}

    def path(self, base: int) -> Path:
        """The file of the segment with base LSN `base` (whether or not it exists)."""
        return self.directory / f"{base:020d}.log"

    def sync_dir(self) -> None:
        fd = open_file(self._files, self.directory, os.O_RDONLY)
        try:
            self._sync(fd, self.directory)
        finally:
            self._files.close(fd)

    def create(self, base: int) -> int:
        """Create the segment `base` (its header fsynced, and the directory): its descriptor.
        A disk that refuses it leaves no file behind (JournalWriteError)."""
        path = self.path(base)
        fd = open_file(self._files, path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND)
        try:
            write_all(self._files, fd, HEADER.pack(MAGIC, VERSION, base))
            self._sync(fd, path)
            self.sync_dir()  # the file's existence is durable too
        except BaseException as error:
            self._files.close(fd)
            if not isinstance(error, OSError):
                raise
            self._drop_new(path, error)
            refused = JournalWriteError(f"cannot create segment {path}: {error}")
            refused.__cause__ = error  # set, not `raise from`: compiled code ignores `from`
            raise refused  # noqa: B904  (the cause is set on the line above)
        self.entries[base] = SegmentEntry(base, path, HEADER.size)
        return fd

    def _drop_new(self, path: Path, error: OSError) -> None:
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
        self.sync_dir()  # (a failed fsync stops the journal: it says so)

    def delete(self, segment: SegmentEntry) -> None:
        """Delete a segment whose records are all dead (not the active one).

        Only the oldest file goes: a file missing in the middle reads as lost data on recovery
        ("a gap between complete segments is corruption"). A later segment is emptied instead
        (compacted, 24 bytes) and removed once it is the oldest.
        """
        if segment.base != next(iter(self.entries)):
            if segment.end is None or segment.size > COMPACTED_HEADER.size:  # not emptied yet
                self.rewrite(segment, lambda _record: False)
            return
        self._remove(segment)
        for later in list(self.entries.values()):
            if later.end is None or later.size > COMPACTED_HEADER.size:
                break
            self._remove(later)
        self.sync_dir()

    def _remove(self, segment: SegmentEntry) -> None:
        try:
            self._files.remove(segment.path)
        except OSError as error:
            raise JournalError(f"cannot delete segment {segment.path}: {error}") from error
        del self.entries[segment.base]

    def rewrite(self, segment: SegmentEntry, keep: Callable[[Record], bool]) -> dict[int, Position]:
        """Compact a segment (not the active one) to the records `keep` accepts; return their
        positions.

        They keep their LSNs and types. The copy is fsynced, renamed over the segment, then the
        directory is fsynced: a crash at any moment leaves the old file or the new one.
        """
        bases = list(self.entries)
        end = bases[bases.index(segment.base) + 1]
        temp = segment.path.with_name(segment.path.name + TEMP_SUFFIX)
        fd = open_file(self._files, temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            positions, size = self._copy_kept(segment, end, keep, fd)
            self._sync(fd, temp)
        except BaseException as error:
            self._files.close(fd)
            with contextlib.suppress(FileNotFoundError):
                self._files.remove(temp)
            if isinstance(error, OSError):  # the segment is untouched: free space and retry
                raise JournalError(f"cannot compact {segment.path}: {error}") from error
            raise
        self._files.close(fd)
        self._files.replace(temp, segment.path)
        self.sync_dir()
        segment.size, segment.end = size, end
        return positions

    def _copy_kept(
        self, segment: SegmentEntry, end: int, keep: Callable[[Record], bool], out: int
    ) -> tuple[dict[int, Position], int]:
        chunks = [COMPACTED_HEADER.pack(MAGIC, COMPACTED_VERSION, segment.base, end)]
        size = pending = COMPACTED_HEADER.size
        positions: dict[int, Position] = {}
        for record in self.records(segment):
            if keep(record):
                lsn, payload = record.position.lsn, record.payload
                positions[lsn] = Position(lsn, segment.base, size)
                tail = LSN_TYPE.pack(lsn, record.type)
                chunks += (LEN_CRC.pack(len(payload), checksum(tail, payload)), tail, payload)
                size, pending = size + RECORD.size + len(payload), pending + len(payload)
            if pending >= CHUNK:
                write_all(self._files, out, b"".join(chunks))
                chunks, pending = [], 0
        write_all(self._files, out, b"".join(chunks))
        return positions, size

    def records(self, segment: SegmentEntry) -> Iterator[Record]:
        """The valid records of a complete segment, in order (damage: see `skip`)."""
        fd = open_file(self._files, segment.path, os.O_RDONLY)
        try:
            reader = SegmentFile(self._files, fd, segment.path, segment.base, self._max_record_size)
            reader.read_header()
            for item in reader.records(segment.base - 1):
                if isinstance(item, Damage):
                    self._skip(reader, item)  # a complete segment has no torn tail
                else:
                    yield item
        finally:
            self._files.close(fd)

    def read(self, position: Position, active: Active) -> Record:
        """The record at `position`, read with pread and checked against its CRC."""
        base, offset, segment = (
            position.segment,
            position.offset,
            self.entries.get(position.segment),
        )
        if segment is None:
            raise JournalError(f"no segment has base LSN {base}: it was deleted")
        if base == active.base and offset >= active.written_end:
            raise JournalError(f"record {position.lsn} is not flushed yet; flush() before reading")
        is_active = base == active.base
        fd = active.fd if is_active else open_file(self._files, segment.path, os.O_RDONLY)
        try:
            header = pread(self._files, fd, RECORD.size, offset)
            length, crc, lsn, kind = RECORD.unpack(header.ljust(RECORD.size, b"\0"))
            if lsn == position.lsn and length <= self._max_record_size:
                payload = pread(self._files, fd, length, offset + RECORD.size)
                if len(payload) == length and checksum(header[LEN_CRC.size :], payload) == crc:
                    return Record(position, kind, payload)
        finally:
            if not is_active:
                self._files.close(fd)
        raise JournalError(
            f"no valid record {position.lsn} at offset {offset} of {segment.path}: the bytes are"
            " damaged, or the segment was rewritten since (use the positions rewrite returned)"
        )

    def read_many(
        self, base: int, lsns: Sequence[int], offsets: Sequence[int], active: Active
    ) -> Iterator[Record]:
        """The records `lsns` of segment `base`, at `offsets` (in file order): each checked
        against its CRC, as `read` does, and all read through one read-ahead buffer, so that
        going over many of them costs one pread per megabyte rather than two per record
        (recovery's second pass)."""
        segment = self.entries.get(base)
        if segment is None:
            raise JournalError(f"no segment has base LSN {base}: it was deleted")
        fd = open_file(self._files, segment.path, os.O_RDONLY)
        try:
            reader = SegmentFile(self._files, fd, segment.path, base, self._max_record_size)
            for lsn, offset in zip(lsns, offsets, strict=True):
                record = reader.parse(offset, lsn)
                if record is None or (base == active.base and offset >= active.written_end):
                    raise JournalError(
                        f"no valid record {lsn} at offset {offset} of {segment.path}: the bytes"
                        " are damaged, or the segment was rewritten since"
                    )
                yield record
        finally:
            self._files.close(fd)
