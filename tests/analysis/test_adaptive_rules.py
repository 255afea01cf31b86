"""The rules that recommend consumerFlowLimit=auto or deliveryOrder=deadline, on hand-made
measurements (no Spark): where each fires, where it must not, and the figures its reason names."""

from __future__ import annotations

import dataclasses
from typing import Any, Final

import pytest

from sluiceway.analysis.command import headline
from sluiceway.analysis.deadlines import deadline_order, describe_misses
from sluiceway.analysis.results import ConsumerStats, DestinationStats, Distribution, LoadSlice
from sluiceway.analysis.rules import Recommendation, RuleSettings, recommend
from tests.analysis.test_rules import QUEUE, consumer, destination, hoarding, rules_of

AUTO: Final = -2
T0: Final = 1_774_346_400_000


def advise(
    stats: DestinationStats,
    consumers: list[ConsumerStats],
    periods: list[LoadSlice] | None = None,
    *,
    spread: Distribution | None = None,
    pool_size: int | None = None,
) -> Recommendation:
    settings = RuleSettings(pool_size=pool_size)
    return recommend(stats, consumers, spread, settings, 1.0, periods=periods or [])


def paced(sub: str, pace_ms: float, **changes: Any) -> ConsumerStats:
    """A consumer of QUEUE compared with the others (there with them), its pace measured."""
    return consumer(sub, **({"window_limit": 100, "pace_ms": pace_ms, "share": 0.5} | changes))


def speeds(slow_ms: float = 200.0, fast_ms: float = 10.0, **slow: Any) -> list[ConsumerStats]:
    return [paced("slow", slow_ms, **slow), paced("fast", fast_ms)]


STRANDED: Final[dict[str, Any]] = {"stranded_s": 12.0, "stranded_peak": 80}


def test_mixed_speeds_with_a_consumer_stranded_recommend_auto() -> None:
    advice = advise(destination(**STRANDED), speeds())
    assert rules_of(advice) == ["mixed-speeds"]
    assert (advice.limit, advice.fixed_limit, advice.limit_changed) == (AUTO, 1000, True)
    reason = advice.findings[0].reason
    assert "1/slow takes 200 ms a message (the broker's measure of its pace)" in reason
    assert "1/fast 10.0 ms" in reason
    assert "20.0 times faster" in reason
    assert "for 12 s a consumer sat empty while another held up to 80" in reason


def test_speeds_from_what_a_consumer_got_through_while_it_had_work() -> None:
    together = {"window_limit": 100, "share": 0.5}
    slow = consumer("slow", busy_consumed=20, busy_s=10.0, busy_intervals=10, **together)
    fast = consumer("fast", busy_consumed=90, busy_s=3.0, busy_intervals=3, **together)
    reason = advise(destination(**STRANDED), [slow, fast]).findings[0].reason
    assert "1/slow takes 500 ms a message (2.0 messages/s consumed while it had" in reason
    assert "15.0 times faster" in reason
    # Too few messages, or one interval (maybe a stall), say nothing of a speed.
    for unknown in (
        dataclasses.replace(fast, busy_consumed=4),
        dataclasses.replace(fast, busy_s=1.0, busy_intervals=1),
    ):
        assert advise(destination(**STRANDED), [slow, unknown]).findings == ()


def test_a_full_window_of_the_slowest_is_harm_too() -> None:
    held = speeds(slow_ms=200.0, paused_s=30.0)  # 100 messages at 200 ms: 20 s of work
    reason = advise(destination(), held).findings[0].reason
    assert "1/slow was paused by flow control for 30 s with its window of 100 full" in reason
    assert "20 s of its work held by one client" in reason
    # A window that holds less than a second of work is no harm worth a change.
    quick = speeds(slow_ms=5.0, fast_ms=1.0, paused_s=30.0)
    assert advise(destination(), quick).findings == ()


@pytest.mark.parametrize(
    ("case", "stats", "consumers"),
    [
        ("speeds alike", destination(**STRANDED), speeds(slow_ms=30.0, fast_ms=10.0)),
        ("no harm", destination(), speeds()),
        ("a topic", destination(type="topic", **STRANDED), speeds()),
        ("one timed", destination(**STRANDED), [paced("slow", 200.0), consumer("fast")]),
        (
            "not together",
            destination(**STRANDED),
            [paced("slow", 200.0, share=None), *speeds()[1:]],
        ),
        ("already adaptive", destination(**STRANDED), speeds(window_auto=True)),
        ("auto ack", destination(**STRANDED), speeds(ack="auto")),
    ],
)
def test_mixed_speeds_stays_quiet(
    case: str, stats: DestinationStats, consumers: list[ConsumerStats]
) -> None:
    assert "mixed-speeds" not in rules_of(advise(stats, consumers)), case


def idle_and_paused(window: int = 400, p90: int = 3) -> list[ConsumerStats]:
    return [
        consumer("idle", window_limit=window, outstanding_p90=p90, delivered=500),
        consumer("full", window_limit=window, outstanding_p90=window, paused_s=20.0),
    ]


def test_an_idle_window_beside_a_paused_one_recommends_auto() -> None:
    advice = advise(destination(type="topic"), idle_and_paused())
    assert rules_of(advice) == ["idle-window"]
    reason = advice.findings[0].reason
    assert "1/idle held at most 3 unconsumed messages in 90% of the samples" in reason
    assert "1/full was paused by flow control for 20 s (33% of its time)" in reason


@pytest.mark.parametrize(
    ("case", "consumers"),
    [
        ("small window", idle_and_paused(window=40, p90=0)),
        ("uses a third", idle_and_paused(window=400, p90=120)),
        ("nobody paused", idle_and_paused()[:1]),
        ("unknown use", [dataclasses.replace(idle_and_paused()[0], outstanding_p90=None)]),
    ],
)
def test_an_idle_window_needs_a_large_unused_window_and_a_paused_neighbour(
    case: str, consumers: list[ConsumerStats]
) -> None:
    assert advise(destination(type="topic"), consumers).findings == (), case


def period(n: int, held: float | None, *, samples: int = 6, rate: float = 10.0) -> LoadSlice:
    start = T0 + 6000 * n
    return LoadSlice(QUEUE, start, start + 5000, samples, held, 3.0, rate)


def test_a_fair_share_that_moves_with_the_load_recommends_auto() -> None:
    stats, consumers, spread = hoarding()  # uneven-distribution proposes 30
    periods = [period(0, 15.0), period(1, 30.0), period(2, 240.0), period(3, None)]
    advice = advise(stats, consumers, periods, spread=spread)
    assert rules_of(advice) == ["uneven-distribution", "shifting-load"]
    assert (advice.limit, advice.fixed_limit) == (AUTO, 30)
    reason = advice.findings[1].reason
    assert "consumerFlowLimit=30 (uneven-distribution) suits /queue/orders's range" in reason
    assert "over 3 periods" in reason  # the one without a backlog has no fair share
    assert "was 5 (10:00:00-10:00:05 UTC) to 80 (10:00:12-10:00:17 UTC), 16.0 times" in reason


@pytest.mark.parametrize(
    "periods",
    [
        [period(0, 60.0), period(1, 90.0), period(2, 120.0)],  # twice, not four times
        [period(0, 3.0), period(1, 6.0), period(2, 12.0)],  # four times, but 1 to 4
        [period(0, 15.0), period(1, 240.0)],  # two periods
        [period(0, 15.0), period(1, 240.0), period(2, 240.0, samples=2)],  # one too short
    ],
)
def test_a_steady_or_short_load_keeps_the_number(periods: list[LoadSlice]) -> None:
    stats, consumers, spread = hoarding()
    assert rules_of(advise(stats, consumers, periods, spread=spread)) == ["uneven-distribution"]


def test_a_shifting_load_alone_proposes_nothing() -> None:
    periods = [period(0, 15.0), period(1, 30.0), period(2, 240.0)]
    assert advise(destination(), [consumer("a")], periods).findings == ()


def test_the_pool_is_kept_under_auto() -> None:
    advice = advise(destination(**STRANDED), speeds(), pool_size=16)
    assert advice.limit == AUTO
    assert advice.findings[0].reason.endswith(
        "With auto, declare the 16 handlers with consumer-pool-size:16 on SUBSCRIBE "
        "(pool_size=16 in Sluiceway's client): the broker never sizes a window below the pool "
        "it declares."
    )


def chosen(sub: str, low: int, high: int, pace_ms: float) -> ConsumerStats:
    return consumer(
        sub,
        window_auto=True,
        window_limit=high,
        window_cap=500,
        window_low=low,
        window_high=high,
        pace_ms=pace_ms,
    )


def test_an_auto_destination_gets_no_number_but_its_windows_described() -> None:
    stats, _, spread = hoarding()
    stats = dataclasses.replace(stats, consumer_flow_limit=AUTO, **STRANDED)
    sized = [chosen("slow", 3, 8, 120.0), chosen("fast", 40, 90, 2.5)]
    advice = advise(stats, sized, spread=spread)
    assert advice.findings == ()  # uneven or not, no fixed number is proposed
    assert (advice.destination_limit, advice.limit, advice.limit_changed) == (AUTO, AUTO, False)
    assert advice.chosen == (
        "the broker sized the windows of 2 consumer(s) between 3 and 90 messages (cap 500): "
        "1/slow windows 3 to 8 at 120 ms a message, 1/fast windows 40 to 90 at 2.5 ms a message"
    )
    assert headline(advice) == ("/queue/orders: auto windows of 3 to 90 messages for 2 consumer(s)")
    # Windows above the pool: nothing to declare.
    assert advise(stats, [chosen("a", 20, 40, 5.0)], pool_size=16).findings == ()


def test_misses_on_a_fifo_queue_suggest_deadline_order() -> None:
    stats = destination(delivery_order="fifo", expired=12, consumed_late=0, msgs_in=400)
    finding = deadline_order(stats, adaptive=False)
    assert finding is not None
    assert (finding.rule, finding.setting, finding.value) == (
        "deadline-misses",
        "deliveryOrder",
        "deadline",
    )
    assert "12 deadline misses: 12 expired before delivery and 0 acknowledged" in finding.reason
    assert "3.0% of the 400 messages received" in finding.reason
    assert "acknowledged late (" not in finding.reason  # none were


@pytest.mark.parametrize(
    ("case", "changes"),
    [
        ("no misses", {"delivery_order": "fifo", "expired": 0, "consumed_late": 0}),
        ("deadline already", {"delivery_order": "deadline", "expired": 9, "consumed_late": 1}),
        ("not recorded", {"delivery_order": "fifo"}),
        ("a topic", {"type": "topic", "delivery_order": "", "expired": 9, "consumed_late": 1}),
    ],
)
def test_deadline_order_only_for_a_fifo_queue_that_missed(
    case: str, changes: dict[str, Any]
) -> None:
    assert deadline_order(destination(**changes), adaptive=False) is None, case


def test_late_acknowledgements_point_at_smaller_windows_unless_they_adapt() -> None:
    stats = destination(delivery_order="fifo", expired=0, consumed_late=5, msgs_in=0)
    fixed = deadline_order(stats, adaptive=False)
    assert fixed is not None
    assert "Those acknowledged late (5) were delivered in time" in fixed.reason
    assert "consumerFlowLimit=auto" in fixed.reason
    sized = deadline_order(stats, adaptive=True)
    assert sized is not None
    assert "acknowledged late (" not in sized.reason
    # No message received in the range: no share to give.
    assert describe_misses(stats) == (
        "5 deadline misses: 0 expired before delivery and 5 acknowledged after their deadline"
    )
