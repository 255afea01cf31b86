"""The write-ahead journal: append-only, segmented, checksummed.

Records are opaque bytes with a small integer type (0-255). Each gets a log sequence number (LSN):
1 for the first record ever, then one more per record, across segments.

The on-disk format, and how a segment is read back and checked, are in persist/segments.py;
recovery (what is cut, reported or refused after a crash or damage) in persist/recovering.py.

A failed write (ENOSPC, EDQUOT, EFBIG, EIO) is survived: whatever part of it reached the file
is cut off again (back to the end of the last record written whole), and its records stay
buffered, in order, at the offsets they were given; appends go on into the buffer, `flush` writes
nothing, and `retry_write` tries again (`write_error` says why the journal waits). No new
segment is started meanwhile: the buffered records belong to the active one. A failed fsync is
not survived (see `_fsync_failed`), nor a write whose partial bytes cannot be cut off.

Durability: under every policy a segment is fsynced before the next segment's file is created
(the new file and the directory are fsynced too), also when that happens at the next start, so a
later segment on disk proves every earlier one complete: a gap in the LSNs between segments is
corruption, never the trace of a crash. Under OS that is the only fsync of records: a process
crash loses nothing flushed, and a power cut only what the operating system had not written of
the newest segment.
"""

from __future__ import annotations

import enum
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Final, NoReturn

from sluiceway.persist.files import OS_FILES, Files
from sluiceway.persist.recovering import Recovering
from sluiceway.persist.segment_set import Active, SegmentSet
from sluiceway.persist.segments import (
    COMPACTED_HEADER,
    HEADER,
    LEN_CRC,
    LSN_TYPE,
    RECORD,
    Damage,
    JournalError,
    JournalWriteError,
    Position,
    Record,
    RecoveryReport,
    SegmentEntry,
    SegmentFile,
    SegmentInfo,
    bad_type,
    open_file,
    remove_file,
    write_all_parts,
)

_JOIN_TIMEOUT: Final = 30.0  # seconds close() waits for the fsync thread's last round


class SyncPolicy(enum.Enum):
    """When flushed records are made durable."""

    ALWAYS = "always"  # every flush is fsynced before flush() returns (in the caller's thread)
    GROUP = "group"  # a background thread fsyncs; flushes made during one fsync share the next
    OS = "os"  # fsync a segment only once it is full; the OS writes the rest when it likes


def _fsync_failed(what: object, error: OSError) -> str:
    # After a failed fsync the kernel may have dropped the dirty pages, and a retry could report
    # success for data that is gone: the journal stops for good.
    return (
        f"fsync of {what} failed ({error}): records may not be durable, so the journal accepts no"
        " more; restart the broker (recovery keeps every record that reached the disk)"
    )


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
        if segment_size < COMPACTED_HEADER.size + RECORD.size:
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
        self._reading: Recovering | None = None  # the recovery, once recover() ran
        self._files = files
        # The segment files, oldest first, the active one last.
        self._set = SegmentSet(
            self._directory,
            files,
            max_record_size=max_record_size,
            sync=self._sync_fd,
            fail=self._fail,
            skip=self._skip_damage,
        )
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
        reading = self._reading = Recovering(
            self._directory,
            self._files,
            self.report,
            self._sync_fd,
            sync_segments=self._sync is not SyncPolicy.OS,
            skip_corrupt=self._skip_corrupt,
            max_record_size=self._max_record_size,
        )
        yield from reading.records()
        self._set.entries = reading.segments
        self._next_lsn = reading.next_lsn
        self._written_lsn = self._synced_lsn = self._reported_lsn = self._next_lsn - 1
        self._open_active()
        self._blocked = None
        if self._sync is SyncPolicy.GROUP and self._sync_thread:
            name = f"journal-fsync {self._directory}"
            self._syncer = threading.Thread(target=self._sync_loop, name=name, daemon=True)
            self._syncer.start()

    def _open_active(self) -> None:
        """Rule 6: the last segment takes the appends unless it is full (or compacted)."""
        last = next(reversed(self._set.entries.values()), None)
        if last is not None and last.end is None and last.size < self._segment_size:
            if last.size >= HEADER.size:
                self._active_fd = open_file(self._files, last.path, os.O_RDWR | os.O_APPEND)
                self._active_base, self._end = last.base, last.size
                self._written_end = self._end
                return
            # A crash while it was created: its bytes are a prefix of the header written below.
            remove_file(self._files, last.path)
            del self._set.entries[last.base]
            last = next(reversed(self._set.entries.values()), None)
        if last is not None and self._sync is SyncPolicy.OS:
            # A later segment proves this one complete on disk, yet under OS nothing fsynced it:
            # a clean stop leaves it to the page cache, and so does a crash of the process.
            fd = open_file(self._files, last.path, os.O_RDONLY)
            try:
                self._sync_fd(fd, last.path)
            finally:
                self._files.close(fd)
        self._active_fd = self._set.create(self._next_lsn)
        self._active_base, self._end, self._written_end = self._next_lsn, HEADER.size, HEADER.size

    def segment_path(self, base: int) -> Path:
        """The file of the segment with base LSN `base` (whether or not it exists)."""
        return self._set.path(base)

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
            crc = zlib.crc32(payload, zlib.crc32(LSN_TYPE.pack(lsn, type)))
        except struct.error:
            raise bad_type(type) from None
        offset = self._end
        chunks = self._chunks
        chunks.append(RECORD.pack(size, crc, lsn, type))
        chunks.append(payload)
        self._end = offset + RECORD.size + size
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
                crc = zlib.crc32(payload, zlib.crc32(LSN_TYPE.pack(lsn, type)))
            except struct.error:
                raise bad_type(type) from None
            chunks += (RECORD.pack(size, crc, lsn, type), payload)
            end += RECORD.size + size
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
        # The records' headers and payloads go out as they are, in vectored writes: no copy of
        # the payloads (message bodies among them) into one buffer. They are kept until written:
        # a failed write leaves them, in order.
        lsn, size = self._next_lsn - 1, self._end - self._written_end
        try:
            write_all_parts(self._files, self._active_fd, self._chunks)
        except OSError as error:
            self._stall(size, error)
            return False
        self._chunks = []
        self._bytes_written += size
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
            self._sync_fd(self._active_fd, self._set.entries[self._active_base].path)
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
            offset += RECORD.size + LEN_CRC.unpack_from(data, offset)[0]
        self._chunks = [data[:offset]] if offset else []
        self._end, self._next_lsn = self._written_end + offset, lsn

    def _stall(self, size: int, error: OSError) -> None:
        """A write failed. Cut off what of it reached the file, so that the file ends with a
        whole record (else recovery would cut it as a torn tail, and a retry, appending, would
        leave it in the middle); the records then wait to be written at the offsets they have."""
        path = self._set.entries[self._active_base].path
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
            f" to {self._set.entries[self._active_base].path} since a write failed ({error}); free"
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
        self._sync_fd(self._active_fd, self._set.entries[self._active_base].path)
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
        if self._end == HEADER.size:
            return self._active_base
        old = self._set.entries[self._active_base]
        if self._sync is not SyncPolicy.ALWAYS:  # (which synced it in flush)
            self._sync_fd(self._active_fd, old.path)  # complete on disk before a later segment
        base = self._next_lsn
        try:
            fd = self._set.create(base)
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
        self._active_base, self._end, self._written_end = base, HEADER.size, HEADER.size
        return base

    def segments(self) -> list[SegmentInfo]:
        active = self._active_base
        return [
            SegmentInfo(s.base, s.path, self._end if s.base == active else s.size, s.base == active)
            for s in self._set.entries.values()
        ]

    def delete_segment(self, base_lsn: int) -> None:
        """Delete a non-active segment whose records are all dead (see SegmentSet.delete)."""
        self._set.delete(self._non_active(base_lsn))

    def rewrite_segment(self, base_lsn: int, keep: Callable[[Record], bool]) -> dict[int, Position]:
        """Compact a non-active segment to the records `keep` accepts; return their positions
        (see SegmentSet.rewrite)."""
        return self._set.rewrite(self._non_active(base_lsn), keep)

    def scan(self) -> Iterator[Record]:
        """Read every valid record on disk again, in LSN order (records not flushed are not)."""
        if self._blocked is not None and not self._failed:
            self._refuse()  # not recovered yet, or closed
        for segment in list(self._set.entries.values()):
            yield from self._set.records(segment)

    def _non_active(self, base: int) -> SegmentEntry:
        if self._blocked is not None:
            self._refuse()
        if base == self._active_base:
            raise JournalError(f"segment {base} is the active segment; rotate() first")
        if base not in self._set.entries:
            raise JournalError(f"no segment has base LSN {base}; segments() lists them")
        return self._set.entries[base]

    def read(self, position: Position) -> Record:
        """The record at `position`, read with pread and checked against its CRC."""
        if self._closed:
            raise JournalError("the journal is closed")
        return self._set.read(position, self._active())

    def read_many(self, base: int, lsns: Sequence[int], offsets: Sequence[int]) -> Iterator[Record]:
        """The records `lsns` of segment `base`, at `offsets` (in file order), each checked as
        `read` checks it (see SegmentSet.read_many)."""
        if self._closed:
            raise JournalError("the journal is closed")
        return self._set.read_many(base, lsns, offsets, self._active())

    def _active(self) -> Active:
        return Active(self._active_base, self._active_fd, self._written_end)

    # -- durability ----------------------------------------------------------------------------

    def _sync_fd(self, fd: int, path: Path) -> None:
        try:
            self.fsync(fd)
        except OSError as error:
            failure = self._fail(_fsync_failed(path, error), error)
            failure.__cause__ = error  # set, not `raise from`: compiled code ignores `from`
            raise failure  # noqa: B904  (the cause is set on the line above)

    def _skip_damage(self, reader: SegmentFile, damage: Damage) -> None:
        """Damage in a segment read again: refused or skipped, as recovery does it."""
        assert self._reading is not None  # (reading a segment again needs recover() first)
        self._reading.skip(reader, damage)

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
            f" {self._set.entries[self._active_base].path}: the disk refused them ({error}); no"
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
