"""summary.json: the report's findings as data, for scripts and tests.

Times are ISO 8601 in UTC; durations are seconds; shares are fractions (0 to 1). Lists are
capped as the job caps them, and each has a `..._left_off` count beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sluiceway.analysis.findings import limit_text
from sluiceway.analysis.options import Options
from sluiceway.analysis.results import (
    Collected,
    ConsumerStats,
    DestinationStats,
    Distribution,
    ProducerEpisode,
    ReaderStats,
)
from sluiceway.analysis.rules import Recommendation, is_uneven


@dataclass(frozen=True, slots=True)
class Analysis:
    """Everything one run found: what Spark collected and what the rules made of it."""

    options: Options
    files: int  # history files read (0 when Spark listed a remote directory itself)
    generated_ms: int
    collected: Collected
    recommendations: list[Recommendation]

    def uneven(self) -> list[Distribution]:
        ratio = self.options.imbalance_ratio
        return [d for d in self.collected.distributions if is_uneven(d, ratio)]


def iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _destination(stats: DestinationStats) -> dict[str, Any]:
    return {
        "destination": stats.destination,
        "type": stats.type,
        "msgs_in": stats.msgs_in,
        "msgs_out": stats.msgs_out,
        "mean_in_rate": round(stats.mean_in_rate, 3),
        "mean_out_rate": round(stats.mean_out_rate, 3),
        "peak_in_rate": round(stats.peak_in_rate, 3),
        "peak_out_rate": round(stats.peak_out_rate, 3),
        "peak_msgs": stats.peak_msgs,
        "peak_pending": stats.peak_pending,
        "median_held": stats.median_held,
        "pending_share": round(stats.pending_share, 3),
        "max_consumers": stats.max_consumers,
        "max_pipeline_readers": stats.max_readers,
        "consumer_flow_limit": stats.consumer_flow_limit,
        "dispatch_policy": stats.dispatch_policy or None,
        "limit_behavior": stats.limit_behavior,
        "consumers_paused_s": round(stats.paused_s, 3),
        "producers_held_s": round(stats.held_s, 3),
        "producer_episodes": stats.held_episodes,
        "stranded_s": round(stats.stranded_s, 3),
        "stranded_peak": stats.stranded_peak,
        "delivery_order": stats.delivery_order or None,
        "deadline_misses": _misses(stats),
    }


def _misses(stats: DestinationStats) -> dict[str, Any] | None:
    """None in history written before deadline misses were recorded."""
    if stats.expired is None or stats.consumed_late is None:
        return None
    share = stats.miss_share
    return {
        "expired": stats.expired,
        "consumed_late": stats.consumed_late,
        "total": stats.expired + stats.consumed_late,
        "share_of_received": None if share is None else round(share, 4),
    }


def _optional(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _consumer(consumer: ConsumerStats) -> dict[str, Any]:
    return {
        "destination": consumer.destination,
        "connection": consumer.connection,
        "subscription": consumer.subscription,
        "broker_started": iso(consumer.run) if consumer.run else None,
        "ack": consumer.ack,
        "backup": consumer.backup,
        "window_limit": consumer.window_limit,
        "window_threshold": consumer.window_threshold,
        "delivered": consumer.delivered,
        "share": None if consumer.share is None else round(consumer.share, 4),
        "present_s": round(consumer.present_s, 3),
        "paused_s": round(consumer.paused_s, 3),
        "pause_episodes": consumer.pause_episodes,
        "longest_pause_s": round(consumer.longest_pause_s, 3),
        "starved_s": round(consumer.starved_s, 3),
        "max_outstanding": consumer.max_outstanding,
        "outstanding_p90": consumer.outstanding_p90,
        "working_rate": _optional(consumer.working_rate),
        "window_auto": consumer.window_auto,
        **_window(consumer),
    }


def _window(consumer: ConsumerStats) -> dict[str, Any]:
    """How the broker sized its window (the fields an older history lacks are null)."""
    return {
        "window_cap": consumer.window_cap,
        "window_low": consumer.window_low,
        "window_high": consumer.window_high,
        "pace_ms": _optional(consumer.pace_ms),
        "pace_low_ms": _optional(consumer.pace_low_ms),
        "pace_high_ms": _optional(consumer.pace_high_ms),
        "round_trip_ms": _optional(consumer.round_trip_ms),
    }


def _reader(reader: ReaderStats) -> dict[str, Any]:
    return {
        "destination": reader.destination,
        "kind": reader.kind,
        "group": reader.group,
        "present_s": round(reader.present_s, 3),
        "lag_messages": reader.lag_messages,
        "peak_lag_messages": reader.peak_lag_messages,
        "lag_seconds": round(reader.lag_seconds, 3),
        "peak_lag_seconds": round(reader.peak_lag_seconds, 3),
        "open_leases": reader.open_leases,
        "last_seen": iso(reader.last_seen_ms),
    }


def _distribution(spread: Distribution, uneven: bool, stranded_s: float) -> dict[str, Any]:
    ratio = spread.ratio
    return {
        "destination": spread.destination,
        "consumers": spread.consumers,
        "delivered": spread.delivered,
        "max_share": round(spread.max_share, 4),
        "min_share": round(spread.min_share, 4),
        "max_min_ratio": None if ratio is None else round(ratio, 3),
        "max_consumer": spread.max_consumer,
        "min_consumer": spread.min_consumer,
        "uneven": uneven,
        "stranded_s": round(stranded_s, 3),
    }


def _episode(episode: ProducerEpisode) -> dict[str, Any]:
    return {
        "destination": episode.destination,
        "connection": episode.connection,
        "reason": episode.reason,
        "limit": episode.limit or None,
        "detail": episode.detail,
        "start": iso(episode.start_ms),
        "end": iso(episode.end_ms),
        "duration_s": round(episode.duration_s, 3),
        "ongoing": episode.ongoing,
        "outcome": episode.outcome.value,
        "described": episode.describe(),
        "max_held_sends": episode.max_held_sends,
    }


def _recommendation(recommendation: Recommendation) -> dict[str, Any]:
    order = None
    if recommendation.delivery_order:
        order = {
            "in_use": recommendation.delivery_order,
            "recommended": recommendation.recommended_order,
            "changed": recommendation.order_changed,
        }
    return {
        "destination": recommendation.destination,
        "consumerFlowLimit": {
            "destination": recommendation.destination_limit,
            "window_in_use": recommendation.window_in_use,
            "recommended": recommendation.limit,
            "changed": recommendation.limit_changed,
            "text": limit_text(recommendation.limit),
            "fixed_alternative": recommendation.fixed_limit,
        },
        "consumerFlowThreshold": {
            "in_use": recommendation.threshold_in_use,
            "recommended": recommendation.threshold,
            "changed": recommendation.threshold_changed,
        },
        "deliveryOrder": order,
        "rules": [
            {"rule": f.rule, "setting": f.setting, "value": f.value, "reason": f.reason}
            for f in recommendation.findings
        ],
        "adaptive_windows": [
            {"consumer": c.label, "window_now": c.window_limit, **_window(c)}
            for c in recommendation.adaptive
        ],
        "chosen_windows": recommendation.chosen or None,
        "deadline_misses": recommendation.misses or None,
        "note": recommendation.note or None,
    }


def build(analysis: Analysis) -> dict[str, Any]:
    collected = analysis.collected
    timeline = collected.timeline
    options = analysis.options
    stranded = {d.destination: d.stranded_s for d in collected.destinations}
    uneven = {d.destination for d in analysis.uneven()}
    return {
        "generated": iso(analysis.generated_ms),
        "history": options.history,
        "files": analysis.files,
        "range": {
            "since": iso(options.since_ms),
            "until": iso(options.until_ms),
            "first_sample": iso(timeline.first_ms),
            "last_sample": iso(timeline.last_ms),
            "samples": timeline.samples,
            "interval_s": timeline.interval_s,
            "broker_runs": timeline.runs,
        },
        "settings": {
            "imbalance_ratio": options.imbalance_ratio,
            "pool_sizes": options.pool_sizes,
        },
        "spark": {"master": options.master, "shuffle_partitions": collected.shuffle_partitions},
        "destinations": [_destination(d) for d in collected.destinations],
        "destinations_left_off": collected.destinations_left_off,
        "producer_episodes": [_episode(e) for e in collected.episodes],
        "producer_episodes_left_off": collected.episodes_left_off,
        "consumers": [_consumer(c) for c in collected.consumers],
        "consumers_left_off": collected.consumers_left_off,
        "consumers_paused_s": round(sum(c.paused_s for c in collected.consumers), 3),
        "readers": [_reader(r) for r in collected.readers],
        "readers_left_off": collected.readers_left_off,
        "distribution": [
            _distribution(d, d.destination in uneven, stranded.get(d.destination, 0.0))
            for d in collected.distributions
        ],
        "uneven_queues": sorted(uneven),
        "recommendations": [_recommendation(r) for r in analysis.recommendations],
    }
