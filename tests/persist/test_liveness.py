"""Which journal records are live (persist.liveness), against a model that searches every time:
lookups below the newest segment go through a one-segment cache, which must never answer for
the wrong segment as segments come and go."""

from __future__ import annotations

import bisect
import random

import pytest

from sluiceway.persist.liveness import Liveness, LivenessError


class Model:
    """Segments as a sorted list of bases, each with the set of its live LSNs and its count."""

    def __init__(self) -> None:
        self.bases: list[int] = []
        self.live: dict[int, set[int]] = {}
        self.total: dict[int, int] = {}

    def base_of(self, lsn: int) -> int | None:
        index = bisect.bisect_right(self.bases, lsn)
        return self.bases[index - 1] if index else None


@pytest.mark.parametrize("seed", range(5))
def test_lookups_agree_with_a_search_as_segments_come_and_go(seed: int) -> None:
    rng = random.Random(seed)
    live, model = Liveness(), Model()
    next_lsn = 1
    for _ in range(3000):
        step = rng.random()
        if step < 0.05 or not model.bases:  # a rotation: a new segment at the next LSN
            live.add_segment(next_lsn)
            if next_lsn not in model.live:
                bisect.insort(model.bases, next_lsn)
                model.live[next_lsn], model.total[next_lsn] = set(), 0
        elif step < 0.08 and len(model.bases) > 1:  # the oldest segment deleted
            oldest = model.bases.pop(0)
            del model.live[oldest], model.total[oldest]
            live.drop_segment(oldest)
        elif step < 0.6:
            alive = rng.random() < 0.7
            live.born(next_lsn, live=alive)
            base = model.base_of(next_lsn)
            assert base is not None
            model.total[base] += 1
            if alive:
                model.live[base].add(next_lsn)
            next_lsn += 1
        else:
            lsn = rng.randrange(1, next_lsn + 1)
            base = model.base_of(lsn)
            expected = base is not None and lsn in model.live[base]
            assert live.is_live(lsn) == expected
            assert live.segment_of(lsn) == base
            if base is not None and expected and rng.random() < 0.5:
                live.kill(lsn)
                model.live[base].discard(lsn)
        for base in model.bases:
            assert live.counts(base) == (len(model.live[base]), model.total[base])
    for base in model.bases:
        lsns = list(range(base, next_lsn))
        among = live.live_among(base, lsns)
        assert {lsns[i] for i in among} == model.live[base]


def test_a_record_is_born_once_in_order() -> None:
    live = Liveness()
    live.add_segment(1)
    live.born(1)
    live.born(4, live=False)  # a compacted segment's gap
    with pytest.raises(LivenessError, match="registered once, in LSN order"):
        live.born(3)
    live.add_segment(10)
    live.drop_segment(1)
    with pytest.raises(LivenessError, match="below the oldest segment"):
        live.born(5)
    assert live.counts(1) is None
    live.born(10)
    live.compacted(10)
    assert live.counts(10) == (1, 1)
