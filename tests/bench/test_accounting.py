"""The consumer's bounded accounting: sequence bitmaps, the latency histogram, the series."""

from __future__ import annotations

import random

import pytest

from sluiceway.bench.accounting import (
    BUCKETS,
    MAX_MICROSECONDS,
    MAX_SECONDS,
    LatencyHistogram,
    SequenceBitmap,
    Series,
    bucket_floor,
    bucket_of,
)


def test_bitmap_counts_duplicates_and_out_of_order_per_producer() -> None:
    bitmap = SequenceBitmap(10)
    assert [bitmap.add(seq) for seq in (0, 1, 3, 2, 3, 9)] == [True, True, True, True, False, True]
    assert bitmap.out_of_order == 1  # 2 after 3
    assert bitmap.seen() == 5
    assert bitmap.missing() == [4, 5, 6, 7, 8]
    assert len(bitmap.bits) == 2  # one bit per message, whatever arrives


def test_union_reports_the_overlap_as_duplicates_across_consumers() -> None:
    first, second = SequenceBitmap(20), SequenceBitmap(20)
    for seq in range(12):
        first.add(seq)
    for seq in range(10, 20):
        second.add(seq)
    assert first.union(second) == 2  # 10 and 11 were delivered to both
    assert first.seen() == 20
    assert first.missing() == []
    rebuilt = SequenceBitmap(20, bytes(first.bits))
    assert rebuilt.seen() == 20


@pytest.mark.parametrize("micros", [0, 1, 31, 32, 33, 63, 64, 65, 1000, 123_456, 10**9])
def test_a_latency_falls_in_a_bucket_whose_floor_is_at_most_it_and_close(micros: int) -> None:
    index = bucket_of(micros)
    assert bucket_floor(index) <= micros < bucket_floor(index + 1)
    assert bucket_floor(index + 1) - bucket_floor(index) <= max(1, micros // 32)


def test_buckets_are_monotonic_and_bounded() -> None:
    floors = [bucket_floor(index) for index in range(BUCKETS)]
    assert floors == sorted(set(floors))
    assert bucket_of(MAX_MICROSECONDS * 10) == BUCKETS - 1
    assert BUCKETS < 1300


def test_percentiles_are_within_one_bucket_above_the_exact_value() -> None:
    rng = random.Random(7)
    samples = [int(rng.lognormvariate(7, 1.5)) for _ in range(20_000)]
    histogram = LatencyHistogram()
    for sample in samples:
        histogram.record(sample)
    ordered = sorted(samples)
    for percent in (50, 90, 99, 99.9):
        exact = ordered[int(len(ordered) * percent / 100 + 0.999999) - 1]
        estimate = histogram.percentile(percent)
        assert exact <= estimate <= exact + max(1, exact // 16), percent
    assert histogram.maximum == ordered[-1]
    assert histogram.percentile(100) == ordered[-1]


def test_histograms_merge_to_the_same_figures_as_one() -> None:
    whole, first, second = LatencyHistogram(), LatencyHistogram(), LatencyHistogram()
    for value in range(1, 5001):
        whole.record(value)
        (first if value % 2 else second).record(value)
    first.merge(second)
    assert first == whole
    assert LatencyHistogram().percentile(50) == 0


def test_series_merges_per_second_and_stays_bounded() -> None:
    first, second = Series(), Series()
    first.record(0, 100)
    first.record(2, 300)
    second.record(2, 500)
    second.record(MAX_SECONDS * 5, 7)
    first.merge(second)
    assert first.received[:3] == [1, 0, 2]
    assert first.latency_sum[2] == 800
    assert first.latency_max[2] == 500
    assert len(first.received) == MAX_SECONDS
    assert first.received[-1] == 1
