"""What a consumer holds and when it idles (`Occupancy`), and the spells arithmetic that says how
long one consumer idled while another held messages it had not started: clock readings given by
hand, no broker and no event loop."""

from __future__ import annotations

import pytest

from sluiceway.bench import accounting
from sluiceway.bench.accounting import Spells, overlap, union
from sluiceway.bench.occupancy import Occupancy

pytestmark = pytest.mark.timeout(30)


def spells(*pairs: tuple[int, int]) -> Spells:
    found = Spells()
    for start, end in pairs:
        found.add(start, end)
    return found


def test_held_counts_from_the_read_to_the_ack_written_and_keeps_its_peak() -> None:
    occupancy = Occupancy(1, lambda: True, spells=False)
    occupancy.arrived(3)  # one read brings three
    occupancy.released(1)  # the first one's ACK is written
    occupancy.arrived(0)
    occupancy.arrived(2)
    assert (occupancy.held, occupancy.peak) == (4, 4)
    occupancy.released(4)
    occupancy.arrived(1)
    assert (occupancy.held, occupancy.peak) == (1, 4)


def test_idle_time_counts_only_while_the_run_counts_it() -> None:
    counting = [False]
    occupancy = Occupancy(100, lambda: counting[0], spells=True)
    occupancy.count_idle(150)  # before the producers start: not counted
    counting[0] = True
    occupancy.busy(170)  # idle from 150 (already looked at) to 170: 20 counted
    occupancy.idle(200)
    occupancy.idle(210)  # idle already: the spell still starts at 200
    occupancy.count_idle(260)  # the poll: 60 more
    counting[0] = False  # the parent said stop
    occupancy.busy(300)
    assert occupancy.idle_ns == 80
    assert occupancy.idle_spells is not None
    assert list(occupancy.idle_spells.pairs()) == [(100, 170), (200, 300)]


def test_waiting_spells_run_while_received_messages_wait_to_be_started() -> None:
    occupancy = Occupancy(1, lambda: True, spells=True)
    occupancy.waiting(10, 0)
    occupancy.waiting(20, 3)
    occupancy.waiting(25, 2)  # still waiting: the spell goes on
    occupancy.waiting(40, 0)
    occupancy.waiting(50, 1)
    occupancy.busy(55)
    occupancy.close(70)  # the run ends: the open spell ends with it
    assert occupancy.waiting_spells is not None
    assert list(occupancy.waiting_spells.pairs()) == [(20, 40), (50, 70)]


def test_without_spells_nothing_is_kept_but_the_totals() -> None:
    occupancy = Occupancy(1, lambda: True, spells=False)
    occupancy.busy(11)
    occupancy.waiting(12, 1)
    occupancy.close(20)
    assert occupancy.idle_ns == 10
    assert occupancy.idle_spells is None
    assert occupancy.waiting_spells is None


def test_overlap_is_the_time_idle_while_any_other_consumer_held_messages() -> None:
    idle = spells((0, 10), (20, 30), (40, 60))
    # Two others, their spells overlapping each other: counted once.
    held = [spells((5, 25)), spells((22, 28), (45, 50), (55, 100))]
    assert union(held) == [(5, 28), (45, 50), (55, 100)]
    # 5..10, 20..28, 45..50, 55..60
    assert overlap(idle, held, 0, 1000) == 5 + 8 + 5 + 5
    # Only what lies in the run counts: from 8 to 57 that is 2 + 8 + 5 + 2.
    assert overlap(idle, held, 8, 57) == 2 + 8 + 5 + 2
    assert overlap(idle, [], 0, 1000) == 0


def test_spells_past_the_bound_merge_into_the_last(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(accounting, "MAX_SPELLS", 2)
    kept = spells((0, 1), (2, 3), (5, 6), (8, 9))
    assert list(kept.pairs()) == [(0, 1), (2, 9)]  # errs high, never low
    assert kept.total(0, 100) == 8
    kept.add(10, 10)  # empty: nothing
    assert len(kept) == 2
