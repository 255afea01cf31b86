"""Recommended consumerFlowLimit and consumerFlowThreshold per destination, and why.

The rules put the tuning advice of Open MQ's documentation (the flow-control article on
message-driven beans, spec-docs/002, and the Admin Guide's "Client Runtime Message Flow
Adjustments" and "Adjusting Multiple-Consumer Queue Delivery", spec-docs/004) into numbers
measured from the history. Each rule that fires names itself, the setting, the value it
proposes and the numbers that made it fire:

- `unlimited-window`: a window without a limit lets one client buffer without bound and take a
  whole queue; start from Open MQ's default of 1000 messages.
- `uneven-distribution`: a queue's consumers got very different shares, messages sat in one
  consumer's window while another had none, and the windows were larger than the backlog spread
  over the consumers. Batches go to the first ready consumer, so a large limit with slow
  consumers lets one take everything; lower the limit to the backlog's fair share per consumer.
- `batches-too-small`: consumers topped up many times a second while messages waited in the
  destination: each batch costs a round trip, so raise the limit (never past what would make the
  distribution uneven on a shared queue).
- `limit-below-pool`: the limit is below the number of handlers (an MDB pool) that share one
  consumer, which caps how many of them work at once; raise it to the pool size. This bounds
  every other rule: no recommendation goes below the pool size.
- `threshold-near-100`: a threshold close to 100 % tops the window up after a few consumed
  messages, in tiny batches; go back to 50 %.
- `threshold-near-0`: a threshold close to 0 % lets the consumer run dry before the next batch
  arrives, and it did (it sat empty while messages waited); go back to 50 %.

Where one fixed number cannot suit the consumers, the limit recommended is `auto`, the window
the broker sizes per consumer (`mixed-speeds`, `idle-window`, `shifting-load`: adaptive.py); the
number the rules above found is then kept as the fixed alternative. A destination already on
`auto` gets no fixed number: the report gives the windows the broker chose. A FIFO queue that
missed deadlines is told about `deliveryOrder=deadline` (`deadline-misses`: deadlines.py).

The limit recommended is the destination's `consumerFlowLimit`, which caps every consumer (the
smaller of it and the consumer's own `consumer-flow-limit` wins); the threshold is set by the
consumers (`consumer-flow-threshold`, Open MQ's `imqConsumerFlowThreshold`). Pipeline readers
(cursor groups, lease groups) take messages in batches they size themselves: no flow setting
governs them, so a destination drained only by them keeps its settings, and its note says so.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from sluiceway.analysis import adaptive, deadlines
from sluiceway.analysis.findings import (
    DELIVERY_ORDER,
    LIMIT,
    MAX_REFILLS_PER_S,
    THRESHOLD,
    Finding,
    paced_limit,
    prefetching,
)
from sluiceway.analysis.results import (
    Collected,
    ConsumerStats,
    DestinationStats,
    Distribution,
    LoadSlice,
    ReaderStats,
)
from sluiceway.config.properties import AUTO_FLOW_LIMIT
from sluiceway.core.values.flow import (
    DEFAULT_CONSUMER_FLOW_LIMIT,
    DEFAULT_CONSUMER_FLOW_THRESHOLD,
    resume_count,
)

# Fewer messages than this over a queue's compared consumers say nothing about the spread.
MIN_DELIVERED_FOR_SHARES: Final = 20
HIGH_THRESHOLD: Final = 90  # percent and above: "close to 100 %"
LOW_THRESHOLD: Final = 10  # percent and below: "close to 0 %"
# Below this limit even an extreme threshold changes the batch by a message or two.
MIN_LIMIT_FOR_THRESHOLD: Final = 10
# "Messages waited in the destination" for most of the time: consumers were the bottleneck.
BACKLOG_SHARE: Final = 0.5
MAX_NAMED_READERS: Final = 3  # pipeline readers a note names; it counts the others


@dataclass(frozen=True, slots=True)
class RuleSettings:
    imbalance_ratio: float = 2.0  # max/min share at or above which a queue counts as uneven
    pool_size: int | None = None  # handlers sharing one consumer, when the operator said


@dataclass(frozen=True, slots=True)
class Recommendation:
    destination: str
    destination_limit: int  # its consumerFlowLimit now; -1: unlimited; AUTO_FLOW_LIMIT: auto
    window_in_use: int | None  # its consumers' largest effective window (-1: unlimited)
    limit: int  # recommended consumerFlowLimit (-1: unlimited, when kept so; AUTO_FLOW_LIMIT)
    threshold_in_use: int | None  # the threshold most of its consumers used
    threshold: int  # recommended consumerFlowThreshold, percent
    findings: tuple[Finding, ...]
    note: str  # what was looked at, when no rule fired
    # When auto is recommended: the fixed consumerFlowLimit the other rules arrived at, for a
    # destination that must keep a number.
    fixed_limit: int | None = None
    adaptive: tuple[ConsumerStats, ...] = ()  # consumers whose windows the broker sized
    chosen: str = ""  # those windows in one sentence
    delivery_order: str = ""  # queues: in use (fifo | deadline); "" unknown or a topic
    recommended_order: str = ""  # as delivery_order, or deadline when a rule says so
    misses: str = ""  # its deadline misses in words; "" when none were recorded

    @property
    def limit_changed(self) -> bool:
        return self.limit != self.destination_limit

    @property
    def threshold_changed(self) -> bool:
        return self.threshold_in_use is not None and self.threshold != self.threshold_in_use

    @property
    def order_changed(self) -> bool:
        return self.recommended_order != self.delivery_order


def _windows(consumers: list[ConsumerStats]) -> list[int]:
    return [c.window_limit for c in consumers]


def _largest(windows: list[int]) -> int | None:
    """The largest window, -1 if any is unlimited, None if there are none."""
    if not windows:
        return None
    return -1 if any(w <= 0 for w in windows) else max(windows)


def _threshold_of(consumer: ConsumerStats) -> int:
    if consumer.window_threshold is None:
        return DEFAULT_CONSUMER_FLOW_THRESHOLD
    return consumer.window_threshold


def _batch(limit: int, threshold: int) -> int:
    """Messages in one top-up: L minus the unconsumed count at which the window refills."""
    return limit - resume_count(limit, threshold)


def fair_share(stats: DestinationStats, consumers: int) -> int:
    """The backlog spread over the consumers: the median held, divided by their number."""
    return max(1, math.ceil(stats.median_held / max(1, consumers)))


def unlimited_window(stats: DestinationStats, consumers: list[ConsumerStats]) -> Finding | None:
    if stats.consumer_flow_limit > 0:
        return None
    unbounded = [c for c in prefetching(consumers) if c.window_limit <= 0]
    if not unbounded:
        return None
    return Finding(
        "unlimited-window",
        LIMIT,
        DEFAULT_CONSUMER_FLOW_LIMIT,
        f"{stats.destination} has no consumerFlowLimit and {len(unbounded)} consumer(s) asked "
        f"for no limit (e.g. {unbounded[0].label}, which held up to "
        f"{unbounded[0].max_outstanding} unconsumed messages): a client then buffers without "
        "bound and, on a queue, one consumer can take every message. Start from Open MQ's "
        f"default, consumerFlowLimit={DEFAULT_CONSUMER_FLOW_LIMIT}.",
    )


def is_uneven(spread: Distribution, imbalance_ratio: float) -> bool:
    """Enough messages to judge, and the largest share at least `imbalance_ratio` times the
    smallest (or a compared consumer got nothing)."""
    if spread.delivered < MIN_DELIVERED_FOR_SHARES:
        return False
    ratio = spread.ratio
    return ratio is None or ratio >= imbalance_ratio


def uneven_distribution(
    stats: DestinationStats,
    consumers: list[ConsumerStats],
    spread: Distribution | None,
    settings: RuleSettings,
) -> Finding | None:
    if stats.type != "queue" or spread is None or not is_uneven(spread, settings.imbalance_ratio):
        return None
    ratio = spread.ratio
    compared = [c for c in consumers if c.share is not None]
    largest = _largest(_windows(compared))
    fair = fair_share(stats, spread.consumers)
    if largest is None or 0 < largest <= fair:
        return None  # the windows are no larger than the backlog: the limit is not the cause
    if stats.stranded_s <= 0 and spread.min_share > 0:
        return None  # nobody sat idle beside a full window: the spread reflects speed
    window = "unlimited" if largest <= 0 else f"{largest} messages"
    ratio_text = "one got none" if ratio is None else f"max/min {ratio:.1f}"
    reason = (
        f"uneven distribution on {stats.destination}: {spread.max_consumer} got "
        f"{spread.max_share:.0%} of the {spread.delivered} messages and {spread.min_consumer} "
        f"{spread.min_share:.0%} ({ratio_text}; uneven from {settings.imbalance_ratio:g}). For "
        f"{stats.stranded_s:.0f} s a consumer sat empty while another held up to "
        f"{stats.stranded_peak} unconsumed messages and none waited in the queue. The largest "
        f"window was {window}, while the queue held a median of {stats.median_held:.0f} "
        f"messages over {spread.consumers} consumers ({fair} each): batches go to the first "
        "ready consumer, so with windows larger than the backlog a slow consumer hoards what "
        "the others could process (Open MQ: slow consumers want small batches)."
    )
    value = fair
    pool = settings.pool_size
    if pool is not None and pool > value:
        value = pool
        if 0 < largest <= value:
            return Finding(
                "uneven-distribution",
                LIMIT,
                stats.consumer_flow_limit,
                reason + f" A limit below the pool of {pool} handlers would cap their "
                "concurrency, so keep the limit and set dispatchPolicy=fair on the queue.",
            )
        reason += f" Not below the pool of {pool} handlers (--pool-size)."
    advice = f" Set consumerFlowLimit={value}"
    if stats.dispatch_policy == "openmq":
        advice += ", or dispatchPolicy=fair to give each message to the least busy consumer"
    return Finding("uneven-distribution", LIMIT, value, reason + advice + ".")


def batches_too_small(
    stats: DestinationStats, consumers: list[ConsumerStats], spread: Distribution | None
) -> Finding | None:
    if stats.pending_share < BACKLOG_SHARE:
        return None  # consumers were mostly waiting for messages, not for top-ups
    busiest: tuple[float, ConsumerStats, int] | None = None
    for consumer in prefetching(consumers):
        limit, threshold = consumer.window_limit, _threshold_of(consumer)
        if limit <= 0 or threshold >= HIGH_THRESHOLD:
            continue  # unlimited, or the threshold rule explains the small batches
        refills = consumer.rate / _batch(limit, threshold)
        if busiest is None or refills > busiest[0]:
            busiest = (refills, consumer, threshold)
    if busiest is None or busiest[0] < MAX_REFILLS_PER_S:
        return None
    refills, consumer, threshold = busiest
    value = paced_limit(consumer.rate, threshold)
    if stats.type == "queue" and spread is not None:
        # On a shared queue a window past the fair share brings back uneven distribution.
        value = min(value, max(consumer.window_limit, fair_share(stats, spread.consumers)))
    if value <= consumer.window_limit:
        return None
    where = (
        "the destination's consumerFlowLimit"
        if 0 < stats.consumer_flow_limit <= consumer.window_limit
        else "the consumers' consumer-flow-limit (imqConsumerFlowLimit)"
    )
    return Finding(
        "batches-too-small",
        LIMIT,
        value,
        f"{consumer.label} on {stats.destination} consumed {consumer.rate:.0f} messages/s with "
        f"a window of {consumer.window_limit} and a threshold of {threshold} %: batches of "
        f"{_batch(consumer.window_limit, threshold)}, {refills:.1f} top-ups a second, while "
        f"messages waited in the destination {stats.pending_share:.0%} of the time. Each batch "
        f"costs a round; raise {where} to {value} (Open MQ: a low limit sends smaller batches "
        "and can lower throughput).",
    )


def limit_below_pool(
    stats: DestinationStats, consumers: list[ConsumerStats], proposed: int, pool: int | None
) -> Finding | None:
    if pool is None:
        return None
    fixed = [c for c in prefetching(consumers) if not c.window_auto]
    windows = [w for w in _windows(fixed) if w > 0]
    smallest = min([*windows, proposed] if proposed > 0 else windows, default=None)
    if smallest is None or smallest >= pool:
        return None
    return Finding(
        "limit-below-pool",
        LIMIT,
        pool,
        f"each consumer of {stats.destination} is served by {pool} handlers (--pool-size) but "
        f"its window would be {smallest} messages: at most {smallest} of them can work at once. "
        f"Keep consumerFlowLimit at or above the pool size, {pool} (Open MQ's flow-control "
        "article: a limit below the MDB pool size caps its concurrency).",
    )


def threshold_near_100(stats: DestinationStats, consumers: list[ConsumerStats]) -> Finding | None:
    for consumer in prefetching(consumers):
        limit, threshold = consumer.window_limit, _threshold_of(consumer)
        if threshold >= HIGH_THRESHOLD and limit >= MIN_LIMIT_FOR_THRESHOLD:
            return Finding(
                "threshold-near-100",
                THRESHOLD,
                DEFAULT_CONSUMER_FLOW_THRESHOLD,
                f"{consumer.label} on {stats.destination} uses a threshold of {threshold} % "
                f"with a window of {limit}: the broker tops it up once it has consumed "
                f"{_batch(limit, threshold)}, in batches of {_batch(limit, threshold)} messages "
                "(Open MQ: a threshold close to 100 % sends smaller batches and can lower "
                f"throughput). At {DEFAULT_CONSUMER_FLOW_THRESHOLD} % the batches would be "
                f"{_batch(limit, DEFAULT_CONSUMER_FLOW_THRESHOLD)} to {limit}.",
            )
    return None


def threshold_near_0(
    stats: DestinationStats, consumers: list[ConsumerStats], interval_s: float
) -> Finding | None:
    for consumer in prefetching(consumers):
        limit, threshold = consumer.window_limit, _threshold_of(consumer)
        if (
            threshold <= LOW_THRESHOLD
            and limit >= MIN_LIMIT_FOR_THRESHOLD
            and consumer.starved_s >= interval_s
        ):
            return Finding(
                "threshold-near-0",
                THRESHOLD,
                DEFAULT_CONSUMER_FLOW_THRESHOLD,
                f"{consumer.label} on {stats.destination} uses a threshold of {threshold} % "
                f"with a window of {limit}: it is topped up only once it is down to "
                f"{resume_count(limit, threshold)} unconsumed, and it sat empty for "
                f"{consumer.starved_s:.0f} s while messages waited in the queue (Open MQ: "
                "close to 0 % the client can finish its buffer before the next batch arrives). "
                f"Use {DEFAULT_CONSUMER_FLOW_THRESHOLD} %.",
            )
    return None


def _usual_threshold(consumers: list[ConsumerStats]) -> int | None:
    known = [c.window_threshold for c in consumers if c.window_threshold is not None]
    return Counter(known).most_common(1)[0][0] if known else None


def _current_limit(stats: DestinationStats) -> int:
    value = stats.consumer_flow_limit
    return value if value > 0 or value == AUTO_FLOW_LIMIT else -1


def _fixed_limit_rules(
    stats: DestinationStats,
    consumers: list[ConsumerStats],
    spread: Distribution | None,
    settings: RuleSettings,
) -> tuple[list[Finding], int, Finding | None]:
    """The rules that propose a number: their findings, the limit they arrive at, and the one
    that sized it to the load (uneven-distribution or batches-too-small), if any."""
    findings: list[Finding] = []
    limit = _current_limit(stats)
    unlimited = unlimited_window(stats, consumers)
    if unlimited is not None:
        findings.append(unlimited)
        limit = int(unlimited.value)
    proposed = uneven_distribution(stats, consumers, spread, settings)
    if proposed is not None:
        findings.append(proposed)
        value = int(proposed.value)
        limit = value if limit <= 0 else min(limit, value)
    else:
        proposed = batches_too_small(stats, consumers, spread)
        if proposed is not None:
            findings.append(proposed)
            limit = max(limit, int(proposed.value)) if limit > 0 else limit
    below_pool = limit_below_pool(stats, consumers, limit, settings.pool_size)
    if below_pool is not None:
        findings.append(below_pool)
        limit = max(limit, int(below_pool.value)) if limit > 0 else limit
    return findings, limit, proposed


def _auto_rules(
    stats: DestinationStats,
    consumers: list[ConsumerStats],
    proposed: Finding | None,
    *,
    pool: int | None,
    interval_s: float,
    threshold: int,
    periods: Sequence[LoadSlice],
) -> list[Finding]:
    """The rules that recommend consumerFlowLimit=auto (adaptive.py); the first reason also
    says how to keep the pool of handlers the operator named."""
    found = [
        finding
        for finding in (
            adaptive.mixed_speeds(stats, consumers, interval_s),
            adaptive.idle_window(stats, consumers, interval_s),
            adaptive.shifting_load(stats, periods, proposed, threshold, pool),
        )
        if finding is not None
    ]
    if found and pool is not None:
        first = found[0]
        found[0] = dataclasses.replace(
            first, reason=f"{first.reason} With auto, {adaptive.pool_advice(pool)}."
        )
    return found


def recommend(
    stats: DestinationStats,
    consumers: list[ConsumerStats],
    spread: Distribution | None,
    settings: RuleSettings,
    interval_s: float,
    *,
    readers: list[ReaderStats] | None = None,
    periods: Sequence[LoadSlice] = (),
) -> Recommendation:
    """Apply every rule to one destination's measurements; `readers` (its pipeline readers)
    only explain, in the note, what drained it; `periods` is its load over the range, cut into
    equal periods (traffic.SLICES)."""
    current = _current_limit(stats)
    threshold_in_use = _usual_threshold(consumers)
    threshold = (
        threshold_in_use if threshold_in_use is not None else DEFAULT_CONSUMER_FLOW_THRESHOLD
    )
    sized = adaptive.adaptive_windows(consumers)
    findings: list[Finding] = []
    limit, fixed_limit = current, None
    if not adaptive.is_auto(stats):
        findings, limit, proposed = _fixed_limit_rules(stats, consumers, spread, settings)
        automatic = _auto_rules(
            stats,
            consumers,
            proposed,
            pool=settings.pool_size,
            interval_s=interval_s,
            threshold=threshold,
            periods=periods,
        )
        if automatic:
            findings.extend(automatic)
            limit, fixed_limit = AUTO_FLOW_LIMIT, limit
    for rule in (
        adaptive.pool_below_windows(stats, sized, settings.pool_size),
        threshold_near_100(stats, consumers),
        threshold_near_0(stats, consumers, interval_s),
        deadlines.deadline_order(stats, adaptive.is_auto(stats)),
    ):
        if rule is not None:
            findings.append(rule)
            if rule.setting == THRESHOLD:
                threshold = int(rule.value)
    order = next((str(f.value) for f in findings if f.setting == DELIVERY_ORDER), None)
    return Recommendation(
        destination=stats.destination,
        destination_limit=current,
        window_in_use=_largest(_windows(consumers)),
        limit=limit,
        threshold_in_use=threshold_in_use,
        threshold=threshold,
        findings=tuple(findings),
        note="" if findings else _kept(stats, consumers, spread, readers or []),
        fixed_limit=fixed_limit,
        adaptive=tuple(sized),
        chosen=adaptive.describe_chosen(sized),
        delivery_order=stats.delivery_order,
        recommended_order=order or stats.delivery_order,
        misses=deadlines.describe_misses(stats),
    )


def _drained_by(stats: DestinationStats, readers: list[ReaderStats]) -> str:
    """The pipeline readers that drained the destination, named (a few), or "" when none."""
    if not readers:
        count = stats.max_readers
        return f"{count} pipeline reader(s)" if count else ""
    named = ", ".join(reader.label for reader in readers[:MAX_NAMED_READERS])
    others = len(readers) - MAX_NAMED_READERS
    more = f" and {others} more" if others > 0 else ""
    return f"{len(readers)} pipeline reader(s) ({named}{more})"


def _kept(
    stats: DestinationStats,
    consumers: list[ConsumerStats],
    spread: Distribution | None,
    readers: list[ReaderStats],
) -> str:
    drained = _drained_by(stats, readers)
    if not consumers and drained:
        return (
            f"no STOMP consumers in the range analysed; drained by {drained}, which take "
            "messages in batches they size themselves: no flow setting governs them, keep the "
            "current settings"
        )
    if not consumers:
        return "no consumers in the range analysed: nothing to judge the flow settings by"
    parts = [f"{len(consumers)} consumer(s)"]
    if drained:
        parts.append(drained)
    if spread is not None:
        ratio = spread.ratio
        parts.append(
            "shares max/min "
            + ("n/a" if ratio is None else f"{ratio:.1f}")
            + f" over {spread.delivered} messages"
        )
    parts.append(f"paused by flow control {stats.paused_s:.0f} s in total")
    parts.append(f"messages waiting {stats.pending_share:.0%} of the time")
    return "no rule fired (" + ", ".join(parts) + "): keep the current settings"


def recommend_all(
    collected: Collected, imbalance_ratio: float, pool_size: Callable[[str], int | None]
) -> list[Recommendation]:
    """A recommendation for every destination collected, in the same order."""
    consumers: dict[str, list[ConsumerStats]] = {}
    for consumer in collected.consumers:
        consumers.setdefault(consumer.destination, []).append(consumer)
    readers: dict[str, list[ReaderStats]] = {}
    for reader in collected.readers:
        readers.setdefault(reader.destination, []).append(reader)
    spreads = {d.destination: d for d in collected.distributions}
    periods: dict[str, list[LoadSlice]] = {}
    for period in collected.slices:
        periods.setdefault(period.destination, []).append(period)
    return [
        recommend(
            stats,
            consumers.get(stats.destination, []),
            spreads.get(stats.destination),
            RuleSettings(imbalance_ratio=imbalance_ratio, pool_size=pool_size(stats.destination)),
            collected.timeline.interval_s,
            readers=readers.get(stats.destination, []),
            periods=periods.get(stats.destination, []),
        )
        for stats in collected.destinations
    ]
