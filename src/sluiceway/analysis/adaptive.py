"""consumerFlowLimit=auto: where the history shows that one fixed window cannot suit a
destination's consumers, and which windows the broker chose where it already sizes them.

With `auto` the broker sizes each consumer's window from what it measures of that consumer: its
pace (time per message) and its round trip, so that it holds enough to stay busy until its next
top-up and no more (docs/flow-control.md, "Windows the broker sizes: auto"). A fixed number is
one window for every consumer and every load. Each rule below finds a case where that one number
is wrong for someone, from consumers with fixed windows (not ack:auto, not backups, not already
adaptive), on a destination whose consumerFlowLimit is not auto:

- `mixed-speeds` (queues): of the consumers that were there together (those the distribution
  compares), the slowest takes SPEED_RATIO times as long per message as the fastest, and it
  cost something: a consumer sat empty for an interval or more while another
  held unconsumed messages and none waited in the queue (stranded), or the slowest was paused by
  flow control for an interval or more with a full window of MIN_HELD_WORK_S or more of its work.
  A consumer's time per message is the broker's measure of its pace where the history has one
  (adaptive windows; queues under dispatchPolicy=fair), otherwise the messages it consumed per
  second over the intervals between samples that both saw it holding unconsumed messages (it
  had work throughout), from two such intervals or more. A consumer without them has no time
  per message and is not compared. A window small enough for the slow consumer sends the
  fast one batches too small, one large enough for the fast one lets the slow one hoard.
- `idle-window`: a consumer with a window of MIN_IDLE_WINDOW or more held at most IDLE_SHARE of
  it in 90 % of the samples (its client must still be ready to buffer all of it), while another
  was paused by flow control (its window used up) for PAUSED_SHARE of its time or more: the same
  number is far more than one needs and all that the other can hold.
- `shifting-load`: another rule proposes a fixed limit (the backlog's fair share, or a limit for
  two top-ups a second), and worked out on each of the equal periods the range is cut into
  (traffic.SLICES, each with MIN_SLICE_SAMPLES samples or more) it changes SHIFT_RATIO-fold and
  by MIN_SHIFT messages or more: the right number moves with the load. An adaptive window is
  sized from the consumer's own pace and round trip, so it needs no retuning when the load
  changes.

Where windows are already adaptive the report gives, per consumer, the range of windows the
broker chose, its cap, and the paces and round trips it measured. A pool of handlers behind
each consumer (--pool-size) is a floor the broker keeps only when the consumer declares it
(`consumer-pool-size` on SUBSCRIBE): `limit-below-pool` says so when the windows chosen were
below it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Final

from sluiceway.analysis.findings import (
    AUTO,
    LIMIT,
    POOL_SIZE,
    Finding,
    limit_text,
    paced_limit,
    prefetching,
)
from sluiceway.analysis.results import ConsumerStats, DestinationStats, LoadSlice
from sluiceway.config.properties import AUTO_FLOW_LIMIT

SPEED_RATIO: Final = 4.0  # slowest / fastest time per message at which speeds are "mixed"
MIN_HELD_WORK_S: Final = 1.0  # a full window of the slowest holds this much of its work or more
MIN_IDLE_WINDOW: Final = 50  # messages: a smaller window costs a client little memory
IDLE_SHARE: Final = 0.25  # held at most this share of its window in 90 % of the samples
PAUSED_SHARE: Final = 0.1  # of its time paused by flow control: it runs into its window
SHIFT_RATIO: Final = 4.0  # largest / smallest per-period limit at which the load "shifts"
MIN_SHIFT: Final = 10  # messages between them, so that 1 against 4 is not a shift
MIN_SLICES: Final = 3  # periods with a value, to speak of a change over time
MIN_SLICE_SAMPLES: Final = 3
MAX_NAMED: Final = 3  # consumers a sentence names; it counts the others
UNEVEN: Final = "uneven-distribution"
SMALL_BATCHES: Final = "batches-too-small"


def is_auto(stats: DestinationStats) -> bool:
    return stats.consumer_flow_limit == AUTO_FLOW_LIMIT


def fixed_windows(consumers: list[ConsumerStats]) -> list[ConsumerStats]:
    """Consumers whose window is a fixed number that consumerFlowLimit=auto would size."""
    return [c for c in prefetching(consumers) if not c.window_auto and not c.backup]


def adaptive_windows(consumers: list[ConsumerStats]) -> list[ConsumerStats]:
    """Consumers whose windows the broker sized."""
    return [c for c in consumers if c.window_auto and not c.backup]


def _ms(value: float) -> str:
    return f"{value:,.1f} ms" if value < 100 else f"{value:,.0f} ms"


def time_per_message(consumer: ConsumerStats) -> tuple[float, str] | None:
    """Its time per message in ms, and where the figure comes from; None when unknown."""
    if consumer.pace_ms is not None and consumer.pace_ms > 0:
        return consumer.pace_ms, "the broker's measure of its pace"
    rate = consumer.working_rate
    if rate is not None and rate > 0:
        return 1000 / rate, f"{rate:,.1f} messages/s consumed while it had messages to work on"
    return None


def _held_work(consumer: ConsumerStats, pace_ms: float) -> float | None:
    """Seconds of its work in a full window; None when the window is unlimited."""
    return consumer.window_limit * pace_ms / 1000 if consumer.window_limit > 0 else None


def _harm(
    stats: DestinationStats, slow: ConsumerStats, slow_ms: float, interval_s: float
) -> list[str]:
    said = []
    if stats.stranded_s >= interval_s:
        said.append(
            f"for {stats.stranded_s:.0f} s a consumer sat empty while another held up to "
            f"{stats.stranded_peak} unconsumed messages and none waited in the queue"
        )
    work = _held_work(slow, slow_ms)
    if slow.paused_s >= interval_s and work is not None and work >= MIN_HELD_WORK_S:
        said.append(
            f"{slow.label} was paused by flow control for {slow.paused_s:.0f} s with its window "
            f"of {slow.window_limit} full: {work:,.0f} s of its work held by one client, which "
            "the faster consumers could have taken"
        )
    return said


def mixed_speeds(
    stats: DestinationStats, consumers: list[ConsumerStats], interval_s: float
) -> Finding | None:
    if stats.type != "queue":
        return None
    # Only consumers that were there together (those the distribution compares).
    together = [c for c in fixed_windows(consumers) if c.share is not None]
    timed = [(t, c) for c in together if (t := time_per_message(c)) is not None]
    if len(timed) < 2:
        return None
    (slow_ms, slow_from), slow = max(timed, key=lambda pair: pair[0][0])
    (fast_ms, fast_from), fast = min(timed, key=lambda pair: pair[0][0])
    ratio = slow_ms / fast_ms
    if ratio < SPEED_RATIO:
        return None
    harm = _harm(stats, slow, slow_ms, interval_s)
    if not harm:
        return None
    return Finding(
        "mixed-speeds",
        LIMIT,
        AUTO,
        f"the consumers of {stats.destination} work at very different speeds: {slow.label} "
        f"takes {_ms(slow_ms)} a message ({slow_from}) and {fast.label} {_ms(fast_ms)} "
        f"({fast_from}), {ratio:,.1f} times faster (mixed from {SPEED_RATIO:g}); "
        + "; and ".join(harm)
        + ". One consumerFlowLimit cannot suit both: a window small enough for the slow "
        "consumer sends the fast one batches too small to stay busy, one large enough for the "
        "fast one lets the slow one hoard. Set consumerFlowLimit=auto: the broker sizes each "
        "consumer's window from its own pace and round trip.",
    )


def idle_window(
    stats: DestinationStats, consumers: list[ConsumerStats], interval_s: float
) -> Finding | None:
    fixed = [c for c in fixed_windows(consumers) if c.window_limit > 0]
    idle = [
        c
        for c in fixed
        if c.window_limit >= MIN_IDLE_WINDOW
        and c.delivered > 0
        and c.outstanding_p90 is not None
        and c.outstanding_p90 <= c.window_limit * IDLE_SHARE
    ]
    paused = [
        c
        for c in fixed
        if c.paused_s >= interval_s
        and c.present_s > 0
        and c.paused_s / c.present_s >= PAUSED_SHARE
        and c not in idle
    ]
    if not idle or not paused:
        return None
    roomy = max(idle, key=lambda c: c.window_limit - (c.outstanding_p90 or 0))
    full = max(paused, key=lambda c: c.paused_s / c.present_s)
    return Finding(
        "idle-window",
        LIMIT,
        AUTO,
        f"on {stats.destination}, {roomy.label} held at most {roomy.outstanding_p90} "
        f"unconsumed messages in 90% of the samples, with a window of {roomy.window_limit} "
        f"(its client must still be ready to buffer all {roomy.window_limit}), while "
        f"{full.label} was paused by flow control for {full.paused_s:.0f} s "
        f"({full.paused_s / full.present_s:.0%} of its time) with its window of "
        f"{full.window_limit} used up. A fixed window is far more than one needs and all the "
        "other can hold. Set consumerFlowLimit=auto: the broker gives each consumer the "
        "window its pace and round trip call for.",
    )


def _clock(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%H:%M:%S")


def _period_limit(period: LoadSlice, rule: str, threshold: int, pool: int | None) -> int | None:
    """The limit `rule` would propose for the load of one period; None without that load."""
    consumers = period.consumers
    if period.samples < MIN_SLICE_SAMPLES or consumers is None or consumers <= 0:
        return None
    if rule == UNEVEN:
        if period.median_held is None:
            return None  # nothing held: any window would do
        value = max(1, math.ceil(period.median_held / consumers))
    else:
        if period.out_rate is None or period.out_rate <= 0 or threshold >= 100:
            return None
        value = paced_limit(period.out_rate / consumers, threshold)
    return value if pool is None else max(value, pool)


def shifting_load(
    stats: DestinationStats,
    periods: Sequence[LoadSlice],
    proposed: Finding | None,
    threshold: int,
    pool: int | None,
) -> Finding | None:
    if proposed is None or proposed.rule not in (UNEVEN, SMALL_BATCHES):
        return None
    valued = [
        (value, period)
        for period in periods
        if (value := _period_limit(period, proposed.rule, threshold, pool)) is not None
    ]
    if len(valued) < MIN_SLICES:
        return None
    low, low_at = min(valued, key=lambda pair: pair[0])
    high, high_at = max(valued, key=lambda pair: pair[0])
    if high < SHIFT_RATIO * low or high - low < MIN_SHIFT:
        return None
    measure = (
        "the backlog's fair share (median held over the active consumers)"
        if proposed.rule == UNEVEN
        else "the limit for two top-ups a second at the consumers' rate"
    )
    return Finding(
        "shifting-load",
        LIMIT,
        AUTO,
        f"consumerFlowLimit={proposed.value} ({proposed.rule}) suits {stats.destination}'s "
        f"range as a whole, but its load changed: over {len(valued)} periods, {measure} was "
        f"{low} ({_clock(low_at.start_ms)}-{_clock(low_at.end_ms)} UTC) to {high} "
        f"({_clock(high_at.start_ms)}-{_clock(high_at.end_ms)} UTC), {high / low:,.1f} times "
        f"as much (shifting from {SHIFT_RATIO:g}). A fixed number suits one load. Set "
        "consumerFlowLimit=auto: the broker sizes each consumer's window from its own pace "
        "and round trip, so that a slow consumer holds few messages and a fast one enough to "
        "stay busy whatever the backlog, and it needs no retuning as the load changes.",
    )


def pool_advice(pool: int) -> str:
    """What a consumer served by `pool` handlers should declare so that its adaptive window is
    never smaller than the pool."""
    return (
        f"declare the {pool} handlers with {POOL_SIZE}:{pool} on SUBSCRIBE (pool_size={pool} "
        "in Sluiceway's client): the broker never sizes a window below the pool it declares"
    )


def pool_below_windows(
    stats: DestinationStats, adaptive: list[ConsumerStats], pool: int | None
) -> Finding | None:
    """Adaptive windows smaller than the pool of handlers the operator says serve a consumer:
    the consumer did not declare the pool, so the broker could not keep to it."""
    if pool is None:
        return None
    small = [c for c in adaptive if c.window_low is not None and c.window_low < pool]
    if not small:
        return None
    smallest = min(small, key=lambda c: c.window_low or 0)
    return Finding(
        "limit-below-pool",
        POOL_SIZE,
        pool,
        f"the broker sized the window of {smallest.label} on {stats.destination} as small as "
        f"{smallest.window_low} messages, below the pool of {pool} handlers (--pool-size): at "
        f"most {smallest.window_low} of them could work at once. The consumers did not say "
        f"how many handlers serve them: {pool_advice(pool)}.",
    )


def _window_range(consumer: ConsumerStats) -> str:
    low, high = consumer.window_low, consumer.window_high
    if low is None or high is None:
        return f"window {limit_text(consumer.window_limit)}"
    return f"window {low}" if low == high else f"windows {low} to {high}"


def describe_chosen(adaptive: list[ConsumerStats]) -> str:
    """The windows the broker chose, in one sentence: their range and, for a few consumers,
    each one's range and pace."""
    if not adaptive:
        return ""
    lows = [c.window_low for c in adaptive if c.window_low is not None]
    highs = [c.window_high for c in adaptive if c.window_high is not None]
    caps = sorted({limit_text(c.window_cap) for c in adaptive if c.window_cap is not None})
    span = ""
    if lows and highs:
        low, high = min(lows), max(highs)
        span = f" of {low} messages" if low == high else f" between {low} and {high} messages"
    cap = f" (cap {', '.join(caps)})" if caps else ""
    named = []
    for consumer in adaptive[:MAX_NAMED]:
        pace = "" if consumer.pace_ms is None else f" at {_ms(consumer.pace_ms)} a message"
        named.append(f"{consumer.label} {_window_range(consumer)}{pace}")
    others = len(adaptive) - MAX_NAMED
    more = f" and {others} more" if others > 0 else ""
    return (
        f"the broker sized the windows of {len(adaptive)} consumer(s){span}{cap}: "
        + ", ".join(named)
        + more
    )
