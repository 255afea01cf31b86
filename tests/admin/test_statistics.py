"""The table of a destination's counters and the places that show them agree."""

from __future__ import annotations

import dataclasses

from sluiceway.admin.metrics import Rates
from sluiceway.admin.model import Totals
from sluiceway.admin.statistics import DESTINATION_STATISTICS, TRAFFIC
from sluiceway.core.model.destination import DestinationStats


def test_the_api_totals_have_one_field_per_counter_in_the_table_order() -> None:
    names = [statistic.name for statistic in DESTINATION_STATISTICS]
    assert [field.name for field in dataclasses.fields(Totals)] == names


def test_the_traffic_counters_are_the_rates_in_their_order() -> None:
    assert [statistic.name for statistic in TRAFFIC] == [
        field.name for field in dataclasses.fields(Rates)
    ]


def test_each_counter_reads_its_own_field() -> None:
    stats = DestinationStats()
    # Every statistic but the one derived from two counters is a field of its own.
    counters = [s for s in DESTINATION_STATISTICS if s.name != "deadline_misses"]
    for value, statistic in enumerate(counters, start=1):
        setattr(stats, statistic.name, value)
    assert [statistic.read(stats) for statistic in counters] == list(range(1, len(counters) + 1))
    (misses,) = [s for s in DESTINATION_STATISTICS if s.name == "deadline_misses"]
    assert misses.read(stats) == stats.expired + stats.late
