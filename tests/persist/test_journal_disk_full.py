"""A journal whose writes fail (a full disk, an I/O error), on the simulated disk.

A failed write is survived: nothing partial stays in the segment (it ends with a whole record,
so recovery cuts nothing), the records that were not written wait in memory in LSN order and are
written by a retry once the disk takes them, and the journal creates no segment meanwhile. A
failed fsync is still the end of the journal.
"""

from __future__ import annotations

import errno
import random
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluiceway.persist.journal import Journal, SyncPolicy
from sluiceway.persist.segments import JournalError, JournalWriteError
from sluiceway.persist.simulated import SimulatedDisk

DIRECTORY = Path("/data/journal")
SEGMENT = DIRECTORY / f"{1:020d}.log"
HEADER = 16  # segment header, bytes
RECORD = 17  # record header, bytes
ENOSPC = OSError(errno.ENOSPC, "No space left on device")
EIO = OSError(errno.EIO, "Input/output error")


def open_journal(
    disk: SimulatedDisk, policy: SyncPolicy = SyncPolicy.OS, segment_size: int = 1 << 20
) -> tuple[Journal, list[bytes]]:
    journal = Journal(
        DIRECTORY, segment_size=segment_size, sync=policy, files=disk, sync_thread=False
    )
    return journal, [record.payload for record in journal.recover()]


def reopened(disk: SimulatedDisk) -> tuple[list[bytes], int]:
    """After a process crash: the records recovery reads, and the torn bytes it cut."""
    disk.crash(random.Random(0), power=False)
    journal, records = open_journal(disk)
    torn = journal.report.torn_bytes
    journal.close()
    return records, torn


def whole_records(data: bytes) -> int:
    """How many records a segment's bytes hold, asserting they end with a whole one."""
    offset, count = HEADER, 0
    while offset < len(data):
        (length,) = struct.unpack_from("<I", data, offset)
        offset += RECORD + length
        count += 1
    assert offset == len(data), "the segment ends with a partial record"
    return count


def test_a_full_disk_mid_flush_leaves_no_partial_record_and_loses_none() -> None:
    disk = SimulatedDisk()
    journal, _ = open_journal(disk)
    journal.append(1, b"first")
    journal.flush()
    # Room for part of the next write only: a short write, then ENOSPC.
    disk.capacity = disk.used() + 30
    for n in range(3):
        journal.append(1, b"record %d" % n)
    assert journal.flush() == 1
    assert journal.write_error is not None
    assert journal.write_error.errno == errno.ENOSPC
    assert whole_records(disk.files(DIRECTORY)[SEGMENT.name]) == 1
    assert journal.written_lsn == journal.synced_lsn == 1
    assert journal.waiting_bytes == 3 * (RECORD + 8)
    # Appends go on into memory, after the records that wait; nothing is written meanwhile.
    journal.append(1, b"later")
    assert journal.flush() == 1
    assert not journal.retry_write()  # still full: refused again, and cut again
    assert whole_records(disk.files(DIRECTORY)[SEGMENT.name]) == 1
    disk.capacity = None
    assert journal.retry_write()
    assert journal.waiting_bytes == 0
    assert journal.written_lsn == journal.synced_lsn == 5
    journal.close()
    records, torn = reopened(disk)
    assert records == [b"first", b"record 0", b"record 1", b"record 2", b"later"]
    assert torn == 0


def test_an_io_error_on_write_is_survived_like_a_full_disk() -> None:
    disk = SimulatedDisk()
    journal, _ = open_journal(disk, SyncPolicy.ALWAYS)
    journal.append(1, b"a")
    journal.flush()
    disk.fault = lambda operation, path: EIO if operation == "write" else None
    journal.append(1, b"b")
    journal.flush()
    assert journal.write_error is EIO
    assert journal.synced_lsn == 1  # a RECEIPT waiting for "b" keeps waiting
    disk.fault = None
    assert journal.retry_write()
    assert journal.synced_lsn == 2  # written, and fsynced under ALWAYS
    journal.close()
    assert reopened(disk) == ([b"a", b"b"], 0)


def test_a_failed_fsync_still_stops_the_journal() -> None:
    disk = SimulatedDisk()
    journal, _ = open_journal(disk, SyncPolicy.GROUP)
    journal.append(1, b"a")
    journal.flush()
    disk.fault = lambda operation, path: EIO if operation == "fsync" else None
    assert not journal.sync_round()  # the round fails: the page cache may have dropped "a"
    assert journal.failure is not None
    assert "fsync" in journal.failure
    disk.fault = None
    with pytest.raises(JournalError, match=r"fsync .* failed .* accepts no more"):
        journal.append(1, b"b")
    with pytest.raises(JournalError, match="fsync"):
        journal.retry_write()  # no retry makes a failed fsync good
    with pytest.raises(JournalError, match="fsync"):
        journal.close()


def test_a_failed_write_that_cannot_be_cut_off_stops_the_journal() -> None:
    disk = SimulatedDisk()
    journal, _ = open_journal(disk)
    journal.append(1, b"a")
    journal.flush()
    disk.capacity = disk.used() + 5

    def fault(operation: str, path: Path) -> OSError | None:
        return EIO if operation == "truncate" else None

    disk.fault = fault
    journal.append(1, b"bbbbbbbbbb")
    with pytest.raises(JournalError, match=r"cutting off what it wrote failed too"):
        journal.flush()
    assert journal.failure is not None
    with pytest.raises(JournalError, match="partial record"):
        journal.append(1, b"c")
    disk.fault, disk.capacity = None, None
    with pytest.raises(JournalError):
        journal.close()
    records, torn = reopened(disk)
    assert records == [b"a"]  # recovery cuts the partial record off
    assert torn == 5


def test_no_segment_is_started_while_records_wait() -> None:
    disk = SimulatedDisk()
    journal, _ = open_journal(disk)
    journal.append(1, b"a")
    disk.capacity = disk.used()
    journal.flush()
    assert journal.write_error is not None
    with pytest.raises(JournalWriteError, match=r"cannot start a new segment: 18 bytes .* wait"):
        journal.rotate()
    assert list(disk.files(DIRECTORY)) == [SEGMENT.name]
    disk.capacity = None
    assert journal.retry_write()
    assert journal.rotate() == 2
    journal.append(1, b"b")
    journal.close()
    assert reopened(disk) == ([b"a", b"b"], 0)


def test_a_segment_that_cannot_be_created_leaves_the_active_one() -> None:
    disk = SimulatedDisk()
    journal, _ = open_journal(disk, SyncPolicy.GROUP)
    journal.append(1, b"a")
    journal.flush()
    disk.capacity = disk.used() + 10  # room for part of a header: the new file is removed
    with pytest.raises(JournalWriteError, match=r"cannot create segment .*2\.log"):
        journal.rotate()
    assert list(disk.files(DIRECTORY)) == [SEGMENT.name]
    assert journal.write_error is not None
    journal.append(1, b"b")  # into the active segment, waiting like after a failed write
    journal.flush()
    assert journal.written_lsn == 1
    disk.capacity = None
    assert journal.retry_write()
    assert journal.rotate() == 3  # the active segment holds "a" and "b"
    journal.append(1, b"c")
    journal.close()
    assert reopened(disk) == ([b"a", b"b", b"c"], 0)
    assert sorted(disk.files(DIRECTORY)) == [SEGMENT.name, f"{3:020d}.log"]


@pytest.mark.parametrize("seed", range(12))
def test_the_file_of_a_segment_that_could_not_be_created_stays_gone_after_a_power_cut(
    seed: int,
) -> None:
    """Its records go to the old segment under the LSNs the new one would have started at: a
    file of that name back after a power cut would overlap them, and stop recovery."""
    disk = SimulatedDisk()
    journal, _ = open_journal(disk, SyncPolicy.ALWAYS)
    journal.append(1, b"a")
    journal.flush()
    disk.capacity = disk.used() + 10
    with pytest.raises(JournalWriteError):
        journal.rotate()
    disk.capacity = None
    assert journal.retry_write()
    journal.append(1, b"b")  # LSN 2, in segment 1: the base the new segment would have had
    journal.flush()
    disk.crash(random.Random(seed), power=True)
    journal, records = open_journal(disk, SyncPolicy.ALWAYS)
    assert records == [b"a", b"b"]
    journal.close()


def test_a_unit_refused_by_the_disk_can_be_taken_back() -> None:
    disk = SimulatedDisk()
    journal, _ = open_journal(disk)
    journal.append(1, b"written")
    journal.flush()
    disk.capacity = disk.used() + 20
    journal.append(1, b"before the unit")  # waits with it, and stays
    first = journal.add_all([(2, b"tx"), (1, b"one"), (1, b"two")])
    journal.flush()
    assert journal.write_error is not None
    journal.take_back(first)
    assert journal.next_lsn == first == 3
    with pytest.raises(JournalError, match=r"only unwritten ones can \(2 to 2\)"):
        journal.take_back(1)
    journal.append(1, b"after")  # takes the LSN the unit had
    disk.capacity = None
    assert journal.retry_write()
    journal.close()
    assert reopened(disk) == ([b"written", b"before the unit", b"after"], 0)


def test_closing_tries_once_more_then_says_what_was_not_written() -> None:
    disk = SimulatedDisk()
    journal, _ = open_journal(disk)
    journal.append(1, b"a")
    journal.flush()
    disk.capacity = disk.used()
    journal.append(1, b"b")
    journal.append(1, b"c")
    journal.flush()
    with pytest.raises(JournalWriteError, match=r"records 2 to 3 \(36 bytes\) never written"):
        journal.close()
    assert reopened(disk) == ([b"a"], 0)


def test_closing_writes_what_waited_when_the_disk_takes_it_again() -> None:
    disk = SimulatedDisk()
    journal, _ = open_journal(disk)
    disk.capacity = disk.used()
    journal.append(1, b"a")
    journal.flush()
    disk.capacity = None
    journal.close()
    assert reopened(disk) == ([b"a"], 0)


@settings(max_examples=300, deadline=None)
@given(
    policy=st.sampled_from(SyncPolicy),
    steps=st.lists(
        st.tuples(
            st.sampled_from(["append", "flush", "rotate", "fill", "free"]), st.integers(0, 90)
        ),
        min_size=1,
        max_size=50,
    ),
)
def test_a_disk_that_fills_and_empties_at_random_keeps_every_record_in_order(
    policy: SyncPolicy, steps: list[tuple[str, int]]
) -> None:
    """Whenever the disk is full: every segment ends with a whole record, and the records on
    disk are those up to written_lsn; at the end, with room, every record is there, in order."""
    disk = SimulatedDisk()
    journal, _ = open_journal(disk, policy, segment_size=200)
    appended: list[bytes] = []
    for step, size in steps:
        if step == "append":
            appended.append(b"%d:" % journal.next_lsn + b"." * size)
            journal.append(1, appended[-1])
        elif step == "flush":
            journal.flush()
        elif step == "rotate":
            try:
                journal.rotate()
            except JournalWriteError:
                assert journal.write_error is not None
        elif step == "fill":
            disk.capacity = disk.used() + size  # room for `size` bytes more
        else:
            disk.capacity = None
            journal.retry_write()
        journal.sync_round()
        on_disk = sum(whole_records(data) for data in disk.files(DIRECTORY).values())
        assert on_disk == journal.written_lsn
    disk.capacity = None
    journal.close()
    records, torn = reopened(disk)
    assert records == appended
    assert torn == 0
