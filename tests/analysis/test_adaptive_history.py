"""The Spark job and the rules on hand-written histories (tests/analysis/histories.py): where
consumerFlowLimit=auto is recommended and where not, the windows the broker chose where it is
already auto, deadline misses and deliveryOrder=deadline, the three report formats, and history
written before any of these fields existed.

One local Spark session for the module (it takes 10-20 s to start on two cores).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
from pyspark.sql import SparkSession

from sluiceway.analysis import job, report
from sluiceway.analysis.command import headline
from sluiceway.analysis.options import Options
from sluiceway.analysis.results import Collected, ConsumerStats, DestinationStats
from sluiceway.analysis.rules import Recommendation, recommend_all
from sluiceway.analysis.session import find_java, spark_session
from sluiceway.analysis.summary import Analysis
from tests.analysis import histories as h

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),  # the first test pays for Spark's start
    pytest.mark.skipif(
        find_java() is None,
        reason="Spark needs Java 17 or later: no java in JAVA_HOME or on the PATH",
    ),
]

POOL: Final = 8  # --pool-size for ADAPTIVE: above the smallest window the broker chose there
AUTO: Final = -2


@dataclass(frozen=True)
class Analysed:
    collected: Collected
    analysis: Analysis
    summary: dict[str, Any]
    page: str


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    with spark_session("local[2]", {}) as session:
        yield session


def analysed(spark: SparkSession, directory: Path, *, older: bool) -> Analysed:
    paths = h.write(directory, older=older)
    collected = job.run(spark, paths, None, None, "test history")
    options = Options(
        history=str(directory), out=str(directory / "report"), pool_sizes={h.ADAPTIVE: POOL}
    )
    analysis = Analysis(
        options=options,
        files=1,
        generated_ms=h.T0 + 60_000,
        collected=collected,
        recommendations=recommend_all(collected, options.imbalance_ratio, options.pool_size),
    )
    page, summary = report.write(analysis, Path(options.out))
    return Analysed(collected, analysis, json.loads(summary.read_text()), page.read_text())


@pytest.fixture(scope="module")
def current(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Analysed:
    return analysed(spark, tmp_path_factory.mktemp("history"), older=False)


@pytest.fixture(scope="module")
def older(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Analysed:
    return analysed(spark, tmp_path_factory.mktemp("older"), older=True)


def stats_of(run: Analysed, name: str) -> DestinationStats:
    (found,) = [d for d in run.collected.destinations if d.destination == name]
    return found


def consumer_of(run: Analysed, label: str) -> ConsumerStats:
    (found,) = [c for c in run.collected.consumers if c.label == label]
    return found


def advice_for(run: Analysed, name: str) -> Recommendation:
    (found,) = [r for r in run.analysis.recommendations if r.destination == name]
    return found


def summary_of(run: Analysed, section: str, name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [r for r in run.summary[section] if r["destination"] == name]
    (row,) = found
    return row


def rules_of(recommendation: Recommendation) -> list[str]:
    return [f.rule for f in recommendation.findings]


def test_the_job_measures_how_each_consumer_worked(current: Analysed) -> None:
    slow, fast = consumer_of(current, "1/slow"), consumer_of(current, "2/fast")
    # 2 messages in each of 35 intervals it held messages at both ends; 40 in each of 5.
    assert (slow.busy_consumed, slow.busy_s, slow.busy_intervals) == (70, 35.0, 35)
    assert (fast.busy_consumed, fast.busy_s, fast.busy_intervals) == (200, 5.0, 5)
    assert (slow.working_rate, fast.working_rate) == (2.0, 40.0)
    assert (slow.outstanding_p90, fast.outstanding_p90) == (100, 40)
    assert (slow.window_auto, slow.pace_ms, slow.window_cap) == (False, None, 100)
    assert consumer_of(current, "3/quick").outstanding_p90 == 2
    assert consumer_of(current, "6/idle").working_rate is None  # never held a message
    assert stats_of(current, h.MIXED).stranded_s == 30.0


def test_consumers_of_very_different_speeds_get_auto(current: Analysed) -> None:
    advice = advice_for(current, h.MIXED)
    assert rules_of(advice) == ["mixed-speeds"]
    assert (advice.destination_limit, advice.limit, advice.limit_changed) == (100, AUTO, True)
    assert advice.fixed_limit == 100  # no other rule moved the number
    (finding,) = advice.findings
    assert (finding.setting, finding.value) == ("consumerFlowLimit", "auto")
    for said in (
        "1/slow takes 500 ms a message (2.0 messages/s consumed while it had messages",
        "2/fast 25.0 ms (40.0 messages/s",
        "20.0 times faster (mixed from 4)",
        "for 30 s a consumer sat empty while another held up to 100 unconsumed messages",
        "with its window of 100 full: 50 s of its work held by one client",
        "Set consumerFlowLimit=auto",
    ):
        assert said in finding.reason, finding.reason


def test_an_idle_window_beside_a_full_one_gets_auto(current: Analysed) -> None:
    advice = advice_for(current, h.ROOMY)
    assert rules_of(advice) == ["idle-window"]
    assert advice.limit == AUTO
    reason = advice.findings[0].reason
    assert "3/quick held at most 2 unconsumed messages in 90% of the samples" in reason
    assert "with a window of 500" in reason
    assert "4/stuck was paused by flow control for" in reason
    assert "(99% of its time)" in reason  # 35.5 s of 36


def test_a_limit_that_shifts_with_the_load_gets_auto_with_the_number_kept(
    current: Analysed,
) -> None:
    advice = advice_for(current, h.TIDAL)
    assert rules_of(advice) == ["uneven-distribution", "shifting-load"]
    assert (advice.limit, advice.fixed_limit) == (AUTO, 2)  # 4 held over 2 consumers, overall
    shifting = advice.findings[1]
    for said in (
        "consumerFlowLimit=2 (uneven-distribution) suits /queue/tidal's range as a whole",
        "over 6 periods, the backlog's fair share (median held over the active consumers) was "
        "2 (10:00:00-10:00:05 UTC) to 40 (10:00:24-10:00:29 UTC), 20.0 times as much",
    ):
        assert said in shifting.reason, shifting.reason
    periods = [p for p in current.collected.slices if p.destination == h.TIDAL]
    assert [(p.samples, p.median_held, p.consumers) for p in periods] == [
        (6, 4.0, 2.0),
        (6, 4.0, 2.0),
        (6, 4.0, 2.0),
        (6, 4.0, 2.0),
        (6, 80.0, 2.0),
        (6, 80.0, 2.0),
    ]


def test_even_consumers_of_one_speed_keep_their_number(current: Analysed) -> None:
    advice = advice_for(current, h.STEADY)
    assert advice.findings == ()
    assert (advice.limit, advice.limit_changed, advice.fixed_limit) == (100, False, None)
    assert advice.note.startswith("no rule fired (2 consumer(s)")
    assert headline(advice) == ""


def test_an_auto_destination_reports_the_windows_the_broker_chose(current: Analysed) -> None:
    advice = advice_for(current, h.ADAPTIVE)
    assert (advice.destination_limit, advice.limit, advice.limit_changed) == (AUTO, AUTO, False)
    assert [(c.label, c.window_low, c.window_high, c.window_cap) for c in advice.adaptive] == [
        ("8/hare", 16, 162, 1000),
        ("7/tortoise", 4, 16, 1000),
    ]
    tortoise = consumer_of(current, "7/tortoise")
    assert (tortoise.pace_ms, tortoise.round_trip_ms, tortoise.window_limit) == (30.0, 1.2, 4)
    assert advice.chosen.startswith(
        "the broker sized the windows of 2 consumer(s) between 4 and 162 messages (cap 1000): "
        "8/hare windows 16 to 162 at 0.1 ms a message, 7/tortoise windows 4 to 16 at 30.0 ms"
    )
    # No fixed number is proposed for it; the pool of handlers is the one thing to fix.
    (pool,) = advice.findings
    assert (pool.rule, pool.setting, pool.value) == ("limit-below-pool", "consumer-pool-size", 8)
    assert "7/tortoise on /queue/adaptive as small as 4 messages" in pool.reason
    assert "consumer-pool-size:8 on SUBSCRIBE" in pool.reason


def test_deadline_misses_are_counted_per_destination(current: Analysed) -> None:
    quotes = stats_of(current, h.QUOTES)
    assert (quotes.delivery_order, quotes.expired, quotes.consumed_late) == ("fifo", 35, 7)
    assert (quotes.msgs_in, quotes.deadline_misses, quotes.miss_share) == (1050, 42, 0.04)
    assert stats_of(current, h.SLA).deadline_misses == 0
    ordered = stats_of(current, h.ORDERED)
    assert (ordered.delivery_order, ordered.deadline_misses) == ("deadline", 70)
    assert stats_of(current, h.ROOMY).delivery_order == ""  # topics have none


def test_a_fifo_queue_that_missed_deadlines_is_told_about_deadline_order(
    current: Analysed,
) -> None:
    advice = advice_for(current, h.QUOTES)
    assert rules_of(advice) == ["deadline-misses"]
    assert (advice.delivery_order, advice.recommended_order, advice.order_changed) == (
        "fifo",
        "deadline",
        True,
    )
    reason = advice.findings[0].reason
    for said in (
        "42 deadline misses: 35 expired before delivery and 7 acknowledged after their "
        "deadline, 4.0% of the 1,050 messages received",
        "Set deliveryOrder=deadline",
        "when the deadlines are mixed",
        "fifo order already is earliest deadline first",
        "Those acknowledged late (7) were delivered in time",
    ):
        assert said in reason, reason
    for name in (h.SLA, h.ORDERED):  # no misses; already in deadline order
        kept = advice_for(current, name)
        assert kept.findings == ()
        assert not kept.order_changed
    assert "70 deadline misses" in advice_for(current, h.ORDERED).misses


def test_the_summary_carries_the_new_advice(current: Analysed) -> None:
    mixed = summary_of(current, "recommendations", h.MIXED)
    assert mixed["consumerFlowLimit"] == {
        "destination": 100,
        "window_in_use": 100,
        "recommended": AUTO,
        "changed": True,
        "text": "auto",
        "fixed_alternative": 100,
    }
    assert mixed["rules"][0]["value"] == "auto"
    quotes = summary_of(current, "recommendations", h.QUOTES)
    assert quotes["deliveryOrder"] == {"in_use": "fifo", "recommended": "deadline", "changed": True}
    assert quotes["rules"][0]["value"] == "deadline"
    assert summary_of(current, "destinations", h.QUOTES)["deadline_misses"] == {
        "expired": 35,
        "consumed_late": 7,
        "total": 42,
        "share_of_received": 0.04,
    }
    assert summary_of(current, "recommendations", h.ROOMY)["deliveryOrder"] is None
    adaptive = summary_of(current, "recommendations", h.ADAPTIVE)
    assert adaptive["adaptive_windows"][1] == {
        "consumer": "7/tortoise",
        "window_now": 4,
        "window_cap": 1000,
        "window_low": 4,
        "window_high": 16,
        "pace_ms": 30.0,
        "pace_low_ms": 30.0,
        "pace_high_ms": 30.0,
        "round_trip_ms": 1.2,
    }
    assert adaptive["chosen_windows"].startswith("the broker sized the windows of 2 consumer(s)")
    (fast,) = [c for c in current.summary["consumers"] if c["subscription"] == "fast"]
    assert (fast["working_rate"], fast["outstanding_p90"], fast["window_auto"]) == (40.0, 40, False)


def test_the_page_shows_auto_windows_and_deadline_misses(current: Analysed) -> None:
    page = current.page
    assert 'recommended <span class="changed">auto</span>; to keep a fixed number, 2' in page
    assert 'deliveryOrder: fifo; recommended <span class="changed">deadline</span>' in page
    assert "<h2>Windows the broker sized</h2>" in page
    assert (
        "<tr><td>/queue/adaptive</td><td>7/tortoise</td><td>4 to 16</td><td>4</td><td>1000</td>"
        '<td class="n">30.0</td><td>30.0</td><td class="n">1.2</td><td class="n">74</td></tr>'
    ) in page
    assert "<h2>Deadline misses</h2>" in page
    assert (
        '<tr><td>/queue/quotes</td><td>fifo</td><td class="n">35</td><td class="n">7</td>'
        '<td class="n">42</td><td class="n">4.0</td></tr>'
    ) in page
    assert "<td>/queue/sla</td>" not in page.split("<h2>Deadline misses</h2>")[1]
    # A destination kept as it is still shows its misses.
    assert '<li>/queue/ordered: <span class="note">no consumers in the range analysed' in page
    assert "nothing to judge the flow settings by; 70 deadline misses: 70 expired" in page


def test_the_terminal_lines_name_the_new_settings(current: Analysed) -> None:
    lines = {r.destination: headline(r) for r in current.analysis.recommendations}
    assert lines[h.MIXED] == "/queue/mixed: consumerFlowLimit 100 -> auto (mixed-speeds)"
    assert lines[h.TIDAL] == (
        "/queue/tidal: consumerFlowLimit 100 -> auto (or 2) (shifting-load, uneven-distribution)"
    )
    assert lines[h.ADAPTIVE] == (
        "/queue/adaptive: consumer-pool-size:8 on SUBSCRIBE (limit-below-pool); "
        "auto windows of 4 to 162 messages for 2 consumer(s)"
    )
    assert lines[h.QUOTES].startswith(
        "/queue/quotes: deliveryOrder fifo -> deadline (deadline-misses); 42 deadline misses: "
    )
    assert lines[h.ORDERED].startswith("/queue/ordered: 70 deadline misses: 70 expired")


def test_rows_without_the_new_fields_read_as_unknown(current: Analysed) -> None:
    legacy = stats_of(current, h.LEGACY)
    assert (legacy.expired, legacy.consumed_late, legacy.delivery_order) == (None, None, "")
    old = consumer_of(current, "11/old")
    assert (old.window_auto, old.window_cap, old.pace_ms, old.round_trip_ms) == (
        False,
        None,
        None,
        None,
    )
    assert advice_for(current, h.LEGACY).findings == ()
    assert summary_of(current, "destinations", h.LEGACY)["deadline_misses"] is None


def test_older_history_still_analyses(older: Analysed) -> None:
    assert all(d.deadline_misses is None for d in older.collected.destinations)
    assert not any(c.window_auto for c in older.collected.consumers)
    # The rules that need only the older fields still fire; deadlines are not guessed at.
    assert rules_of(advice_for(older, h.MIXED)) == ["mixed-speeds"]
    assert rules_of(advice_for(older, h.TIDAL)) == ["uneven-distribution", "shifting-load"]
    quotes = advice_for(older, h.QUOTES)
    assert (quotes.findings, quotes.misses, quotes.delivery_order) == ((), "", "")
    assert summary_of(older, "recommendations", h.QUOTES)["deliveryOrder"] is None
    assert "Not recorded: the history was written by a broker that did not count them." in (
        older.page
    )
    assert "None: no consumer had an adaptive window." in older.page
