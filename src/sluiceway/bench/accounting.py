"""What a consumer keeps about the messages it receives, in memory bounded by the run's size.

- `SequenceBitmap`: one bit per message a producer sends (sequence numbers 0..count-1), so
  1,000,000 messages from one producer cost 125 KB, whatever arrives. Duplicates are bits
  already set; out-of-order messages are sequence numbers below the highest seen so far.
- `LatencyHistogram`: HDR-style buckets: exact below 32 microseconds, then 32 buckets per power
  of two (each bucket at most 1/32 = 3 % wide), so any latency up to hours fits in about 1,200
  counters. Percentiles are read from the buckets; the maximum is kept exactly.
- `Series`: per-second counts and latency sums, for the plot; at most `MAX_SECONDS` seconds,
  later ones are added to the last.
- `Spells`: spans of time (a consumer's idle spells, or those in which it held messages it had
  not started), at most `MAX_SPELLS` of them; `overlap` measures how much of one consumer's
  spells fell inside the others'.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

SUB_BUCKETS = 32  # buckets per power of two: the relative error of a percentile is below 1/32
MAX_MICROSECONDS = 1 << 36  # 19 hours: latencies beyond are counted in the last bucket
MAX_SECONDS = 3600  # per-second points kept for the plot
# Spells kept per kind and consumer: at most one per message (a consumer waits or holds at most
# once per message it gets), so runs of 100,000 messages or fewer keep every one; 1.6 MB a kind.
MAX_SPELLS = 100_000


class SequenceBitmap:
    """Which of a producer's `count` sequence numbers have been seen."""

    __slots__ = ("bits", "count", "highest", "out_of_order")

    def __init__(self, count: int, bits: bytes | None = None) -> None:
        self.count = count
        self.bits = bytearray(bits) if bits is not None else bytearray((count + 7) // 8)
        self.highest = -1
        self.out_of_order = 0

    def add(self, seq: int) -> bool:
        """Record `seq`; False when it was already seen (a duplicate)."""
        byte, mask = seq >> 3, 1 << (seq & 7)
        if self.bits[byte] & mask:
            return False
        self.bits[byte] |= mask
        if seq < self.highest:
            self.out_of_order += 1
        else:
            self.highest = seq
        return True

    def seen(self) -> int:
        return int.from_bytes(self.bits, "little").bit_count()

    def missing(self) -> list[int]:
        """The sequence numbers not seen (for tests and small runs: it is as long as the gap)."""
        return [seq for seq in range(self.count) if not self.bits[seq >> 3] & (1 << (seq & 7))]

    def union(self, other: SequenceBitmap) -> int:
        """Merge `other` into this one; returns how many of its bits were already set here."""
        # Whole bitmaps as integers: one C-speed AND and OR instead of a loop over bytes.
        mine, theirs = int.from_bytes(self.bits, "little"), int.from_bytes(other.bits, "little")
        self.bits = bytearray((mine | theirs).to_bytes(len(self.bits), "little"))
        return (mine & theirs).bit_count()


def bucket_of(micros: int) -> int:
    """The histogram bucket of a latency in microseconds."""
    micros = min(max(micros, 0), MAX_MICROSECONDS)
    if micros < SUB_BUCKETS:
        return micros
    shift = micros.bit_length() - 6  # so that micros >> shift lies in [32, 64)
    return (shift + 1) * SUB_BUCKETS + (micros >> shift) - SUB_BUCKETS


def bucket_floor(index: int) -> int:
    """The smallest latency (microseconds) that falls in bucket `index`."""
    if index < SUB_BUCKETS:
        return index
    shift = index // SUB_BUCKETS - 1
    return (index % SUB_BUCKETS + SUB_BUCKETS) << shift


BUCKETS = bucket_of(MAX_MICROSECONDS) + 1


@dataclass
class LatencyHistogram:
    counts: list[int] = field(default_factory=lambda: [0] * BUCKETS)
    total: int = 0
    maximum: int = 0  # microseconds, exact

    def record(self, micros: int) -> None:
        self.counts[bucket_of(micros)] += 1
        self.total += 1
        self.maximum = max(self.maximum, micros)

    def merge(self, other: LatencyHistogram) -> None:
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.total += other.total
        self.maximum = max(self.maximum, other.maximum)

    def percentile(self, percent: float) -> int:
        """The latency (microseconds) at or below which `percent` of the samples lie.

        Answers the upper edge of the bucket holding that rank (never more than the exact
        maximum), so the figure errs high by at most one bucket's width, never low.
        """
        if self.total == 0:
            return 0
        rank = max(1, -(-self.total * percent // 100))
        running = 0
        for index, count in enumerate(self.counts):
            running += count
            if running >= rank:
                return min(bucket_floor(index + 1) - 1, self.maximum)
        return self.maximum


@dataclass
class Series:
    """Per-second received counts and latency (sum and maximum, microseconds), for the plot."""

    received: list[int] = field(default_factory=list)
    latency_sum: list[int] = field(default_factory=list)
    latency_max: list[int] = field(default_factory=list)

    def record(self, second: int, micros: int) -> None:
        second = min(max(second, 0), MAX_SECONDS - 1)
        while len(self.received) <= second:
            self.received.append(0)
            self.latency_sum.append(0)
            self.latency_max.append(0)
        self.received[second] += 1
        self.latency_sum[second] += micros
        self.latency_max[second] = max(self.latency_max[second], micros)

    def merge(self, other: Series) -> None:
        for second, count in enumerate(other.received):
            if count:
                self.record(second, 0)  # makes room; the extra count is taken back below
                self.received[second] += count - 1
                self.latency_sum[second] += other.latency_sum[second]
                self.latency_max[second] = max(self.latency_max[second], other.latency_max[second])


@dataclass
class Spells:
    """Spans of monotonic time (nanoseconds), added in order and not overlapping one another.

    Past MAX_SPELLS, a new spell is merged into the last one, which then also covers the gap
    between them: memory stays bounded, and a total read from the spells can only err high."""

    starts: array[int] = field(default_factory=lambda: array("q"))
    ends: array[int] = field(default_factory=lambda: array("q"))

    def add(self, start: int, end: int) -> None:
        if end <= start:
            return
        if len(self.starts) >= MAX_SPELLS:
            self.ends[-1] = end
            return
        self.starts.append(start)
        self.ends.append(end)

    def __len__(self) -> int:
        return len(self.starts)

    def pairs(self) -> Iterator[tuple[int, int]]:
        return zip(self.starts, self.ends, strict=True)

    def total(self, start: int, end: int) -> int:
        """Nanoseconds covered between `start` and `end`."""
        return sum(max(0, min(e, end) - max(s, start)) for s, e in self.pairs())


def union(spells: Iterable[Spells]) -> list[tuple[int, int]]:
    """The spans covered by any of `spells`, sorted and merged."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(pair for one in spells for pair in one.pairs()):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def overlap(spells: Spells, others: Iterable[Spells], start: int, end: int) -> int:
    """Nanoseconds between `start` and `end` in which `spells` and any of `others` both ran."""
    covered = union(others)
    total, first = 0, 0
    for spell_start, spell_end in spells.pairs():
        s, e = max(spell_start, start), min(spell_end, end)
        if e <= s:
            continue
        while first < len(covered) and covered[first][1] <= s:
            first += 1  # spells are in order: what ended before this one ends before the next
        index = first
        while index < len(covered) and covered[index][0] < e:
            total += min(e, covered[index][1]) - max(s, covered[index][0])
            index += 1
    return total
