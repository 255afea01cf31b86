"""Which journal records are still live: one byte per record, a count per segment.

A segment holds the records with LSNs from its base up to the next segment's base (the active
segment: every LSN from its base on). Every question is answered by comparing an LSN with the
segment bases, never by arithmetic that could land in the wrong segment:

- an LSN at or above the oldest base is in the segment with the highest base not above it;
- an LSN below the oldest base was in a segment that is gone. Its record is dead, and so is the
  message it held: a segment is deleted only when none of its records is live. Records written
  later may still name it (a REMOVE, a DELIVERED_RUN, a mark outlives the segment of the message
  it is about), and they are about nothing any more.

A record is born once, in LSN order within its segment (appended, or read back by recovery);
being born again, or out of order, is a bug in the caller and raises.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from sluiceway.errors import SluicewayError


class LivenessError(SluicewayError):
    """A record was registered out of order, or in no segment: a bug, never a guess."""


class _Segment:
    """One segment's records: a byte each (1: live), and how many are live, of how many."""

    __slots__ = ("base", "flags", "live", "total")

    def __init__(self, base: int) -> None:
        self.base = base
        self.flags = bytearray()  # by LSN - base; a compacted segment's gaps are zeros
        self.live = 0
        self.total = 0  # records held (a gap is none)


class Liveness:
    """Live records per segment, and the REMOVEs that die with the segment of their ADD."""

    __slots__ = ("_newest", "_recent", "_recent_end", "bases", "deps", "segments")

    def __init__(self) -> None:
        self.bases: list[int] = []  # segment base LSNs, ascending
        self.segments: dict[int, _Segment] = {}  # by base
        self.deps: dict[int, list[int]] = {}  # segment -> REMOVEs that die when it is deleted
        # The segment with the highest base: nearly every record's (appended, or read back by
        # recovery), found without a search.
        self._newest: _Segment | None = None
        # The older segment found last, and the next one's base: recovery's second pass and a
        # DELIVERED_RUN look up LSNs of one segment after another.
        self._recent = _Segment(0)
        self._recent_end = 0  # 0: none

    def add_segment(self, base: int) -> None:
        if base not in self.segments:
            # In order: after recovery, a segment emptied by compaction (no record read from
            # it) is added after later ones.
            bisect.insort(self.bases, base)
            self.segments[base] = _Segment(base)
            self._newest = self.segments[self.bases[-1]]
            self._recent_end = 0

    @property
    def oldest(self) -> int:
        """The base of the oldest segment; 0 before any."""
        return self.bases[0] if self.bases else 0

    def gone(self, lsn: int) -> bool:
        """The record `lsn` was in a segment deleted since (so it is dead)."""
        return not self.bases or lsn < self.bases[0]

    def segment_of(self, lsn: int) -> int | None:
        """The base of the segment holding `lsn`, or None when that segment is gone."""
        segment = self._segment(lsn)
        return None if segment is None else segment.base

    def _segment(self, lsn: int) -> _Segment | None:
        newest = self._newest
        if newest is None:
            return None
        if lsn >= newest.base:
            return newest
        recent = self._recent
        if recent.base <= lsn < self._recent_end:
            return recent
        bases = self.bases
        if lsn < bases[0]:
            return None
        index = bisect.bisect_right(bases, lsn)
        recent = self._recent = self.segments[bases[index - 1]]
        self._recent_end = bases[index]
        return recent

    def counts(self, base: int) -> tuple[int, int] | None:
        """(records live, records held) of the segment `base`; None if there is none."""
        segment = self.segments.get(base)
        return None if segment is None else (segment.live, segment.total)

    def compacted(self, base: int) -> None:
        """The segment `base` was rewritten with its live records only."""
        segment = self.segments[base]
        segment.total = segment.live

    def born(self, lsn: int, *, live: bool = True) -> None:
        """The record `lsn` was appended (or read back), live or already dead."""
        segment = self._segment(lsn)
        if segment is None:
            raise LivenessError(
                f"record {lsn} is below the oldest segment ({self.oldest}): no record can be "
                "written or read there"
            )
        flags = segment.flags
        index = lsn - segment.base
        size = len(flags)
        if index == size:  # the next record of the segment: nearly always
            flags.append(1 if live else 0)
        elif index > size:  # a compacted segment's records keep their LSNs: gaps between them
            flags.extend(bytes(index - size))
            flags.append(1 if live else 0)
        else:
            raise LivenessError(
                f"record {lsn} registered after record {segment.base + size - 1} of segment "
                f"{segment.base}: records are registered once, in LSN order"
            )
        segment.total += 1
        if live:
            segment.live += 1

    def kill(self, lsn: int) -> None:
        """The record `lsn` is dead (a no-op when it was already, or its segment is gone)."""
        segment = self._segment(lsn)
        if segment is None:
            return
        flags = segment.flags
        index = lsn - segment.base
        if index < len(flags) and flags[index]:
            flags[index] = 0
            segment.live -= 1

    def live_among(self, base: int, lsns: Sequence[int]) -> list[int]:
        """The indexes in `lsns`, LSNs of records of the segment `base`, of those live."""
        segment = self.segments.get(base)
        if segment is None:
            return []
        flags, size = segment.flags, len(segment.flags)
        return [i for i, lsn in enumerate(lsns) if lsn - base < size and flags[lsn - base]]

    def is_live(self, lsn: int) -> bool:
        segment = self._segment(lsn)
        if segment is None:
            return False
        index = lsn - segment.base
        return index < len(segment.flags) and segment.flags[index] != 0

    def removal(self, remove_lsn: int, add_lsn: int) -> None:
        """A REMOVE at `remove_lsn` of the message added at `add_lsn`: the ADD dies; the REMOVE
        lives while the ADD's segment exists (else the message would come back on recovery)."""
        add_base = self.segment_of(add_lsn)
        if add_base is None:  # the message went with its segment: the REMOVE is needed no more
            self.born(remove_lsn, live=False)
            return
        self.kill(add_lsn)
        remove_base = self.segment_of(remove_lsn)
        if remove_base is not None and add_base < remove_base:
            self.born(remove_lsn)
            self.deps.setdefault(add_base, []).append(remove_lsn)
        else:
            self.born(remove_lsn, live=False)

    def drop_segment(self, base: int) -> None:
        """The segment `base` was deleted: the REMOVEs that kept its messages dead die too."""
        for lsn in self.deps.pop(base, []):
            self.kill(lsn)
        self.bases.remove(base)
        del self.segments[base]
        self._newest = self.segments[self.bases[-1]] if self.bases else None
        self._recent_end = 0
