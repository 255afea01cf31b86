"""report.html (one self-contained page, plots embedded as PNG) and summary.json.

Sections, in the order an operator needs them: the recommended flow settings and why; the
windows the broker sized where they are adaptive; the throughput and backlog of each
destination; its deadline misses; how far behind its pipeline readers were; producers held or
throttled; consumers paused by flow control; how each queue's messages were spread over its
consumers; how it was measured.
Both files are written next to each other and replace any earlier report atomically.
"""

from __future__ import annotations

import base64
import html
import json
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Final

from sluiceway import __version__
from sluiceway.analysis import plots
from sluiceway.analysis.findings import LIMIT, limit_text
from sluiceway.analysis.results import ConsumerStats, SeriesPoint
from sluiceway.analysis.rules import Recommendation
from sluiceway.analysis.summary import Analysis, build, iso

MAX_SHARE_PLOTS: Final = 8  # queues with a distribution plot
MAX_TABLE_ROWS: Final = 200

STYLE: Final = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 70em; color: #222; }
h1 { font-size: 1.6em; } h2 { margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.3em 0.6em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
.changed { font-weight: bold; color: #b00; } .rule { font-family: monospace; }
.note { color: #555; } img { max-width: 100%; }
"""


def _e(value: object) -> str:
    return html.escape(str(value))


def _n(value: float, digits: int = 1) -> str:
    return f"{value:,.{digits}f}" if digits else f"{value:,.0f}"


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], numeric: set[int]) -> str:
    """Cells are HTML already (escape with _e); columns in `numeric` are right-aligned."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = "".join(
            f'<td class="n">{cell}</td>' if i in numeric else f"<td>{cell}</td>"
            for i, cell in enumerate(row)
        )
        body.append(f"<tr>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _image(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<p><img alt="{_e(alt)}" src="data:image/png;base64,{data}"></p>'


def _changed(changed: bool) -> str:
    return ' class="changed"' if changed else ""


def _settings(rec: Recommendation) -> list[str]:
    """The list items of one destination's settings: now, and recommended."""
    fixed = ""
    if rec.fixed_limit is not None and rec.fixed_limit != rec.destination_limit:
        fixed = f"; to keep a fixed number, {_e(limit_text(rec.fixed_limit))}"
    items = [
        f"consumerFlowLimit: destination {_e(limit_text(rec.destination_limit))}, largest "
        f"window in use {_e(limit_text(rec.window_in_use))}; recommended "
        f"<span{_changed(rec.limit_changed)}>{_e(limit_text(rec.limit))}</span>{fixed}",
        f"consumerFlowThreshold: in use {_e(rec.threshold_in_use or '-')} %; "
        f"recommended <span{_changed(rec.threshold_changed)}>{_e(rec.threshold)} %</span>",
    ]
    if rec.delivery_order:
        items.append(
            f"deliveryOrder: {_e(rec.delivery_order)}; recommended "
            f"<span{_changed(rec.order_changed)}>{_e(rec.recommended_order)}</span>"
        )
    if rec.chosen:
        items.append(f"adaptive windows: {_e(rec.chosen)}")
    if rec.misses:
        items.append(f"deadlines: {_e(rec.misses)}")
    return items


def _recommendations(recommendations: list[Recommendation]) -> str:
    fired = [r for r in recommendations if r.findings]
    kept = [r for r in recommendations if not r.findings]
    parts = ["<h2>Recommended flow settings</h2>"]
    if not fired:
        parts.append("<p>No rule fired: keep the current settings.</p>")
    for rec in fired:
        parts.append(f"<h3>{_e(rec.destination)}</h3><ul>")
        parts.extend(f"<li>{item}</li>" for item in _settings(rec))
        parts.append("</ul>")
        rows = [
            (f'<span class="rule">{_e(f.rule)}</span>', _e(f.setting), _e(f.value), _e(f.reason))
            for f in rec.findings
        ]
        parts.append(_table(("rule", "setting", "value", "why"), rows, {2}))
    if kept:
        parts.append("<p>Kept as they are:</p><ul>")
        for rec in kept:
            said = "; ".join(text for text in (rec.note, rec.chosen, rec.misses) if text)
            parts.append(f'<li>{_e(rec.destination)}: <span class="note">{_e(said)}</span></li>')
        parts.append("</ul>")
    return "".join(parts)


def _ms(value: float | None) -> str:
    """Milliseconds: tenths, or thousandths below one."""
    return "-" if value is None else _n(value, 1 if value >= 1 else 3)


def _count(value: float | None) -> str:
    return "-" if value is None else _n(value, 0)


def _range(low: float | None, high: float | None, show: Callable[[float | None], str]) -> str:
    """low to high, one value when they are equal, - when unknown."""
    if low is None or high is None:
        return "-"
    return show(low) if low == high else f"{show(low)} to {show(high)}"


def _adaptive(analysis: Analysis) -> str:
    parts = [
        "<h2>Windows the broker sized</h2>",
        "<p>Consumers with consumerFlowLimit=auto (on the destination, or asked for on "
        "SUBSCRIBE): the smallest and largest window the broker gave each over the range, the "
        "last, the most it may grow to (cap), and the pace (time per message) and round trip "
        "it measured, median and range.</p>",
    ]
    rows = [
        (
            _e(rec.destination),
            _e(c.label),
            _range(c.window_low, c.window_high, _count),
            _e(limit_text(c.window_limit)),
            _e(limit_text(c.window_cap)),
            _ms(c.pace_ms),
            _range(c.pace_low_ms, c.pace_high_ms, _ms),
            _ms(c.round_trip_ms),
            _n(c.delivered, 0),
        )
        for rec in analysis.recommendations
        for c in rec.adaptive
    ]
    if not rows:
        parts.append("<p>None: no consumer had an adaptive window.</p>")
        return "".join(parts)
    headers = (
        "destination",
        "consumer",
        "windows",
        "window, last",
        "cap",
        "pace ms",
        "pace range ms",
        "round trip ms",
        "delivered",
    )
    parts.append(_table(headers, rows[:MAX_TABLE_ROWS], {5, 7, 8}))
    return "".join(parts)


def _deadlines(analysis: Analysis) -> str:
    destinations = analysis.collected.destinations
    parts = [
        "<h2>Deadline misses</h2>",
        "<p>Messages with an expiration time that expired before delivery, or were acknowledged "
        "after it (delivered in time, consumed late), over the range; as a share of the "
        "messages the destination received over the range.</p>",
    ]
    recorded = [d for d in destinations if d.deadline_misses is not None]
    missed = [d for d in recorded if d.deadline_misses]
    if not recorded:
        parts.append(
            "<p>Not recorded: the history was written by a broker that did not count them.</p>"
        )
        return "".join(parts)
    if not missed:
        parts.append("<p>None: every message with a deadline met it.</p>")
        return "".join(parts)
    rows = [
        (
            _e(d.destination),
            _e(d.delivery_order or "-"),
            _n(d.expired or 0, 0),
            _n(d.consumed_late or 0, 0),
            _n(d.deadline_misses or 0, 0),
            "-" if d.miss_share is None else _n(100 * d.miss_share, 1),
        )
        for d in missed[:MAX_TABLE_ROWS]
    ]
    headers = (
        "destination",
        "deliveryOrder",
        "expired",
        "consumed late",
        "misses",
        "% of received",
    )
    parts.append(_table(headers, rows, {2, 3, 4, 5}))
    return "".join(parts)


def _traffic(analysis: Analysis) -> str:
    collected = analysis.collected
    parts = [
        "<h2>Throughput and backlog</h2>",
        "<p>Messages in and out per second come from the broker's counters (growth between two "
        "samples over the time between them); held messages are waiting, being delivered or "
        "unacknowledged.</p>",
    ]
    rows = [
        (
            _e(d.destination),
            _e(d.type),
            _n(d.msgs_in, 0),
            _n(d.msgs_out, 0),
            _n(d.mean_in_rate),
            _n(d.mean_out_rate),
            _n(d.peak_in_rate),
            _n(d.peak_out_rate),
            _n(d.peak_msgs, 0),
            _n(d.peak_pending, 0),
            _e(limit_text(d.consumer_flow_limit)),
        )
        for d in collected.destinations[:MAX_TABLE_ROWS]
    ]
    headers = (
        "destination",
        "type",
        "msgs in",
        "msgs out",
        "in/s mean",
        "out/s mean",
        "in/s peak",
        "out/s peak",
        "held peak",
        "waiting peak",
        "consumerFlowLimit",
    )
    parts.append(_table(headers, rows, set(range(2, 10))))
    parts.append(_left_off(collected.destinations_left_off, "destinations"))
    by_destination: dict[str, list[SeriesPoint]] = {}
    for point in collected.series:
        by_destination.setdefault(point.destination, []).append(point)
    timeline = collected.timeline
    for stats in collected.destinations:  # busiest first, like the table
        points = by_destination.get(stats.destination)
        if points:
            figure = plots.traffic(stats.destination, points, timeline.first_ms, timeline.last_ms)
            parts.append(_image(figure, f"throughput of {stats.destination}"))
    return "".join(parts)


def _readers(analysis: Analysis) -> str:
    collected = analysis.collected
    parts = [
        "<h2>Pipeline readers</h2>",
        "<p>Cursor groups of topics and lease groups of queues drain their destination without a "
        "subscription. Lag: the messages of the destination a reader had not yet taken (for a "
        "lease group, those waiting in the queue and those of its open leases), and the age of "
        "the oldest of them. Last: at the last sample that saw the reader.</p>",
    ]
    if not collected.readers:
        parts.append("<p>None: no cursor group or lease group was seen.</p>")
        return "".join(parts)
    rows = [
        (
            _e(r.destination),
            _e(r.kind),
            _e(r.group),
            _n(r.lag_messages, 0),
            _n(r.peak_lag_messages, 0),
            _n(r.lag_seconds),
            _n(r.peak_lag_seconds),
            "-" if r.open_leases is None else _n(r.open_leases, 0),
            _n(r.present_s, 0),
            _e(iso(r.last_seen_ms)),
        )
        for r in collected.readers[:MAX_TABLE_ROWS]
    ]
    headers = (
        "destination",
        "reader",
        "group",
        "lag msgs, last",
        "lag msgs, peak",
        "lag s, last",
        "lag s, peak",
        "open leases",
        "seen s",
        "last seen",
    )
    parts.append(_table(headers, rows, set(range(3, 9))))
    parts.append(_left_off(collected.readers_left_off, "pipeline readers"))
    return "".join(parts)


def _episodes(analysis: Analysis) -> str:
    collected = analysis.collected
    parts = [
        "<h2>Producers held or throttled</h2>",
        "<p>A held SEND waits in the broker until it is accepted, or refused after "
        "imq.producer.hold.timeout. Accepted: its destination took messages in after the last "
        "sample that saw the hold (held SENDs go before new ones). Refused: it took none, so "
        "the held SENDs were refused or dropped with their connection.</p>",
    ]
    if not collected.episodes:
        parts.append("<p>None: no producer was held, throttled or paused.</p>")
        return "".join(parts)
    timeline = collected.timeline
    figure = plots.episodes(collected.episodes, timeline.first_ms, timeline.last_ms)
    parts.append(_image(figure, "producer episodes"))
    rows = [
        (
            _e(e.destination),
            _e("all" if e.connection is None else e.connection),
            _e(e.reason),
            _e(e.describe()),
            _e(iso(e.start_ms)),
            _e(iso(e.end_ms)),
            _n(e.max_held_sends, 0),
            _e(e.detail),
        )
        for e in collected.episodes[:MAX_TABLE_ROWS]
    ]
    headers = (
        "destination",
        "connection",
        "reason",
        "how it ended",
        "start",
        "end",
        "held SENDs",
        "why the broker held them",
    )
    parts.append(_table(headers, rows, {6}))
    parts.append(_left_off(collected.episodes_left_off, "episodes"))
    return "".join(parts)


def _paused(analysis: Analysis) -> str:
    consumers = [c for c in analysis.collected.consumers if c.paused_s > 0]
    parts = [
        "<h2>Consumers paused by flow control</h2>",
        "<p>A consumer is paused while its window is used up: it holds its flow limit of "
        "unconsumed messages and gets no more until it has consumed down to its threshold.</p>",
    ]
    if not consumers:
        parts.append("<p>No consumer was seen paused.</p>")
        return "".join(parts)
    parts.append(_image(plots.paused(consumers), "time paused by flow control"))
    ranked = sorted(consumers, key=lambda c: c.paused_s, reverse=True)[:MAX_TABLE_ROWS]
    rows = [
        (
            _e(c.destination),
            _e(c.label),
            _e(limit_text(c.window_limit)),
            _e("-" if c.window_threshold is None else c.window_threshold),
            _n(c.paused_s),
            _n(100 * c.paused_s / c.present_s if c.present_s else 0.0, 0),
            _n(c.pause_episodes, 0),
            _n(c.longest_pause_s),
        )
        for c in ranked
    ]
    headers = (
        "destination",
        "consumer",
        "window",
        "threshold %",
        "paused s",
        "% of its time",
        "pauses",
        "longest s",
    )
    parts.append(_table(headers, rows, {4, 5, 6, 7}))
    return "".join(parts)


def _distribution(analysis: Analysis) -> str:
    collected = analysis.collected
    parts = [
        "<h2>Distribution across consumers</h2>",
        "<p>Messages delivered to each queue's consumers that were there together (active, and "
        "present at least half as long as the longest-present one). Stranded: time a consumer "
        "sat empty while another held unconsumed messages and none waited in the queue.</p>",
    ]
    if not collected.distributions:
        parts.append("<p>No queue had two or more consumers to compare.</p>")
        return "".join(parts)
    uneven = {d.destination for d in analysis.uneven()}
    stranded = {d.destination: d.stranded_s for d in collected.destinations}
    rows = []
    for d in collected.distributions:
        ratio = d.ratio
        rows.append(
            (
                _e(d.destination),
                _n(d.consumers, 0),
                _n(d.delivered, 0),
                f"{d.max_share:.0%} ({_e(d.max_consumer)})",
                f"{d.min_share:.0%} ({_e(d.min_consumer)})",
                "-" if ratio is None else _n(ratio, 2),
                _n(stranded.get(d.destination, 0.0)),
                '<span class="changed">uneven</span>' if d.destination in uneven else "even",
            )
        )
    headers = (
        "queue",
        "consumers",
        "delivered",
        "max share",
        "min share",
        "max/min",
        "stranded s",
        "",
    )
    parts.append(_table(headers, rows, {1, 2, 5, 6}))
    compared: dict[str, list[ConsumerStats]] = {}
    for consumer in collected.consumers:
        if consumer.share is not None:
            compared.setdefault(consumer.destination, []).append(consumer)
    ordered = sorted(collected.distributions, key=lambda d: d.destination not in uneven)
    for spread in ordered[:MAX_SHARE_PLOTS]:
        members = compared.get(spread.destination, [])
        if members:
            parts.append(_image(plots.shares(spread.destination, members), spread.destination))
    return "".join(parts)


def _left_off(count: int, what: str) -> str:
    return f'<p class="note">{count} more {what} not shown (see summary.json).</p>' if count else ""


def _method(analysis: Analysis) -> str:
    timeline = analysis.collected.timeline
    return (
        "<h2>How this was measured</h2><ul>"
        f"<li>{timeline.samples} samples every {timeline.interval_s:g} s (median) from "
        f"{_e(iso(timeline.first_ms))} to {_e(iso(timeline.last_ms))}, "
        f"{timeline.runs} broker run(s), {analysis.files} history file(s) from "
        f"{_e(analysis.options.history)}; Spark master {_e(analysis.options.master)}, "
        f"{analysis.collected.shuffle_partitions} shuffle partitions.</li>"
        "<li>A pause's start is exact (the history records how long it has lasted); its end, "
        "and both ends of a producer episode, are placed half-way between the last sample that "
        "saw it and the next: each is accurate to about half an interval. Pauses shorter than "
        "the interval that fall between two samples are not seen.</li>"
        f"<li>The rules and their sources are described in docs/analyze.md; {_e(LIMIT)} "
        "recommendations are for the destination property, which caps every consumer.</li>"
        "</ul>"
    )


def render(analysis: Analysis) -> str:
    timeline = analysis.collected.timeline
    title = "Sluiceway flow-control report"
    return (
        f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>{title}</title>"
        f"<style>{STYLE}</style></head><body><h1>{title}</h1>"
        f'<p class="note">{_e(iso(timeline.first_ms))} to {_e(iso(timeline.last_ms))}; '
        f"generated {_e(iso(analysis.generated_ms))} by sluiceway {_e(__version__)}.</p>"
        + _recommendations(analysis.recommendations)
        + _adaptive(analysis)
        + _traffic(analysis)
        + _deadlines(analysis)
        + _readers(analysis)
        + _episodes(analysis)
        + _paused(analysis)
        + _distribution(analysis)
        + _method(analysis)
        + "</body></html>"
    )


def _replace(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def write(analysis: Analysis, out: Path) -> tuple[Path, Path]:
    """Write report.html and summary.json into `out` (created if missing)."""
    out.mkdir(parents=True, exist_ok=True)
    page, summary = out / "report.html", out / "summary.json"
    _replace(summary, json.dumps(build(analysis), indent=2) + "\n")
    _replace(page, render(analysis))
    return page, summary
