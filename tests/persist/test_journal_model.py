"""The journal against an in-memory model, driven by Hypothesis through random operations.

The model is the list of records that must survive: appended and flushed, not deleted or dropped
by compaction. SyncPolicy.OS keeps the fsync thread out; a crash is simulated by copying the
directory as it is while records are still buffered (what a process killed with SIGKILL leaves:
what it wrote is in the OS, what it buffered is gone) and recovering the copy.
"""

from __future__ import annotations

import itertools
import shutil
from dataclasses import dataclass
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from sluiceway.persist.journal import Journal, SyncPolicy
from sluiceway.persist.segments import Position, Record

SEGMENT_SIZE = 160  # bytes: a few records per segment, so operations cross segments often
RECORDS = st.lists(st.tuples(st.integers(0, 255), st.binary(max_size=70)), min_size=1, max_size=6)


@dataclass
class Model:
    records: dict[int, Record]  # by LSN: flushed, neither deleted nor dropped
    pending: list[Record]  # appended, not flushed
    last_flushed: int = 0  # the highest LSN ever flushed


class JournalMachine(RuleBasedStateMachine):
    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root
        self.generation = 0
        self.model = Model({}, [])
        self.journal = self.open()

    def open(self) -> Journal:
        journal = Journal(
            self.root / str(self.generation), segment_size=SEGMENT_SIZE, sync=SyncPolicy.OS
        )
        recovered = list(journal.recover())
        assert recovered == sorted(self.model.records.values(), key=lambda r: r.position.lsn)
        assert journal.report.torn_bytes == 0
        assert journal.next_lsn == self.model.last_flushed + 1
        return journal

    def teardown(self) -> None:
        self.journal.close()
        shutil.rmtree(self.root)

    def active(self) -> int:
        [active] = [s.base_lsn for s in self.journal.segments() if s.active]
        return active

    def non_active(self) -> list[int]:
        return [s.base_lsn for s in self.journal.segments() if not s.active]

    @rule(records=RECORDS)
    def append(self, records: list[tuple[int, bytes]]) -> None:
        for kind, payload in records:
            expected = Position(self.journal.next_lsn, self.active(), self.active_size())
            position = self.journal.append(kind, payload)
            assert position == expected
            self.model.pending.append(Record(position, kind, payload))

    def active_size(self) -> int:
        return next(s.size for s in self.journal.segments() if s.active)

    def flushed(self) -> None:
        for record in self.model.pending:
            self.model.records[record.position.lsn] = record
            self.model.last_flushed = record.position.lsn
        self.model.pending = []

    @rule()
    def flush(self) -> None:
        pending = self.model.pending
        expected = pending[-1].position.lsn if pending else self.journal.written_lsn
        assert self.journal.flush() == expected
        self.flushed()
        assert not self.journal.buffered

    @rule(records=RECORDS, empty=st.booleans())
    def rotate(self, records: list[tuple[int, bytes]], empty: bool) -> None:
        """Append, then rotate as a caller does when the segment is full (or an empty one)."""
        self.append([] if empty else records)
        old, had_records = self.active(), self.active_size() > 16
        self.flushed()
        base = self.journal.rotate()
        assert base == (self.journal.next_lsn if had_records else old)
        assert self.active() == base

    @precondition(lambda self: len(self.journal.segments()) > 1)
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        oldest_only = data.draw(st.booleans())
        candidates = self.non_active()
        base = candidates[0] if oldest_only else data.draw(st.sampled_from(candidates))
        self.journal.delete_segment(base)
        self.model.records = {
            lsn: r for lsn, r in self.model.records.items() if r.position.segment != base
        }
        if oldest_only:
            assert base not in self.non_active()

    @precondition(lambda self: len(self.journal.segments()) > 1)
    @rule(data=st.data())
    def rewrite(self, data: st.DataObject) -> None:
        base = data.draw(st.sampled_from(self.non_active()))
        inside = sorted(lsn for lsn, r in self.model.records.items() if r.position.segment == base)
        keep = set(data.draw(st.lists(st.sampled_from(inside), unique=True))) if inside else set()
        moved = self.journal.rewrite_segment(base, lambda record: record.position.lsn in keep)
        assert set(moved) == keep
        for lsn in inside:
            record = self.model.records.pop(lsn)
            if lsn in keep:
                self.model.records[lsn] = Record(moved[lsn], record.type, record.payload)
                assert self.journal.read(moved[lsn]) == self.model.records[lsn]

    @precondition(lambda self: bool(self.model.records))
    @rule(data=st.data())
    def read(self, data: st.DataObject) -> None:
        record = data.draw(st.sampled_from(sorted(self.model.records.values(), key=repr)))
        assert self.journal.read(record.position) == record

    @rule(crash=st.booleans())
    def restart(self, crash: bool) -> None:
        if not crash:
            self.journal.close()  # flushes
            self.flushed()
            self.journal = self.open()
            return
        # The process dies without flushing: the directory keeps what was written to the OS.
        previous = self.root / str(self.generation)
        self.generation += 1
        shutil.copytree(previous, self.root / str(self.generation))
        self.model.pending = []
        crashed, self.journal = self.journal, self.open()
        crashed._chunks.clear()  # its buffer died with it; close() only releases its files
        crashed.close()
        shutil.rmtree(previous)

    @invariant()
    def consistent(self) -> None:
        pending = self.model.pending
        last = pending[-1].position.lsn if pending else self.model.last_flushed
        assert self.journal.next_lsn == last + 1
        segments = self.journal.segments()
        bases = [s.base_lsn for s in segments]
        assert bases == sorted(bases)
        assert [s.active for s in segments] == [False] * (len(segments) - 1) + [True]
        directory = self.root / str(self.generation)
        assert sorted(p.name for p in directory.glob("*.log")) == [f"{b:020d}.log" for b in bases]
        for segment in segments[:-1]:
            assert segment.size == (directory / f"{segment.base_lsn:020d}.log").stat().st_size
        for record in self.model.records.values():
            assert record.position.segment in bases


def test_journal_model(tmp_path: Path) -> None:
    examples = itertools.count()

    class InTmpPath(JournalMachine):
        def __init__(self) -> None:
            super().__init__(tmp_path / str(next(examples)))  # a fresh directory per example

    run_state_machine_as_test(
        InTmpPath, settings=settings(max_examples=150, stateful_step_count=40, deadline=None)
    )
