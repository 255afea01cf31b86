"""Recovery: torn tails at every byte, corruption in the middle, damaged segment sequences."""

from __future__ import annotations

import os
import shutil
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluiceway.persist.journal import Journal, SyncPolicy
from sluiceway.persist.segments import CorruptJournal, JournalError, Position, Record


class Journals:
    """Opens journals (SyncPolicy.OS, no thread) and closes those still open when a test ends."""

    def __init__(self) -> None:
        self.opened: list[Journal] = []

    def open(self, directory: Path, *, skip_corrupt: bool = False) -> tuple[Journal, list[Record]]:
        journal = Journal(
            directory, sync=SyncPolicy.OS, segment_size=200, skip_corrupt=skip_corrupt
        )
        self.opened.append(journal)
        return journal, list(journal.recover())


@pytest.fixture
def journals() -> Iterator[Journals]:
    opened = Journals()
    yield opened
    for journal in opened.opened:
        journal.close()


def segment_path(directory: Path, base: int) -> Path:
    return directory / f"{base:020d}.log"


def record_end(record: Record) -> int:
    return record.position.offset + 17 + len(record.payload)


def write_journal(directory: Path, journals: Journals, payloads: list[bytes]) -> list[Record]:
    """A journal of the given payloads (type = index % 256); its last segment holds records."""
    journal, _ = journals.open(directory)
    records = []
    for index, payload in enumerate(payloads):
        if journal.should_rotate:
            journal.rotate()
        records.append(Record(journal.append(index % 256, payload), index % 256, payload))
    journal.close()
    return records


def test_torn_tail_at_every_byte_of_the_last_three_records(
    tmp_path: Path, journals: Journals
) -> None:
    payloads = [b"p%02d-" % i * (i % 4) for i in range(30)] + [b"", b"second to last", b"last!"]
    original = tmp_path / "original"
    records = write_journal(original, journals, payloads)
    last_base = records[-1].position.segment
    tail = [r for r in records if r.position.segment == last_base]
    assert len(tail) >= 4  # the last segment holds more than the three records torn below
    assert len({r.position.segment for r in records}) > 3
    data = segment_path(original, last_base).read_bytes()

    for cut in range(tail[-3].position.offset, len(data) + 1):
        copy = tmp_path / f"cut{cut}"
        shutil.copytree(original, copy)
        os.truncate(segment_path(copy, last_base), cut)
        intact = [r for r in records if r.position.segment != last_base or record_end(r) <= cut]
        valid_end = max(record_end(r) for r in intact if r.position.segment == last_base)

        journal, recovered = journals.open(copy)
        assert recovered == intact, cut
        assert journal.report.torn_bytes == cut - valid_end
        if cut > valid_end:
            [saved] = journal.report.saved
            assert saved == copy / "discarded" / f"{last_base:020d}.log.{valid_end}.bytes"
            assert saved.read_bytes() == data[valid_end:cut]
        else:
            assert journal.report.saved == []
        assert segment_path(copy, last_base).stat().st_size == valid_end
        assert journal.next_lsn == intact[-1].position.lsn + 1

        appended = journal.append(9, b"after the crash")
        journal.close()
        journal, again = journals.open(copy)
        assert again[:-1] == intact
        assert (again[-1].position, again[-1].type, again[-1].payload) == (
            appended,
            9,
            b"after the crash",
        )
        assert journal.report.torn_bytes == 0
        journal.close()
        shutil.rmtree(copy)


def test_zero_filled_tail_is_cut(tmp_path: Path, journals: Journals) -> None:
    records = write_journal(tmp_path, journals, [b"a", b"b"])
    path = segment_path(tmp_path, 1)
    with path.open("ab") as segment:
        segment.write(b"\0" * 100_000)  # the size reached the disk, the data did not
    journal, recovered = journals.open(tmp_path)
    assert recovered == records
    assert journal.report.torn_bytes == 100_000


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("where", ["payload", "length", "lsn"])
def test_damage_in_the_middle_raises_or_is_skipped(
    tmp_path: Path, journals: Journals, where: str
) -> None:
    records = write_journal(tmp_path, journals, [b"record %d" % i for i in range(6)])
    assert {r.position.segment for r in records} == {1}
    bad = records[2]
    path = segment_path(tmp_path, 1)
    flip(path, bad.position.offset + {"payload": 20, "length": 1, "lsn": 8}[where])
    damaged = path.read_bytes()

    journal = Journal(tmp_path, sync=SyncPolicy.OS)
    seen: list[Record] = []
    with pytest.raises(CorruptJournal) as raised:
        seen.extend(journal.recover())
    assert seen == records[:2]  # streamed before the damage was found
    assert raised.value.segment == path
    assert raised.value.offset == bad.position.offset
    message = str(raised.value)
    assert str(path) in message
    assert f"offset {bad.position.offset}" in message
    assert "skip_corrupt" in message
    assert path.read_bytes() == damaged  # nothing was changed

    journal, recovered = journals.open(tmp_path, skip_corrupt=True)
    assert recovered == records[:2] + records[3:]
    length = record_end(bad) - bad.position.offset
    assert journal.report.skipped == [(path, bad.position.offset, length)]
    [saved] = journal.report.saved
    assert saved.read_bytes() == damaged[bad.position.offset : record_end(bad)]
    assert journal.report.lsn_gaps == [(2, 4)]
    assert journal.append(0, b"more").lsn == 7
    journal.close()
    # the damage stays (it is skipped again, and saved once)
    journal, again = journals.open(tmp_path, skip_corrupt=True)
    assert again[-1].payload == b"more"
    assert journal.report.saved == [saved]
    assert len(list((tmp_path / "discarded").iterdir())) == 1


def test_a_cut_tail_in_an_earlier_segment_is_damage(tmp_path: Path, journals: Journals) -> None:
    """A segment is fsynced before the next one is created, so a later segment proves it was
    complete: an end cut short there is damage, and the later segments hold confirmed records."""
    records = write_journal(tmp_path, journals, [b"x" * 40 for _ in range(12)])
    bases = sorted({r.position.segment for r in records})
    assert len(bases) >= 3
    first = [r for r in records if r.position.segment == bases[0]]
    cut = first[-1].position.offset + 5  # the last record of the first segment is cut short
    first_path = segment_path(tmp_path, bases[0])
    cut_bytes = first_path.read_bytes()[first[-1].position.offset : cut]
    os.truncate(first_path, cut)

    with pytest.raises(CorruptJournal, match="a later segment exists") as caught:
        journals.open(tmp_path)
    assert (caught.value.segment, caught.value.offset) == (first_path, first[-1].position.offset)
    journal, recovered = journals.open(tmp_path, skip_corrupt=True)
    assert recovered == [r for r in records if r != first[-1]]  # only the damaged one is lost
    discarded = tmp_path / "discarded"
    assert (discarded / f"{first_path.name}.{first[-1].position.offset}.bytes").read_bytes() == (
        cut_bytes
    )
    assert journal.report.torn_bytes == 0
    lost = first[-1].position.lsn
    assert journal.report.lsn_gaps == [(lost - 1, lost + 1)]


def test_missing_segment_is_a_gap(tmp_path: Path, journals: Journals) -> None:
    records = write_journal(tmp_path, journals, [b"y" * 40 for _ in range(12)])
    bases = sorted({r.position.segment for r in records})
    segment_path(tmp_path, bases[1]).unlink()
    journal = Journal(tmp_path, sync=SyncPolicy.OS)
    with pytest.raises(CorruptJournal, match="missing") as raised:
        list(journal.recover())
    assert raised.value.segment == segment_path(tmp_path, bases[2])
    assert raised.value.offset == 0

    journal, recovered = journals.open(tmp_path, skip_corrupt=True)
    assert recovered == [r for r in records if r.position.segment != bases[1]]
    assert journal.report.lsn_gaps == [(bases[1] - 1, bases[2])]


def test_truncated_earlier_segment_at_a_record_boundary_is_a_gap(
    tmp_path: Path, journals: Journals
) -> None:
    # Under ALWAYS and GROUP a segment is complete on disk before the next one exists, so a
    # segment that ends early is lost data, not a crash.
    records = write_journal(tmp_path, journals, [b"z" * 40 for _ in range(12)])
    first = [r for r in records if r.position.segment == 1]
    os.truncate(segment_path(tmp_path, 1), first[-1].position.offset)
    journal = Journal(tmp_path, sync=SyncPolicy.OS)
    with pytest.raises(CorruptJournal, match="missing"):
        list(journal.recover())


def segment_bytes(base: int, records: list[tuple[int, int, bytes]]) -> bytes:
    """A segment written by hand, from the documented layout."""
    data = b"SWJ1" + struct.pack("<IQ", 1, base)
    for lsn, kind, payload in records:
        tail = struct.pack("<QB", lsn, kind)
        data += struct.pack("<II", len(payload), zlib.crc32(tail + payload)) + tail + payload
    return data


def test_overlapping_segments_cannot_be_skipped(tmp_path: Path, journals: Journals) -> None:
    segment_path(tmp_path, 1).write_bytes(segment_bytes(1, [(1, 0, b"a"), (2, 0, b"b")]))
    segment_path(tmp_path, 2).write_bytes(segment_bytes(2, [(2, 0, b"again")]))
    for skip in (False, True):
        journal = Journal(tmp_path, sync=SyncPolicy.OS, skip_corrupt=skip)
        with pytest.raises(CorruptJournal, match=r"overlaps .* cannot be skipped"):
            list(journal.recover())


def test_handwritten_segment_is_read(tmp_path: Path, journals: Journals) -> None:
    segment_path(tmp_path, 7).write_bytes(segment_bytes(7, [(7, 1, b"seven"), (8, 2, b"")]))
    journal, recovered = journals.open(tmp_path)
    assert recovered == [
        Record(Position(7, 7, 16), 1, b"seven"),
        Record(Position(8, 7, 38), 2, b""),
    ]
    assert journal.next_lsn == 9


@pytest.mark.parametrize(
    ("header", "problem"),
    [
        (b"SWJ2" + struct.pack("<IQ", 1, 1), "magic"),
        (b"SWJ1" + struct.pack("<IQ", 3, 1), "version 3"),
        (b"SWJ1" + struct.pack("<IQ", 1, 5), "base LSN 5"),
        (b"GARBAGE", "too short"),
    ],
)
def test_wrong_header_raises(tmp_path: Path, header: bytes, problem: str) -> None:
    path = segment_path(tmp_path, 1)
    path.write_bytes(header)
    journal = Journal(tmp_path, sync=SyncPolicy.OS, skip_corrupt=True)
    with pytest.raises(JournalError, match=problem) as raised:
        list(journal.recover())
    assert str(path) in str(raised.value)
    assert path.read_bytes() == header


@pytest.mark.parametrize("written", [0, 1, 7, 15, 16])
def test_segment_created_during_a_crash(tmp_path: Path, journals: Journals, written: int) -> None:
    records = write_journal(tmp_path, journals, [b"q"])
    journal, _ = journals.open(tmp_path)
    journal.rotate()
    journal.close()  # segment 2 holds just a header
    segment_path(tmp_path, 3).unlink(missing_ok=True)
    os.truncate(segment_path(tmp_path, 2), written)
    journal, recovered = journals.open(tmp_path)
    assert recovered == records
    assert journal.report.torn_bytes == 0
    cut = [(segment_path(tmp_path, 2), written)] if written < 16 else []
    assert journal.report.headers_cut == cut  # reported, not accepted silently
    assert journal.append(0, b"r") == Position(2, 2, 16)
    journal.close()
    _, recovered = journals.open(tmp_path)
    assert [r.payload for r in recovered] == [b"q", b"r"]


def test_damaged_compacted_segment_is_never_a_torn_tail(tmp_path: Path, journals: Journals) -> None:
    records = write_journal(tmp_path, journals, [b"c" * 40 for _ in range(12)])
    journal, _ = journals.open(tmp_path)
    journal.rewrite_segment(1, lambda record: True)
    journal.close()
    path = segment_path(tmp_path, 1)
    os.truncate(path, path.stat().st_size - 3)  # compacted segments were synced whole
    journal = Journal(tmp_path, sync=SyncPolicy.OS)
    with pytest.raises(CorruptJournal, match="compacted"):
        list(journal.recover())
    journal, recovered = journals.open(tmp_path, skip_corrupt=True)
    lost = max(r.position.lsn for r in records if r.position.segment == 1)
    assert [r.position.lsn for r in recovered] == [
        r.position.lsn for r in records if r.position.lsn != lost
    ]
    assert len(journal.report.skipped) == 1


def test_an_earlier_segment_cut_inside_its_header_is_damage(
    tmp_path: Path, journals: Journals
) -> None:
    records = write_journal(tmp_path, journals, [b"h" * 40 for _ in range(12)])
    bases = sorted({r.position.segment for r in records})
    os.truncate(segment_path(tmp_path, bases[1]), 10)
    header_cut = r"ends inside its 16-byte header \(10 bytes\)"
    with pytest.raises(CorruptJournal, match=header_cut) as caught:
        journals.open(tmp_path)
    assert caught.value.segment == segment_path(tmp_path, bases[1])
    journal, recovered = journals.open(tmp_path, skip_corrupt=True)
    assert [r for r in records if r.position.segment != bases[1]] == recovered
    assert journal.report.lsn_gaps == [(bases[1] - 1, bases[2])]


@pytest.mark.parametrize("where", ["payload", "length", "lsn", "type", "crc"])
def test_a_damaged_last_record_is_not_taken_for_a_write_cut_short(
    tmp_path: Path, journals: Journals, where: str
) -> None:
    """A flipped bit in the journal's last record, which may have been confirmed: reported as
    damage (what it held included), never cut as a write a crash interrupted."""
    records = write_journal(tmp_path, journals, [b"record %d" % i for i in range(5)])
    last = records[-1]
    path = segment_path(tmp_path, last.position.segment)
    offset = {"payload": 20, "length": 0, "lsn": 9, "type": 16, "crc": 5}[where]
    flip(path, last.position.offset + offset)
    cut = path.read_bytes()[last.position.offset :]
    with pytest.raises(CorruptJournal, match="may have been confirmed") as caught:
        journals.open(tmp_path)
    damaged = caught.value.damaged
    assert damaged is not None
    assert (damaged.segment, damaged.offset) == (path, last.position.offset)
    if where not in ("lsn", "type"):
        assert (damaged.lsn, damaged.type) == (last.position.lsn, last.type)
    journal, recovered = journals.open(tmp_path, skip_corrupt=True)
    assert recovered == records[:-1]
    assert journal.report.damaged == [damaged]
    assert journal.report.torn == []
    assert journal.report.torn_bytes == 0
    [saved] = journal.report.saved
    assert saved.read_bytes() == cut
    assert journal.append(0, b"next").lsn == last.position.lsn


def test_a_write_cut_short_is_reported_as_such(tmp_path: Path, journals: Journals) -> None:
    records = write_journal(tmp_path, journals, [b"whole", b"cut short here"])
    path = segment_path(tmp_path, 1)
    end = record_end(records[-1])
    os.truncate(path, end - 4)
    journal, recovered = journals.open(tmp_path)
    assert recovered == records[:-1]
    assert journal.report.torn == [(path, records[-1].position.offset, 17 + 14 - 4)]
    assert journal.report.damaged == []


def test_zeros_where_a_record_was_written_are_a_power_cut_not_damage(
    tmp_path: Path, journals: Journals
) -> None:
    """The file's new size reached the disk and the data of its last pages did not: whole
    pages of zeros inside a record of the right length."""
    records = write_journal(tmp_path, journals, [b"first", b"z" * 9000])
    path = segment_path(tmp_path, 1)
    data = bytearray(path.read_bytes())
    data[8192:] = bytes(len(data) - 8192)
    path.write_bytes(bytes(data))
    journal, recovered = journals.open(tmp_path)
    assert recovered == records[:1]
    assert journal.report.damaged == []
    assert journal.report.torn_bytes == len(data) - records[1].position.offset
