"""Recovery of a journal directory: its segments read in order, what a crash left cut, damage
reported or refused.

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
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import TypeVar

from sluiceway.persist.files import Files
from sluiceway.persist.segments import (
    CHUNK,
    HEADER,
    NAME,
    TEMP_SUFFIX,
    CorruptJournal,
    Damage,
    JournalError,
    Record,
    RecoveryReport,
    SegmentEntry,
    SegmentFile,
    open_file,
    pread,
    remove_file,
    write_all,
)

_T = TypeVar("_T")
Sync = Callable[[int, Path], None]  # fsync a descriptor (its path for the message), or raise


class Recovering:
    """One recovery of the journal in `directory` (see the module docstring): `records()` yields
    every valid record in LSN order; then `segments` and `next_lsn` are what the journal goes on
    from. `sync` fsyncs a file or directory (and fails the journal if that fails); with
    `sync_segments`, every segment read is fsynced too (what a run under the os policy wrote is
    durable from then on)."""

    def __init__(
        self,
        directory: Path,
        files: Files,
        report: RecoveryReport,
        sync: Sync,
        *,
        sync_segments: bool,
        skip_corrupt: bool,
        max_record_size: int,
    ) -> None:
        self._directory, self._files, self.report = directory, files, report
        self._sync, self._sync_segments = sync, sync_segments
        self._skip_corrupt, self._max_record_size = skip_corrupt, max_record_size
        self.segments: dict[int, SegmentEntry] = {}  # by base LSN, oldest first
        self.next_lsn = 1

    def records(self) -> Iterator[Record]:
        found = self._list_directory()
        expected: int | None = None  # the base LSN the next segment must have
        for index, (base, path) in enumerate(found):
            if expected is not None and base != expected:
                self._lsn_jump(path, expected, base)
            expected = yield from self._recover_segment(base, path, last=index + 1 == len(found))
        self.next_lsn = 1 if expected is None else expected

    def _sync_dir(self, path: Path) -> None:
        fd = open_file(self._files, path, os.O_RDONLY)
        try:
            self._sync(fd, path)
        finally:
            self._files.close(fd)

    def _list_directory(self) -> list[tuple[int, Path]]:
        try:
            names = self._files.names(self._directory)
        except OSError as error:
            raise JournalError(
                f"cannot open journal directory {self._directory}: {error}"
            ) from error
        found: list[tuple[int, Path]] = []
        for name in names:
            if NAME.fullmatch(name):
                found.append((int(name[:20]), self._directory / name))
            elif NAME.fullmatch(name.removesuffix(TEMP_SUFFIX)):
                # An interrupted compaction: "a crash at any moment leaves either the old or the
                # new file", and this is neither; the old segment is intact.
                remove_file(self._files, self._directory / name)
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
        fd = open_file(self._files, path, os.O_RDWR)
        try:
            segment = SegmentFile(self._files, fd, path, base, self._max_record_size)
            segment.read_header()
            self.report.segments += 1
            if segment.header_cut is not None:
                self._header_cut(segment, last=last)
            end, size = base, segment.size
            for item in segment.records(base - 1):
                if isinstance(item, Damage):
                    if item.resume is None and segment.end is None and last:
                        size = self._cut_tail(segment, item.offset, end - 1)
                        break
                    self.skip(segment, item)
                    continue
                if item.position.lsn != end and segment.end is None:
                    self.report.lsn_gaps.append((end - 1, item.position.lsn))
                end = item.position.lsn + 1
                self.report.records += 1
                yield item
            if self._sync_segments:
                self._sync(fd, path)  # what an earlier run under OS wrote is durable from now
        finally:
            self._files.close(fd)
        self.segments[base] = SegmentEntry(base, path, size, segment.end)
        return end if segment.end is None else segment.end

    def _header_cut(self, segment: SegmentFile, *, last: bool) -> None:
        """The file ends inside its header: a crash while it was created, if it is the last."""
        if last:
            self.report.headers_cut.append((segment.path, segment.size))
            return
        problem = (
            f"it ends inside its {HEADER.size}-byte header ({segment.size} bytes), yet a later "
            "segment exists, so it was complete on disk once: whatever it held is lost"
        )
        if not self._skip_corrupt:
            raise CorruptJournal(segment.path, 0, problem)
        add_new(self.report.skipped, (segment.path, 0, segment.size))

    def _cut_tail(self, segment: SegmentFile, offset: int, last_lsn: int) -> int:
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
            add_new(self.report.skipped, (segment.path, offset, length))
        self._save_aside(segment.fd, segment.path, offset, length)
        self._files.truncate(segment.fd, offset)
        self._sync(segment.fd, segment.path)
        if damaged is None:
            self.report.torn_bytes += length
            self.report.torn.append((segment.path, offset, length))
        return offset

    def skip(self, segment: SegmentFile, damage: Damage) -> None:
        if not self._skip_corrupt:
            after = (
                "nothing valid follows, yet the segment was complete on disk (it was compacted, "
                "or a later segment exists)"
                if damage.resume is None
                else f"a valid record follows at offset {damage.resume}"
            )
            raise CorruptJournal(segment.path, damage.offset, f"an invalid record, and {after}")
        self._save_aside(segment.fd, segment.path, damage.offset, damage.length)
        add_new(self.report.skipped, (segment.path, damage.offset, damage.length))

    def _save_aside(self, fd: int, path: Path, offset: int, length: int) -> None:
        """Rule 5: copy bytes to discarded/ and fsync them before they are cut or skipped."""
        folder = self._directory / "discarded"
        if not self._files.exists(folder):
            self._files.make_directory(folder)
            self._sync_dir(self._directory)
        target, n = folder / f"{path.name}.{offset}.bytes", 0
        while self._files.exists(target):
            if self._same_bytes(target, fd, offset, length):  # saved by an earlier recovery
                add_new(self.report.saved, target)
                return
            n += 1
            target = folder / f"{path.name}.{offset}.{n}.bytes"
        out = open_file(self._files, target, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            for start in range(offset, offset + length, CHUNK):
                size = min(CHUNK, offset + length - start)
                write_all(self._files, out, pread(self._files, fd, size, start))
            self._sync(out, target)
        finally:
            self._files.close(out)
        self._sync_dir(folder)
        add_new(self.report.saved, target)

    def _same_bytes(self, path: Path, fd: int, offset: int, length: int) -> bool:
        """Whether the file at `path` holds exactly the `length` bytes of `fd` at `offset`."""
        files = self._files
        saved = open_file(files, path, os.O_RDONLY)
        try:
            return files.size(saved) == length and all(
                pread(files, saved, n, start - offset) == pread(files, fd, n, start)
                for start in range(offset, offset + length, CHUNK)
                if (n := min(CHUNK, offset + length - start))
            )
        finally:
            files.close(saved)


def add_new(items: list[_T], item: _T) -> None:
    """Append unless present: a later pass over a damaged segment reports it once."""
    if item not in items:
        items.append(item)
