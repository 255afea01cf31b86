"""The journal: on-disk format, appending, segments, compaction, reading and sync policies."""

from __future__ import annotations

import contextlib
import errno
import os
import random
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sluiceway.persist.journal import Journal, SyncPolicy
from sluiceway.persist.segments import CorruptJournal, JournalError, Position, Record
from tests.e2e.support import wait_until

WAIT = 10.0  # seconds any wait on the fsync thread may take before the test fails


class Journals:
    """Opens journals for a test and closes those still open when it ends."""

    def __init__(self) -> None:
        self.opened: list[Journal] = []

    def open(
        self,
        directory: Path,
        *,
        sync: SyncPolicy = SyncPolicy.OS,
        segment_size: int = 64 * 1024 * 1024,
        on_synced: Callable[[int], None] | None = None,
        max_record_size: int = 128 * 1024 * 1024,
        sync_delay: float = 0.0,
    ) -> tuple[Journal, list[Record]]:
        journal = Journal(
            directory,
            sync=sync,
            segment_size=segment_size,
            on_synced=on_synced,
            max_record_size=max_record_size,
            sync_delay=sync_delay,
        )
        self.opened.append(journal)
        return journal, list(journal.recover())


@pytest.fixture
def journals() -> Iterator[Journals]:
    opened = Journals()
    yield opened
    for journal in opened.opened:
        # a test that failed its journal has already checked what close() says
        with contextlib.suppress(JournalError):
            journal.close()


def triples(records: list[Record]) -> list[tuple[int, int, bytes]]:
    return [(r.position.lsn, r.type, r.payload) for r in records]


def segment_name(base: int) -> str:
    return f"{base:020d}.log"


# -- format -------------------------------------------------------------------------------------


def test_segment_header_and_record_bytes(tmp_path: Path, journals: Journals) -> None:
    journal, _ = journals.open(tmp_path)
    first = journal.append(7, b"hello")
    second = journal.append(255, b"")
    journal.close()
    data = (tmp_path / "00000000000000000001.log").read_bytes()
    # magic, u32 version 1, u64 base LSN 1, little-endian
    assert data[:16] == b"SWJ1" + b"\x01\x00\x00\x00" + b"\x01" + b"\x00" * 7
    lsn_type = (1).to_bytes(8, "little") + bytes([7])
    crc = zlib.crc32(lsn_type + b"hello").to_bytes(4, "little")
    assert data[16:38] == (5).to_bytes(4, "little") + crc + lsn_type + b"hello"
    lsn_type = (2).to_bytes(8, "little") + bytes([255])
    crc = zlib.crc32(lsn_type).to_bytes(4, "little")
    assert data[38:] == (0).to_bytes(4, "little") + crc + lsn_type
    assert first == Position(lsn=1, segment=1, offset=16)
    assert second == Position(lsn=2, segment=1, offset=38)


def test_add_is_append_returning_the_lsn(tmp_path: Path, journals: Journals) -> None:
    journal, _ = journals.open(tmp_path)
    assert journal.add(7, b"hello") == 1
    assert journal.append(8, b"world") == Position(lsn=2, segment=1, offset=16 + 22)
    assert journal.add(9, b"") == 3
    journal.flush()
    assert triples(list(journal.scan())) == [(1, 7, b"hello"), (2, 8, b"world"), (3, 9, b"")]


def test_fresh_directory_is_created_with_one_empty_segment(
    tmp_path: Path, journals: Journals
) -> None:
    directory = tmp_path / "a" / "journal"
    journal, records = journals.open(directory)
    assert records == []
    assert journal.next_lsn == 1
    assert journal.flush() == 0  # nothing was ever written
    assert [(s.base_lsn, s.size, s.active) for s in journal.segments()] == [(1, 16, True)]
    assert sorted(os.listdir(directory)) == [segment_name(1)]


# -- appending and recovering -------------------------------------------------------------------


def fill(journal: Journal, count: int, rng: random.Random) -> list[tuple[Position, int, bytes]]:
    """Append `count` random records, rotating as a caller would; return what was appended."""
    appended = []
    for _ in range(count):
        payload = rng.randbytes(rng.randrange(0, 90))
        kind = rng.randrange(256)
        appended.append((journal.append(kind, payload), kind, payload))
        if journal.should_rotate:
            journal.rotate()
    return appended


def test_round_trip_across_segments(tmp_path: Path, journals: Journals) -> None:
    rng = random.Random(1)
    journal, _ = journals.open(tmp_path, segment_size=300)
    appended = fill(journal, 200, rng)
    assert [p.lsn for p, _, _ in appended] == list(range(1, 201))
    assert journal.flush() == 200
    bases = [s.base_lsn for s in journal.segments()]
    assert len(bases) > 10
    journal.close()

    journal, records = journals.open(tmp_path, segment_size=300)
    assert [(r.position, r.type, r.payload) for r in records] == appended
    assert journal.report.records == 200
    assert journal.report.segments == len(bases)
    assert journal.report.torn_bytes == 0
    assert journal.report.saved == []
    assert [s.base_lsn for s in journal.segments()][: len(bases)] == bases
    assert journal.next_lsn == 201
    # LSNs continue where recovery stopped
    assert journal.append(1, b"next").lsn == 201


def test_segment_files_are_named_by_their_first_lsn(tmp_path: Path, journals: Journals) -> None:
    journal, _ = journals.open(tmp_path, segment_size=100)
    appended = fill(journal, 40, random.Random(2))
    appended.append((journal.append(0, b"last"), 0, b"last"))  # the active one is not empty
    journal.close()
    firsts: dict[int, int] = {}
    for position, _, _ in appended:
        firsts.setdefault(position.segment, position.lsn)
    assert all(base == lsn for base, lsn in firsts.items())
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [segment_name(base) for base in sorted(firsts)]


def test_rotate(tmp_path: Path, journals: Journals) -> None:
    journal, _ = journals.open(tmp_path, segment_size=1000)
    journal.append(1, b"a" * 10)
    buffered_before = journal.buffered
    assert journal.rotate() == 2  # flushes first
    assert (buffered_before, journal.buffered) == (True, False)
    assert journal.written_lsn == 1
    # an active segment with no record yet is kept
    assert journal.rotate() == 2
    assert journal.append(1, b"b").segment == 2
    assert [(s.base_lsn, s.active) for s in journal.segments()] == [(1, False), (2, True)]
    assert (tmp_path / segment_name(2)).read_bytes()[:16] == b"SWJ1\x01\0\0\0\x02" + b"\0" * 7


def test_should_rotate_counts_buffered_records(tmp_path: Path, journals: Journals) -> None:
    journal, _ = journals.open(tmp_path, segment_size=100)
    journal.append(0, b"x" * 60)
    full_before = journal.should_rotate  # 16 + 17 + 60 bytes
    journal.append(0, b"")
    assert (full_before, journal.should_rotate) == (False, True)  # 110 bytes, none flushed
    assert journal.segments()[0].size == 110
    # appends never rotate by themselves
    journal.append(0, b"more")
    assert len(journal.segments()) == 1


def test_last_segment_full_on_recovery_starts_a_new_one(tmp_path: Path, journals: Journals) -> None:
    journal, _ = journals.open(tmp_path, segment_size=100)
    journal.append(0, b"x" * 90)
    journal.close()
    journal, _ = journals.open(tmp_path, segment_size=100)
    assert [(s.base_lsn, s.active) for s in journal.segments()] == [(1, False), (2, True)]
    assert journal.append(0, b"y").segment == 2


def test_last_segment_with_room_keeps_the_appends(tmp_path: Path, journals: Journals) -> None:
    journal, _ = journals.open(tmp_path)
    journal.append(0, b"x")
    journal.close()
    journal, _ = journals.open(tmp_path)
    assert journal.append(0, b"y") == Position(2, 1, 16 + 18)
    journal.close()
    _, records = journals.open(tmp_path)
    assert triples(records) == [(1, 0, b"x"), (2, 0, b"y")]


def test_append_before_recovery_and_recover_twice(tmp_path: Path, journals: Journals) -> None:
    journal = Journal(tmp_path, sync=SyncPolicy.OS)
    with pytest.raises(JournalError, match="recover"):
        journal.append(0, b"x")
    journals.opened.append(journal)
    list(journal.recover())
    with pytest.raises(JournalError, match="already"):
        journal.recover()


def test_max_record_size(tmp_path: Path, journals: Journals) -> None:
    journal, _ = journals.open(tmp_path, max_record_size=10)
    with pytest.raises(JournalError, match=r"11 bytes exceeds max_record_size \(10 bytes\)"):
        journal.append(0, b"x" * 11)
    assert journal.append(0, b"x" * 10).lsn == 1  # the refused record took no LSN
    journal.close()
    # a record over the limit a reader is given is not taken for a torn write
    with pytest.raises(CorruptJournal, match=r"\(LSN 1, type 0, 10 bytes\) is larger than max_"):
        journals.open(tmp_path, max_record_size=5)


def test_record_type_out_of_range(tmp_path: Path, journals: Journals) -> None:
    journal, _ = journals.open(tmp_path)
    with pytest.raises(JournalError, match="type 256 is out of range"):
        journal.append(256, b"")
    assert journal.append(255, b"").lsn == 1


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ((1, b"x" * 11), "11 bytes exceeds max_record_size"),
        ((256, b""), "type 256 is out of range"),
    ],
    ids=["too large", "bad type"],
)
def test_add_all_buffers_every_record_or_none(
    tmp_path: Path, journals: Journals, bad: tuple[int, bytes], error: str
) -> None:
    """A refused record leaves none of its unit behind: a TX record without all the records it
    announces would take later records for its own on recovery."""
    journal, _ = journals.open(tmp_path, max_record_size=10)
    journal.add(1, b"before")
    with pytest.raises(JournalError, match=error):
        journal.add_all([(5, b"tx"), (1, b"first"), bad, (1, b"last")])
    assert journal.next_lsn == 2
    assert journal.add_all([(5, b"tx"), (1, b"first"), (1, b"last")]) == 2
    assert journal.next_lsn == 5
    journal.close()
    _, records = journals.open(tmp_path, max_record_size=10)
    assert [(r.position.lsn, r.type, r.payload) for r in records] == [
        (1, 1, b"before"),
        (2, 5, b"tx"),
        (3, 1, b"first"),
        (4, 1, b"last"),
    ]


def test_invalid_options() -> None:
    with pytest.raises(JournalError, match="segment_size 40 is too small"):
        Journal(Path("unused"), segment_size=40)
    with pytest.raises(JournalError, match="max_record_size"):
        Journal(Path("unused"), max_record_size=2**32)
    with pytest.raises(JournalError, match=r"sync_delay 1\.5 must be 0 to 1 second"):
        Journal(Path("unused"), sync_delay=1.5)


def test_closed_journal_refuses(tmp_path: Path, journals: Journals) -> None:
    journal, _ = journals.open(tmp_path)
    journal.append(0, b"kept")
    journal.close()
    journal.close()  # twice is harmless
    with pytest.raises(JournalError, match="closed"):
        journal.append(0, b"x")
    with pytest.raises(JournalError, match="closed"):
        journal.read(Position(1, 1, 16))
    _, records = journals.open(tmp_path)
    assert triples(records) == [(1, 0, b"kept")]  # close() flushed


# -- segments: delete and rewrite ---------------------------------------------------------------


def three_segments(journal: Journal) -> list[list[Position]]:
    """Three segments of five records each (LSNs 1-5, 6-10, 11-15); the third is active."""
    positions = []
    for segment in range(3):
        positions.append([journal.append(segment, b"r%d" % i) for i in range(5)])
        if segment < 2:
            journal.rotate()
    journal.flush()
    return positions


def test_delete_oldest_segment(tmp_path: Path, journals: Journals) -> None:
    journal, _ = journals.open(tmp_path)
    three_segments(journal)
    with pytest.raises(JournalError, match="active segment"):
        journal.delete_segment(11)
    with pytest.raises(JournalError, match="no segment has base LSN 3"):
        journal.delete_segment(3)
    journal.delete_segment(1)
    assert not (tmp_path / segment_name(1)).exists()
    assert [s.base_lsn for s in journal.segments()] == [6, 11]
    journal.close()
    journal, records = journals.open(tmp_path)
    assert [r.position.lsn for r in records] == list(range(6, 16))


def test_delete_middle_segment_empties_it(tmp_path: Path, journals: Journals) -> None:
    journal, _ = journals.open(tmp_path)
    three_segments(journal)
    journal.delete_segment(6)
    # it stays as an empty compacted segment, so recovery sees no hole in the LSNs
    assert [(s.base_lsn, s.size) for s in journal.segments()][:2] == [(1, 16 + 5 * 19), (6, 24)]
    journal.close()
    journal, records = journals.open(tmp_path)
    assert [r.position.lsn for r in records] == [1, 2, 3, 4, 5, 11, 12, 13, 14, 15]
    # once the oldest goes, the emptied one goes with it
    journal.delete_segment(1)
    assert [s.base_lsn for s in journal.segments()] == [11]
    assert sorted(os.listdir(tmp_path)) == [segment_name(11)]


def test_deleting_an_emptied_segment_again_changes_nothing(
    tmp_path: Path, journals: Journals
) -> None:
    journal, _ = journals.open(tmp_path)
    three_segments(journal)
    journal.delete_segment(6)
    inode = (tmp_path / segment_name(6)).stat().st_ino
    journal.delete_segment(6)  # as a caller that counts it dead again after a restart would
    assert (tmp_path / segment_name(6)).stat().st_ino == inode


def test_scan_reads_everything_on_disk_again(tmp_path: Path, journals: Journals) -> None:
    journal, _ = journals.open(tmp_path)
    with pytest.raises(JournalError, match="recover"):
        next(Journal(tmp_path / "other").scan())
    three_segments(journal)
    journal.rewrite_segment(6, lambda record: record.position.lsn == 8)
    journal.append(0, b"not flushed")
    scanned = [r.position.lsn for r in journal.scan()]
    assert scanned == [1, 2, 3, 4, 5, 8, 11, 12, 13, 14, 15]
    journal.close()
    with pytest.raises(JournalError, match="closed"):
        next(journal.scan())


def test_rewrite_segment_keeps_chosen_records(tmp_path: Path, journals: Journals) -> None:
    journal, _ = journals.open(tmp_path)
    positions = three_segments(journal)
    old_size = (tmp_path / segment_name(6)).stat().st_size
    with pytest.raises(JournalError, match="active segment"):
        journal.rewrite_segment(11, lambda record: True)
    seen: list[int] = []

    def keep(record: Record) -> bool:
        seen.append(record.position.lsn)
        return record.position.lsn in (7, 9)

    moved = journal.rewrite_segment(6, keep)
    assert seen == [6, 7, 8, 9, 10]
    assert moved == {7: Position(7, 6, 24), 9: Position(9, 6, 24 + 19)}
    assert journal.read(moved[9]) == Record(moved[9], 1, b"r3")
    with pytest.raises(JournalError, match="rewritten"):
        journal.read(positions[1][4])  # LSN 10 is gone
    assert (tmp_path / segment_name(6)).stat().st_size == 24 + 2 * 19 < old_size
    assert journal.segments()[1].size == 24 + 2 * 19
    journal.close()
    journal, records = journals.open(tmp_path)
    assert [r.position.lsn for r in records] == [1, 2, 3, 4, 5, 7, 9, 11, 12, 13, 14, 15]
    assert records[6] == Record(Position(9, 6, 43), 1, b"r3")
    # a compacted segment can be compacted again
    assert journal.rewrite_segment(6, lambda record: record.position.lsn == 9) == {
        9: Position(9, 6, 24)
    }


class SimulatedCrash(BaseException):
    """The process dies here."""


def test_rewrite_crash_before_rename_leaves_the_old_segment(
    tmp_path: Path, journals: Journals, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal, _ = journals.open(tmp_path)
    three_segments(journal)
    before = (tmp_path / segment_name(6)).read_bytes()

    def crash(source: object, target: object) -> None:
        raise SimulatedCrash

    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", crash)
        with pytest.raises(SimulatedCrash):
            journal.rewrite_segment(6, lambda record: record.position.lsn == 8)
    temp = tmp_path / (segment_name(6) + ".compact")
    assert temp.exists()  # the copy was written and synced, never renamed
    assert (tmp_path / segment_name(6)).read_bytes() == before

    journal, records = journals.open(tmp_path)
    assert [r.position.lsn for r in records] == list(range(1, 16))
    assert not temp.exists()
    assert (tmp_path / segment_name(6)).read_bytes() == before


def test_rewrite_refused_by_keep_leaves_the_segment(tmp_path: Path, journals: Journals) -> None:
    journal, _ = journals.open(tmp_path)
    three_segments(journal)
    before = (tmp_path / segment_name(1)).read_bytes()

    def keep(record: Record) -> bool:
        raise ValueError("broken keep")

    with pytest.raises(ValueError, match="broken keep"):
        journal.rewrite_segment(1, keep)
    assert sorted(os.listdir(tmp_path)) == [segment_name(b) for b in (1, 6, 11)]
    assert (tmp_path / segment_name(1)).read_bytes() == before


# -- reading ------------------------------------------------------------------------------------


def test_read_random_access(tmp_path: Path, journals: Journals) -> None:
    rng = random.Random(3)
    journal, _ = journals.open(tmp_path, segment_size=400)
    appended = fill(journal, 100, rng)
    journal.flush()
    for position, kind, payload in rng.sample(appended, len(appended)):
        assert journal.read(position) == Record(position, kind, payload)
    unflushed = journal.append(0, b"later")
    with pytest.raises(JournalError, match="not flushed"):
        journal.read(unflushed)
    with pytest.raises(JournalError, match="no valid record 5"):
        journal.read(Position(5, appended[0][0].segment, appended[1][0].offset))


def test_read_detects_a_damaged_record(tmp_path: Path, journals: Journals) -> None:
    journal, _ = journals.open(tmp_path)
    position = journal.append(0, b"payload")
    journal.flush()
    path = tmp_path / segment_name(1)
    data = bytearray(path.read_bytes())
    data[position.offset + 17 + 3] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(JournalError, match="damaged"):
        journal.read(position)


def test_read_many_reads_the_records_asked_for_in_order(tmp_path: Path, journals: Journals) -> None:
    rng = random.Random(4)
    journal, _ = journals.open(tmp_path, segment_size=2000)
    appended = fill(journal, 300, rng)
    payloads = [rng.randbytes(3 * 1024 * 1024)]  # larger than a read-ahead
    appended += [(journal.append(9, payload), 9, payload) for payload in payloads]
    journal.flush()
    for base in sorted({position.segment for position, _, _ in appended}):
        wanted = [a for a in appended if a[0].segment == base and rng.random() < 0.5]
        lsns, offsets = [a[0].lsn for a in wanted], [a[0].offset for a in wanted]
        found = list(journal.read_many(base, lsns, offsets))
        assert found == [Record(position, kind, payload) for position, kind, payload in wanted]


def test_read_many_stops_at_a_record_that_is_not_there(tmp_path: Path, journals: Journals) -> None:
    journal, _ = journals.open(tmp_path)
    first, second = journal.append(0, b"one"), journal.append(1, b"two")
    journal.flush()
    with pytest.raises(JournalError, match="no valid record 3 at offset"):
        list(journal.read_many(1, [1, 3], [first.offset, second.offset]))
    path = tmp_path / segment_name(1)
    data = bytearray(path.read_bytes())
    data[second.offset + 17 + 1] ^= 0x01
    path.write_bytes(bytes(data))
    records = journal.read_many(1, [1, 2], [first.offset, second.offset])
    assert next(records) == Record(first, 0, b"one")
    with pytest.raises(JournalError, match="damaged"):
        next(records)
    with pytest.raises(JournalError, match="no segment has base LSN 5"):
        list(journal.read_many(5, [], []))


# -- sync policies ------------------------------------------------------------------------------


class Fsyncs:
    """A replacement for Journal.fsync that counts calls, optionally slowly or failing."""

    def __init__(self, *, delay: float = 0.0, error: bool = False) -> None:
        self.calls = 0
        self.delay = delay
        self.error = error

    def __call__(self, fd: int) -> None:
        self.calls += 1
        if self.error:
            raise OSError(errno.EIO, "injected I/O error")
        time.sleep(self.delay)  # stands for the disk's latency, not for synchronisation


def test_always_syncs_and_reports_inside_flush(
    tmp_path: Path, journals: Journals, monkeypatch: pytest.MonkeyPatch
) -> None:
    reported: list[tuple[int, int]] = []
    fsyncs = Fsyncs()
    journal, _ = journals.open(
        tmp_path,
        sync=SyncPolicy.ALWAYS,
        on_synced=lambda lsn: reported.append((lsn, fsyncs.calls)),
    )
    monkeypatch.setattr(journal, "fsync", fsyncs)
    journal.append(0, b"a")
    journal.append(0, b"b")
    assert fsyncs.calls == 0  # appends make no syscall
    assert journal.flush() == 2
    assert reported == [(2, 1)]  # synced, then reported, before flush returned
    assert journal.synced_lsn == 2
    assert journal.wait_synced(2, timeout=0)


def test_os_policy_reports_at_once_and_never_syncs(
    tmp_path: Path, journals: Journals, monkeypatch: pytest.MonkeyPatch
) -> None:
    reported: list[int] = []
    journal, _ = journals.open(tmp_path, sync=SyncPolicy.OS, on_synced=reported.append)
    fsyncs = Fsyncs()
    monkeypatch.setattr(journal, "fsync", fsyncs)
    journal.append(0, b"a")
    assert journal.flush() == 1
    assert reported == [1]
    assert journal.synced_lsn == journal.written_lsn == 1
    assert journal.wait_synced(2) is False  # only a flush by this thread could sync it
    journal.append(0, b"b")
    journal.close()
    assert reported == [1, 2]
    assert fsyncs.calls == 0


def test_group_reports_from_the_fsync_thread(tmp_path: Path, journals: Journals) -> None:
    reported = threading.Event()
    calls: list[tuple[int, threading.Thread]] = []

    def on_synced(lsn: int) -> None:
        calls.append((lsn, threading.current_thread()))
        reported.set()

    journal, _ = journals.open(tmp_path, sync=SyncPolicy.GROUP, on_synced=on_synced)
    journal.append(0, b"a")
    assert journal.flush() == 1
    assert reported.wait(WAIT)
    assert calls[0][0] == 1
    assert calls[0][1] is not threading.current_thread()
    assert journal.wait_synced(1, timeout=WAIT)
    assert journal.synced_lsn == 1


def test_synced_lsn_is_published_before_on_synced_runs(tmp_path: Path, journals: Journals) -> None:
    """A caller woken by on_synced(n) must find synced_lsn >= n, or it would wait forever."""
    seen: list[tuple[int, int]] = []
    done = threading.Event()
    journal: Journal | None = None

    def on_synced(lsn: int) -> None:
        assert journal is not None
        seen.append((lsn, journal.synced_lsn))
        done.set()

    journal, _ = journals.open(tmp_path, sync=SyncPolicy.GROUP, on_synced=on_synced)
    journal.append(0, b"a")
    journal.flush()
    assert done.wait(WAIT)
    assert all(synced >= lsn for lsn, synced in seen), seen


def test_group_commit_shares_fsyncs(
    tmp_path: Path, journals: Journals, monkeypatch: pytest.MonkeyPatch
) -> None:
    reported: list[int] = []
    journal, _ = journals.open(tmp_path, sync=SyncPolicy.GROUP, on_synced=reported.append)
    fsyncs = Fsyncs(delay=0.02)
    monkeypatch.setattr(journal, "fsync", fsyncs)
    for i in range(200):
        journal.append(0, b"message %d" % i)
        journal.flush()
    assert journal.wait_synced(200, timeout=WAIT)
    assert fsyncs.calls < 50
    assert reported[-1] == 200
    assert reported == sorted(set(reported))  # each LSN reported once, in order


def test_group_writes_nothing_waits_for_share_one_fsync_after_the_delay(
    tmp_path: Path, journals: Journals, monkeypatch: pytest.MonkeyPatch
) -> None:
    reported = threading.Event()
    journal, _ = journals.open(
        tmp_path, sync=SyncPolicy.GROUP, sync_delay=0.3, on_synced=lambda lsn: reported.set()
    )
    fsyncs = Fsyncs()
    monkeypatch.setattr(journal, "fsync", fsyncs)
    flushed = time.monotonic()
    for i in range(5):
        journal.append(0, b"no receipt %d" % i)
        journal.flush()
    assert reported.wait(WAIT)
    assert time.monotonic() - flushed >= 0.3  # not before the delay...
    assert journal.synced_lsn == 5
    assert fsyncs.calls == 1  # ...and then one fsync for all five


@pytest.mark.parametrize("request_first", [False, True])
def test_group_a_requested_sync_does_not_wait_for_the_delay(
    tmp_path: Path, journals: Journals, request_first: bool
) -> None:
    """A RECEIPT waits for its records: their fsync starts at once, whether it is asked for after
    the records are written or before (a frame queued ahead of the flush)."""
    reported = threading.Event()
    journal, _ = journals.open(
        tmp_path, sync=SyncPolicy.GROUP, sync_delay=1.0, on_synced=lambda lsn: reported.set()
    )
    journal.append(0, b"with a receipt")
    if request_first:
        journal.request_sync(1)
    journal.flush()
    if not request_first:
        journal.request_sync(1)
    assert reported.wait(0.8)  # well before the 1 s delay
    assert journal.synced_lsn == 1


def test_group_wait_synced_asks_for_the_sync(tmp_path: Path, journals: Journals) -> None:
    journal, _ = journals.open(tmp_path, sync=SyncPolicy.GROUP, sync_delay=1.0)
    journal.append(0, b"a")
    journal.flush()
    started = time.monotonic()
    assert journal.wait_synced(1, timeout=WAIT)
    assert time.monotonic() - started < 0.8


def test_group_rotation_syncs_the_old_segment_first(
    tmp_path: Path, journals: Journals, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal, _ = journals.open(tmp_path, sync=SyncPolicy.GROUP)
    in_caller: list[int] = []  # inodes fsynced by the caller's thread, in order
    real_fsync = journal.fsync

    def fsync(fd: int) -> None:
        if threading.current_thread() is threading.main_thread():
            in_caller.append(os.fstat(fd).st_ino)
        real_fsync(fd)

    monkeypatch.setattr(journal, "fsync", fsync)
    journal.append(0, b"old")
    journal.rotate()
    old_inode = (tmp_path / segment_name(1)).stat().st_ino
    new_inode = (tmp_path / segment_name(2)).stat().st_ino
    # complete on disk before the new file (then the directory) is synced, whatever the thread does
    assert in_caller[:2] == [old_inode, new_inode]
    journal.append(0, b"new")
    journal.flush()
    assert journal.wait_synced(2, timeout=WAIT)


@pytest.mark.parametrize("policy", [SyncPolicy.GROUP, SyncPolicy.ALWAYS])
def test_failed_fsync_stops_the_journal(
    tmp_path: Path, journals: Journals, monkeypatch: pytest.MonkeyPatch, policy: SyncPolicy
) -> None:
    reported: list[int] = []
    journal, _ = journals.open(tmp_path, sync=policy, on_synced=reported.append)
    journal.append(0, b"durable")
    journal.flush()
    assert journal.wait_synced(1, timeout=WAIT)
    monkeypatch.setattr(journal, "fsync", Fsyncs(error=True))
    journal.append(0, b"lost?")
    if policy is SyncPolicy.ALWAYS:
        with pytest.raises(JournalError, match=r"fsync .* failed .* may not be durable"):
            journal.flush()
    else:
        journal.flush()
        with pytest.raises(JournalError, match=r"fsync .* failed"):
            journal.wait_synced(2, timeout=WAIT)
    with pytest.raises(JournalError, match=r"fsync .* failed .* accepts no more") as refused:
        journal.append(0, b"x")
    assert isinstance(refused.value.__cause__, OSError)
    with pytest.raises(JournalError, match="fsync"):
        journal.flush()
    with pytest.raises(JournalError, match="fsync"):
        journal.rotate()
    assert reported == [1]
    assert journal.synced_lsn == 1
    with pytest.raises(JournalError, match="fsync"):
        journal.close()


def test_a_failed_write_waits_in_memory_and_a_retry_writes_it(
    tmp_path: Path, journals: Journals, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real file system's write fails after taking part of the data: the part is cut off
    and the records wait, in order (tests/persist/test_journal_disk_full.py says more)."""
    journal, _ = journals.open(tmp_path)
    journal.append(0, b"kept")
    journal.flush()
    size = os.path.getsize(tmp_path / segment_name(1))
    journal.append(0, b"a" * 100)
    real_write = os.write

    def writev(fd: int, parts: list[bytes]) -> int:  # the journal's records go out vectored
        data = b"".join(parts)
        if len(data) > 50:
            return real_write(fd, data[:50])  # a short write...
        raise OSError(errno.ENOSPC, "No space left on device")  # ...then the disk is full

    with monkeypatch.context() as patch:
        patch.setattr(os, "writev", writev)
        assert journal.flush() == 1
        assert journal.write_error is not None
        assert journal.write_error.errno == errno.ENOSPC
    assert os.path.getsize(tmp_path / segment_name(1)) == size  # nothing partial stays
    journal.append(0, b"b")
    assert journal.flush() == 1  # nothing is written while the records wait
    assert journal.retry_write()
    assert journal.written_lsn == 3
    journal.close()
    _, records = journals.open(tmp_path)
    assert [r.payload for r in records] == [b"kept", b"a" * 100, b"b"]


def test_failing_callback_stops_the_group_journal(tmp_path: Path, journals: Journals) -> None:
    def on_synced(lsn: int) -> None:
        raise RuntimeError("callback bug")

    journal, _ = journals.open(tmp_path, sync=SyncPolicy.GROUP, on_synced=on_synced)
    journal.append(0, b"a")
    journal.flush()
    # The record is durable (synced_lsn is published first); then the callback's bug stops
    # the journal, and every later operation says why.
    assert journal.wait_synced(1, timeout=WAIT)
    wait_until(lambda: journal_failed(journal), WAIT)
    with pytest.raises(JournalError, match=r"on_synced.*callback bug"):
        journal.append(0, b"b")


def journal_failed(journal: Journal) -> bool:
    """Whether the journal reports a failure (asked about an LSN not yet durable)."""
    try:
        journal.wait_synced(journal.next_lsn, timeout=0)
    except JournalError:
        return True
    return False


def test_group_close_syncs_everything(
    tmp_path: Path, journals: Journals, monkeypatch: pytest.MonkeyPatch
) -> None:
    reported: list[int] = []
    journal, _ = journals.open(tmp_path, sync=SyncPolicy.GROUP, on_synced=reported.append)
    fsyncs = Fsyncs()
    monkeypatch.setattr(journal, "fsync", fsyncs)
    journal.append(0, b"a")
    journal.append(0, b"b")
    journal.close()  # flushes, and the thread's last round syncs before it stops
    assert journal.synced_lsn == 2
    assert reported == [2]
    assert fsyncs.calls >= 1
