"""The report's plots, as PNG bytes, drawn with matplotlib from the collected results.

Figures are made with matplotlib's object API (a `Figure` per plot, no pyplot): nothing global
changes, and no display is needed. Times are shown in UTC, like the history's file names.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Final

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MaxNLocator

from sluiceway.analysis.results import ConsumerStats, ProducerEpisode, SeriesPoint

WIDTH_IN: Final = 9.0
DPI: Final = 90
MAX_BARS: Final = 20  # consumers per bar chart
MAX_LANES: Final = 24  # rows of the producer episode timeline
COLOURS: Final = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2")


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def _seconds(ms: int) -> float:
    """A time on the plots' x axis: seconds since the epoch, labelled in UTC by _time_axis."""
    return ms / 1000


def _time_label(seconds: float, _position: int | None = None) -> str:
    moment = datetime.fromtimestamp(seconds, tz=UTC)
    return moment.strftime("%H:%M:%S" if moment.second or moment.minute else "%d %b %H:%M")


def _time_axis(axes: Axes, first_ms: int, last_ms: int) -> None:
    # A single sample still gets an axis a second wide (equal limits make matplotlib warn).
    axes.set_xlim(_seconds(first_ms), _seconds(max(last_ms, first_ms + 1000)))
    # Ticks at whole seconds, minutes or hours (steps of 1, 2, 3, 6 or 10 times a power of ten
    # seconds land on round clock times often enough for a report).
    axes.xaxis.set_major_locator(MaxNLocator(nbins=8, steps=[1, 2, 3, 6, 10]))
    axes.xaxis.set_major_formatter(FuncFormatter(_time_label))
    axes.set_xlabel("time (UTC)")


def _values(values: Sequence[float | None]) -> list[float]:
    """None (no rate measured) as a gap in the line."""
    return [math.nan if v is None else v for v in values]


def traffic(destination: str, points: Sequence[SeriesPoint], first_ms: int, last_ms: int) -> bytes:
    """Messages in and out per second (top) and the backlog (bottom) of one destination, over
    the whole range analysed (`first_ms` to `last_ms`), so every destination's plot lines up."""
    figure = Figure(figsize=(WIDTH_IN, 5.0), layout="constrained")
    rates, backlog = figure.subplots(2, 1, sharex=True)
    when = [_seconds(p.ts_ms) for p in points]
    rates.plot(when, _values([p.in_rate for p in points]), label="in", color=COLOURS[0])
    rates.plot(when, _values([p.out_rate for p in points]), label="out", color=COLOURS[2])
    rates.set_ylabel("messages/s")
    rates.set_ylim(bottom=0)
    rates.set_title(destination)
    rates.legend(loc="upper right")
    backlog.plot(when, [p.msgs for p in points], label="held", color=COLOURS[4], linewidth=3)
    backlog.plot(
        when, [p.pending for p in points], label="waiting for a consumer", color=COLOURS[3]
    )
    backlog.plot(when, [p.unacked for p in points], label="unacknowledged", color=COLOURS[5])
    backlog.set_ylabel("messages")
    backlog.set_ylim(bottom=0)
    backlog.legend(loc="upper right")
    _time_axis(backlog, first_ms, last_ms)
    return _png(figure)


def episodes(found: Sequence[ProducerEpisode], first_ms: int, last_ms: int) -> bytes:
    """One lane per destination and connection, a bar per episode, coloured by reason, over the
    whole range analysed (`first_ms` to `last_ms`)."""
    lanes: dict[str, int] = {}
    for episode in found:
        lane = _lane(episode)
        if lane not in lanes and len(lanes) < MAX_LANES:
            lanes[lane] = len(lanes)
    reasons = sorted({e.reason for e in found})
    colour = {reason: COLOURS[i % len(COLOURS)] for i, reason in enumerate(reasons)}
    figure = Figure(figsize=(WIDTH_IN, 1.2 + 0.35 * len(lanes)), layout="constrained")
    axes = figure.subplots()
    for episode in found:
        row = lanes.get(_lane(episode))
        if row is None:
            continue
        start = _seconds(episode.start_ms)
        width = max(_seconds(episode.end_ms) - start, 0.001)
        axes.broken_barh([(start, width)], (row - 0.4, 0.8), color=colour[episode.reason])
    axes.set_yticks(range(len(lanes)), list(lanes))
    axes.invert_yaxis()
    axes.legend(handles=[Patch(color=colour[r], label=r) for r in reasons], loc="upper right")
    axes.set_title("producers held or throttled")
    _time_axis(axes, first_ms, last_ms)
    return _png(figure)


def _lane(episode: ProducerEpisode) -> str:
    who = "all producers" if episode.connection is None else f"connection {episode.connection}"
    return f"{episode.destination} ({who})"


def paused(consumers: Sequence[ConsumerStats]) -> bytes:
    """Seconds each consumer spent paused by flow control, the longest first."""
    chosen = sorted(consumers, key=lambda c: c.paused_s, reverse=True)[:MAX_BARS]
    figure = Figure(figsize=(WIDTH_IN, 1.2 + 0.3 * len(chosen)), layout="constrained")
    axes = figure.subplots()
    labels = [f"{c.destination} {c.label}" for c in chosen]
    axes.barh(labels, [c.paused_s for c in chosen], color=COLOURS[1])
    axes.invert_yaxis()
    axes.set_xlabel("seconds paused by flow control (window used up)")
    return _png(figure)


def shares(destination: str, consumers: Sequence[ConsumerStats]) -> bytes:
    """Each compared consumer's share of a queue's messages."""
    chosen = sorted(consumers, key=lambda c: c.share or 0.0, reverse=True)[:MAX_BARS]
    figure = Figure(figsize=(WIDTH_IN, 1.2 + 0.3 * len(chosen)), layout="constrained")
    axes = figure.subplots()
    labels = [f"{c.label} (window {c.window_limit})" for c in chosen]
    axes.barh(labels, [100 * (c.share or 0.0) for c in chosen], color=COLOURS[0])
    if chosen:
        even = 100 / len([c for c in consumers if c.share is not None])
        axes.axvline(even, color=COLOURS[1], linestyle="--", label=f"even share ({even:.0f} %)")
        axes.legend(loc="lower right")
    axes.invert_yaxis()
    axes.set_xlabel("% of the messages delivered to the compared consumers")
    axes.set_title(destination)
    return _png(figure)
