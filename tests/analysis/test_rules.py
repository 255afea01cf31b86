"""The recommendation rules on hand-made measurements: when each fires, what it proposes, and
the numbers its reason gives."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from sluiceway.analysis.findings import LIMIT, THRESHOLD
from sluiceway.analysis.results import ConsumerStats, DestinationStats, Distribution
from sluiceway.analysis.rules import (
    Recommendation,
    RuleSettings,
    is_uneven,
    recommend,
)

QUEUE = "/queue/orders"
INTERVAL_S = 1.0


def destination(**changes: Any) -> DestinationStats:
    base = DestinationStats(
        destination=QUEUE,
        type="queue",
        msgs_in=3000,
        msgs_out=3000,
        mean_in_rate=50.0,
        mean_out_rate=50.0,
        peak_in_rate=200.0,
        peak_out_rate=200.0,
        peak_msgs=600,
        peak_pending=100,
        median_held=90.0,
        pending_share=0.2,
        max_consumers=3,
        consumer_flow_limit=1000,
        dispatch_policy="openmq",
        limit_behavior="REJECT_NEWEST",
        stranded_s=0.0,
        stranded_peak=0,
        paused_s=0.0,
        held_s=0.0,
        held_episodes=0,
    )
    return dataclasses.replace(base, **changes)


def consumer(subscription: str, **changes: Any) -> ConsumerStats:
    base = ConsumerStats(
        destination=QUEUE,
        connection=1,
        subscription=subscription,
        run=1,
        ack="client-individual",
        backup=False,
        window_limit=1000,
        window_threshold=50,
        delivered=1000,
        share=None,
        present_s=60.0,
        paused_s=0.0,
        pause_episodes=0,
        longest_pause_s=0.0,
        starved_s=0.0,
        max_outstanding=10,
    )
    return dataclasses.replace(base, **changes)


def spread(
    max_share: float, min_share: float, delivered: int = 3000, consumers: int = 3
) -> Distribution:
    return Distribution(
        destination=QUEUE,
        consumers=consumers,
        delivered=delivered,
        max_share=max_share,
        min_share=min_share,
        max_consumer="1/slow",
        min_consumer="3/fast",
    )


def hoarding() -> tuple[DestinationStats, list[ConsumerStats], Distribution]:
    """A slow consumer with a window of 1000 took 70 % of a queue whose backlog is ~90."""
    stats = destination(stranded_s=42.0, stranded_peak=640)
    consumers = [
        consumer("slow", window_limit=1000, delivered=2100, share=0.7, max_outstanding=640),
        consumer("fast1", window_limit=100, delivered=600, share=0.2),
        consumer("fast2", window_limit=100, delivered=300, share=0.1),
    ]
    return stats, consumers, spread(0.7, 0.1)


def advise(
    stats: DestinationStats,
    consumers: list[ConsumerStats],
    distribution: Distribution | None = None,
    settings: RuleSettings | None = None,
) -> Recommendation:
    return recommend(stats, consumers, distribution, settings or RuleSettings(), INTERVAL_S)


def rules_of(recommendation: Recommendation) -> list[str]:
    return [f.rule for f in recommendation.findings]


def test_a_hoarding_slow_consumer_gets_a_lower_limit_with_the_numbers() -> None:
    stats, consumers, distribution = hoarding()
    advice = advise(stats, consumers, distribution)
    assert rules_of(advice) == ["uneven-distribution"]
    assert advice.limit == 30  # the median of 90 held, over 3 consumers
    assert (advice.destination_limit, advice.window_in_use) == (1000, 1000)
    assert advice.limit_changed
    (finding,) = advice.findings
    assert (finding.setting, finding.value) == (LIMIT, 30)
    for number in (
        "70%",
        "10%",
        "max/min 7.0",
        "42 s",
        "640",
        "1000 messages",
        "median of 90",
        "30 each",
        "consumerFlowLimit=30",
        "dispatchPolicy=fair",
    ):
        assert number in finding.reason


def test_the_fair_policy_is_not_suggested_again() -> None:
    stats, consumers, distribution = hoarding()
    advice = advise(dataclasses.replace(stats, dispatch_policy="fair"), consumers, distribution)
    assert "dispatchPolicy" not in advice.findings[0].reason


@pytest.mark.parametrize(
    ("max_share", "min_share", "uneven"),
    [(0.4, 0.25, False), (0.5, 0.25, True), (0.6, 0.0, True), (0.34, 0.33, False)],
)
def test_uneven_means_the_ratio_reaches_the_setting_or_someone_got_nothing(
    max_share: float, min_share: float, uneven: bool
) -> None:
    assert is_uneven(spread(max_share, min_share), 2.0) is uneven


def test_too_few_messages_say_nothing_about_the_spread() -> None:
    assert not is_uneven(spread(0.9, 0.05, delivered=19), 2.0)
    stats, consumers, _ = hoarding()
    assert advise(stats, consumers, spread(0.9, 0.05, delivered=19)).findings == ()


def test_the_imbalance_ratio_is_a_setting() -> None:
    stats, consumers, distribution = hoarding()
    lenient = RuleSettings(imbalance_ratio=8.0)
    assert advise(stats, consumers, distribution, lenient).findings == ()


def test_an_uneven_spread_without_anyone_idle_reflects_speed_not_the_limit() -> None:
    stats, consumers, distribution = hoarding()
    advice = advise(dataclasses.replace(stats, stranded_s=0.0), consumers, distribution)
    assert advice.findings == ()
    assert advice.limit == 1000
    assert "no rule fired" in advice.note
    assert "max/min 7.0" in advice.note


def test_windows_no_larger_than_the_backlog_are_not_the_cause() -> None:
    stats, consumers, distribution = hoarding()
    small = [dataclasses.replace(c, window_limit=20) for c in consumers]
    assert advise(stats, small, distribution).findings == ()


def test_topics_have_no_distribution_rule() -> None:
    stats, consumers, distribution = hoarding()
    topic = dataclasses.replace(stats, destination="/topic/prices", type="topic")
    assert advise(topic, consumers, distribution).findings == ()


def test_the_pool_size_bounds_the_lower_limit() -> None:
    stats, consumers, distribution = hoarding()
    advice = advise(stats, consumers, distribution, RuleSettings(pool_size=32))
    assert rules_of(advice) == ["uneven-distribution"]
    assert advice.limit == 32
    assert "Not below the pool of 32 handlers" in advice.findings[0].reason


def test_a_pool_as_large_as_the_windows_leaves_the_fair_policy_as_the_fix() -> None:
    stats, consumers, distribution = hoarding()
    advice = advise(stats, consumers, distribution, RuleSettings(pool_size=1000))
    assert advice.limit == 1000
    assert not advice.limit_changed
    assert "set dispatchPolicy=fair" in advice.findings[0].reason


def test_a_limit_below_the_pool_caps_its_concurrency() -> None:
    stats = destination(consumer_flow_limit=16)
    consumers = [consumer("mdb", window_limit=16)]
    advice = advise(stats, consumers, None, RuleSettings(pool_size=32))
    assert rules_of(advice) == ["limit-below-pool"]
    assert advice.limit == 32
    reason = advice.findings[0].reason
    assert "32 handlers" in reason
    assert "at most 16 of them can work at once" in reason


def test_no_pool_size_given_no_pool_rule() -> None:
    stats = destination(consumer_flow_limit=16)
    assert advise(stats, [consumer("mdb", window_limit=16)]).findings == ()


def test_a_threshold_near_100_shrinks_the_batches() -> None:
    consumers = [consumer("eager", window_limit=100, window_threshold=95)]
    advice = advise(destination(), consumers)
    assert rules_of(advice) == ["threshold-near-100"]
    assert (advice.threshold_in_use, advice.threshold) == (95, 50)
    assert advice.threshold_changed
    assert advice.findings[0].setting == THRESHOLD
    assert "batches of 5 messages" in advice.findings[0].reason
    assert "would be 50 to 100" in advice.findings[0].reason


def test_a_high_threshold_on_a_tiny_window_changes_little() -> None:
    consumers = [consumer("tiny", window_limit=5, window_threshold=100)]
    assert advise(destination(), consumers).findings == ()


def test_a_threshold_near_0_fires_only_when_the_consumer_ran_dry() -> None:
    dry = consumer("lazy", window_limit=100, window_threshold=5, starved_s=12.0)
    advice = advise(destination(), [dry])
    assert rules_of(advice) == ["threshold-near-0"]
    assert advice.threshold == 50
    assert "down to 5 unconsumed" in advice.findings[0].reason
    assert "sat empty for 12 s" in advice.findings[0].reason
    never_dry = dataclasses.replace(dry, starved_s=0.0)
    assert advise(destination(), [never_dry]).findings == ()


def test_small_batches_under_a_backlog_get_a_larger_limit() -> None:
    # 600 messages/s through a window of 10 at 50 %: batches of 5, 120 top-ups a second.
    busy = consumer("busy", window_limit=10, delivered=36000, present_s=60.0)
    stats = destination(pending_share=0.9, consumer_flow_limit=10)
    advice = advise(stats, [busy])
    assert rules_of(advice) == ["batches-too-small"]
    assert advice.limit == 600  # 300 per batch: two top-ups a second
    reason = advice.findings[0].reason
    assert "120.0 top-ups a second" in reason
    assert "the destination's consumerFlowLimit" in reason


def test_small_batches_the_consumer_asked_for_are_raised_on_the_consumer() -> None:
    busy = consumer("busy", window_limit=10, delivered=36000, present_s=60.0)
    advice = advise(destination(pending_share=0.9), [busy])
    assert advice.findings[0].value == 600
    assert advice.limit == 1000  # the destination's cap already allows it
    assert "the consumers' consumer-flow-limit" in advice.findings[0].reason


def test_small_batches_are_not_raised_past_the_fair_share_of_a_shared_queue() -> None:
    busy = [
        consumer(f"c{n}", window_limit=10, delivered=36000, present_s=60.0, share=0.5)
        for n in range(2)
    ]
    stats = destination(pending_share=0.9, consumer_flow_limit=10, median_held=80.0)
    advice = advise(stats, busy, spread(0.5, 0.5, consumers=2))
    assert advice.limit == 40  # 80 held over 2 consumers


def test_without_a_backlog_small_batches_are_not_the_bottleneck() -> None:
    busy = consumer("busy", window_limit=10, delivered=36000, present_s=60.0)
    assert advise(destination(pending_share=0.1), [busy]).findings == ()


def test_auto_ack_consumers_are_not_judged_by_their_window() -> None:
    auto = consumer("auto", ack="auto", window_limit=100, window_threshold=99)
    assert advise(destination(), [auto]).findings == ()


def test_an_unlimited_window_starts_from_the_open_mq_default() -> None:
    stats = destination(consumer_flow_limit=-1)
    advice = advise(stats, [consumer("greedy", window_limit=-1, max_outstanding=5000)])
    assert rules_of(advice) == ["unlimited-window"]
    assert (advice.destination_limit, advice.limit) == (-1, 1000)
    assert "held up to 5000 unconsumed" in advice.findings[0].reason


def test_an_unlimited_hoarder_gets_the_fair_share() -> None:
    stats, consumers, distribution = hoarding()
    stats = dataclasses.replace(stats, consumer_flow_limit=-1)
    consumers[0] = dataclasses.replace(consumers[0], window_limit=-1)
    advice = advise(stats, consumers, distribution)
    assert rules_of(advice) == ["unlimited-window", "uneven-distribution"]
    assert advice.limit == 30
    assert "The largest window was unlimited" in advice.findings[1].reason


def test_no_consumers_no_advice() -> None:
    advice = advise(destination(), [])
    assert advice.findings == ()
    assert (advice.limit, advice.threshold, advice.threshold_in_use) == (1000, 50, None)
    assert advice.note.startswith("no consumers in the range")
