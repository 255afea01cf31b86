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

from sluiceway.errors import SluicewayError


class LivenessError(SluicewayError):
    """A record was registered out of order, or in no segment: a bug, never a guess."""


class Liveness:
    """Live records per segment, and the REMOVEs that die with the segment of their ADD."""

    __slots__ = ("bases", "deps", "flags", "live", "total")

    def __init__(self) -> None:
        self.bases: list[int] = []  # segment base LSNs, ascending
        self.flags: dict[int, bytearray] = {}  # base -> one byte per record of the segment
        self.live: dict[int, int] = {}  # base -> records live
        self.total: dict[int, int] = {}  # base -> records held
        self.deps: dict[int, list[int]] = {}  # segment -> REMOVEs that die when it is deleted

    def add_segment(self, base: int) -> None:
        if base not in self.flags:
            # In order: after recovery, a segment emptied by compaction (no record read from
            # it) is added after later ones.
            bisect.insort(self.bases, base)
            self.flags[base] = bytearray()
            self.live[base] = self.total[base] = 0

    @property
    def oldest(self) -> int:
        """The base of the oldest segment; 0 before any."""
        return self.bases[0] if self.bases else 0

    def gone(self, lsn: int) -> bool:
        """The record `lsn` was in a segment deleted since (so it is dead)."""
        return not self.bases or lsn < self.bases[0]

    def segment_of(self, lsn: int) -> int | None:
        """The base of the segment holding `lsn`, or None when that segment is gone."""
        bases = self.bases
        if not bases or lsn < bases[0]:
            return None
        if lsn >= bases[-1]:
            return bases[-1]  # the active segment: nearly every record's
        return bases[bisect.bisect_right(bases, lsn) - 1]

    def born(self, lsn: int, *, live: bool = True) -> None:
        """The record `lsn` was appended (or read back), live or already dead."""
        base = self.segment_of(lsn)
        if base is None:
            raise LivenessError(
                f"record {lsn} is below the oldest segment ({self.oldest}): no record can be "
                "written or read there"
            )
        flags = self.flags[base]
        index = lsn - base
        size = len(flags)
        if index == size:  # the next record of the segment: nearly always
            flags.append(1 if live else 0)
        elif index > size:  # a compacted segment's records keep their LSNs: gaps between them
            flags.extend(bytes(index - size))
            flags.append(1 if live else 0)
        else:
            raise LivenessError(
                f"record {lsn} registered after record {base + size - 1} of segment {base}: "
                "records are registered once, in LSN order"
            )
        self.total[base] += 1
        if live:
            self.live[base] += 1

    def kill(self, lsn: int) -> None:
        """The record `lsn` is dead (a no-op when it was already, or its segment is gone)."""
        base = self.segment_of(lsn)
        if base is None:
            return
        flags = self.flags[base]
        index = lsn - base
        if index < len(flags) and flags[index]:
            flags[index] = 0
            self.live[base] -= 1

    def is_live(self, lsn: int) -> bool:
        base = self.segment_of(lsn)
        if base is None:
            return False
        flags = self.flags[base]
        index = lsn - base
        return index < len(flags) and bool(flags[index])

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
        del self.flags[base], self.live[base], self.total[base]
