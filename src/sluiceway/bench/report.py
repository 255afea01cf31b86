"""The figures of a run, as a table for people, a JSON document, and a plot.

Rates are over the span in which the work happened: sent/s from the first producer's first send
to the last producer's DISCONNECT receipt (the broker has every message then); received/s from
the moment the producers were let go (in `backlog`, from the moment the consumers started) to
the last message received. MB/s counts message bodies, in millions of bytes per second.
CPU shares (of one core) are described in `sluiceway.bench.cpu`; what a consumer holds and
when it is idle, in `sluiceway.bench.occupancy`.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sluiceway.bench.accounting import LatencyHistogram, SequenceBitmap, Series, overlap
from sluiceway.bench.cpu import ProcessCpu, saturated, share, warning
from sluiceway.bench.runner import Outcome, Scenario


@dataclass
class ConsumerFigures:
    consumer: int
    received: int
    share: float  # of all messages received
    idle_seconds: float
    delay_ms: float
    held_peak: int  # the most messages it held at once: received, not yet acknowledged
    # Seconds it was idle while another consumer held messages it had not started (with
    # --delays; None otherwise).
    idle_while_others_held: float | None
    window_auto: bool  # the broker said it sizes this consumer's window (--prefetch auto)


@dataclass
class Report:
    scenario: str
    sent: int
    refused: int  # heard as failed receipts (Sluiceway), not counted as missing
    received: int
    sent_per_second: float
    received_per_second: float
    megabytes_per_second: float
    latency_ms: dict[str, float]
    consumers: list[ConsumerFigures]
    max_share: float
    min_share: float
    max_held: int  # the most messages one consumer held at once (received, not acknowledged)
    max_idle_while_others_held: float | None  # seconds, the most of any consumer (--delays)
    missing: int
    duplicated: int
    out_of_order: int
    unexpected: int
    generator_cpu_seconds: float
    generator_cpu_per_second: float  # CPU seconds per second of wall time (2.0: two cores busy)
    wall_seconds: float
    broker_peak_rss_bytes: int | None
    timed_out: bool
    processes: list[ProcessCpu]  # each load process's CPU while it worked
    broker_cpu: ProcessCpu | None  # from the producers' start to the run's end
    busy_share: float  # the share of a core above which a load process is saturated
    generator_saturated: list[str]  # the load processes above it: "producer 0"
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    series: dict[str, list[float]] = field(default_factory=dict)

    @property
    def lost_or_duplicated(self) -> bool:
        return self.missing > 0 or self.duplicated > 0

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def build_report(outcome: Outcome) -> Report:
    s = outcome.settings
    producers, consumers = outcome.producers, outcome.consumers
    sent = sum(p.sent for p in producers)
    refused = sum(p.refused for p in producers)
    received = sum(c.received for c in consumers)
    missing, duplicated = _gaps(outcome, sent - refused)
    histogram, series = LatencyHistogram(), Series()
    for consumer in consumers:
        histogram.merge(consumer.histogram)
        series.merge(consumer.series)
    send_span = _span(min((p.started_ns for p in producers if p.started_ns), default=0),
                      max((p.finished_ns for p in producers), default=0))  # fmt: skip
    receive_start = outcome.drain_start_ns or outcome.start_ns
    receive_span = _span(receive_start, max((c.last_ns for c in consumers), default=0))
    wall = _span(outcome.start_ns, outcome.end_ns) or 1e-9
    cpu = outcome.parent_cpu + sum(p.cpu_seconds for p in producers)
    cpu += sum(c.cpu_seconds for c in consumers)
    shares = [c.received / received if received else 0.0 for c in consumers]
    ordered = sorted(consumers, key=lambda c: c.consumer_id)
    processes = _processes(outcome)
    busy = saturated(processes, s.busy_share)
    errors = [f"producer {p.producer_id}: {p.error}" for p in producers if p.error]
    errors += [f"consumer {c.consumer_id}: {c.error}" for c in consumers if c.error]
    waits = _idle_while_others_held(outcome)
    figures = [
        ConsumerFigures(
            c.consumer_id,
            c.received,
            c.received / received if received else 0.0,
            round(c.idle_seconds, 3),
            s.delays_ms[c.consumer_id] if c.consumer_id < len(s.delays_ms) else 0.0,
            c.held_peak,
            waits.get(c.consumer_id),
            c.window_auto,
        )
        for c in ordered
    ]
    overlaps = [f.idle_while_others_held for f in figures if f.idle_while_others_held is not None]
    return Report(
        scenario=s.scenario.value,
        sent=sent,
        refused=refused,
        received=received,
        sent_per_second=_rate(sent, send_span),
        received_per_second=_rate(received, receive_span),
        megabytes_per_second=_rate(sum(c.body_bytes for c in consumers), receive_span) / 1e6,
        latency_ms={
            "p50": histogram.percentile(50) / 1000,
            "p99": histogram.percentile(99) / 1000,
            "max": histogram.maximum / 1000,
        },
        consumers=figures,
        max_share=max(shares, default=0.0),
        min_share=min(shares, default=0.0),
        max_held=max((c.held_peak for c in consumers), default=0),
        max_idle_while_others_held=max(overlaps, default=None),
        missing=missing,
        duplicated=duplicated,
        out_of_order=sum(c.out_of_order for c in consumers),
        unexpected=sum(c.unexpected for c in consumers),
        generator_cpu_seconds=round(cpu, 3),
        generator_cpu_per_second=round(cpu / wall, 3),
        wall_seconds=round(wall, 3),
        broker_peak_rss_bytes=outcome.broker_peak_rss if s.broker_pid else None,
        timed_out=outcome.timed_out,
        processes=processes,
        broker_cpu=_rounded(outcome.broker_cpu) if outcome.broker_cpu else None,
        busy_share=s.busy_share,
        generator_saturated=[p.process for p in busy],
        warnings=[warning(p, s.scenario.value, s.busy_share) for p in busy],
        errors=errors + outcome.failures,
        series={
            "sent_per_second": [
                float(total - previous)
                for previous, total in itertools.pairwise([0, *outcome.sent_totals])
            ],
            "received_per_second": [float(n) for n in series.received],
            "latency_mean_ms": [
                total / n / 1000 if n else 0.0
                for total, n in zip(series.latency_sum, series.received, strict=True)
            ],
            "latency_max_ms": [m / 1000 for m in series.latency_max],
        },
    )


def _idle_while_others_held(outcome: Outcome) -> dict[int, float]:
    """Per consumer that kept its spells: the seconds, from the producers' start to the run's
    end, in which it was idle while another consumer held messages it had not started."""
    kept = {
        c.consumer_id: (c.idle_spells, c.waiting_spells)
        for c in outcome.consumers
        if c.idle_spells is not None and c.waiting_spells is not None
    }
    start, end = outcome.start_ns, outcome.end_ns
    return {
        consumer: round(
            overlap(idle, (w for other, (_, w) in kept.items() if other != consumer), start, end)
            / 1e9,
            3,
        )
        for consumer, (idle, _) in kept.items()
    }


def _processes(outcome: Outcome) -> list[ProcessCpu]:
    """Each load process's CPU share over the span it worked (those that reported)."""
    found = [
        (f"producer {p.producer_id}", p.pid, p.busy)
        for p in sorted(outcome.producers, key=lambda p: p.producer_id)
    ]
    found += [
        (f"consumer {c.consumer_id}", c.pid, c.busy)
        for c in sorted(outcome.consumers, key=lambda c: c.consumer_id)
    ]
    return [
        _rounded(ProcessCpu(name, pid, w.cpu_seconds, w.seconds, share(w.cpu_seconds, w.seconds)))
        for name, pid, w in found
    ]


def _rounded(p: ProcessCpu) -> ProcessCpu:
    return ProcessCpu(
        p.process, p.pid, round(p.cpu_seconds, 6), round(p.seconds, 6), round(p.share, 3)
    )


def _gaps(outcome: Outcome, delivered_should_be: int) -> tuple[int, int]:
    """(missing, duplicated). In a queue the consumers share the messages, so their bitmaps
    are merged and any message two consumers both saw is a duplicate; on a topic every
    subscriber should see every message, so each is checked on its own."""
    consumers = outcome.consumers
    duplicated = sum(c.duplicates for c in consumers)
    counts = outcome.settings.counts()
    if outcome.settings.scenario is Scenario.TOPIC:
        missing = 0
        for consumer in consumers:
            seen = sum(
                SequenceBitmap(n, b).seen() for n, b in zip(counts, consumer.bitmaps, strict=True)
            )
            missing += max(0, delivered_should_be - seen)
        # A subscriber that never reported missed everything.
        missing += delivered_should_be * (outcome.settings.consumers - len(consumers))
        return missing, duplicated
    merged = [SequenceBitmap(n) for n in counts]
    for consumer in consumers:
        for bitmap, bits in zip(merged, consumer.bitmaps, strict=True):
            duplicated += bitmap.union(SequenceBitmap(bitmap.count, bits))
    unique = sum(bitmap.seen() for bitmap in merged)
    return max(0, delivered_should_be - unique), duplicated


def _span(start_ns: int, end_ns: int) -> float:
    return max(0, end_ns - start_ns) / 1e9 if start_ns and end_ns else 0.0


def _rate(count: float, seconds: float) -> float:
    return round(count / seconds, 1) if seconds > 0 else 0.0


def render_table(report: Report) -> str:
    lat = report.latency_ms
    lines = [
        f"scenario      {report.scenario}",
        f"sent          {report.sent:,} ({report.sent_per_second:,.0f}/s)"
        + (f", {report.refused:,} refused" if report.refused else ""),
        f"received      {report.received:,} ({report.received_per_second:,.0f}/s, "
        f"{report.megabytes_per_second:.2f} MB/s)",
        f"latency       p50 {lat['p50']:.2f} ms, p99 {lat['p99']:.2f} ms, max {lat['max']:.2f} ms",
        f"missing       {report.missing:,}",
        f"duplicated    {report.duplicated:,}",
        f"out of order  {report.out_of_order:,}",
        f"generator CPU {report.generator_cpu_seconds:.2f} s "
        f"({report.generator_cpu_per_second:.2f} per second of {report.wall_seconds:.1f} s)",
    ]
    for kind, doing in (("producer", "sending"), ("consumer", "receiving")):
        shares = [
            f"#{p.process.split()[1]} {p.share:.0%}"
            for p in report.processes
            if p.process.startswith(kind)
        ]
        if shares:
            lines.append(f"{kind} CPU  {', '.join(shares)} of a core, while {doing}")
    if report.broker_cpu is not None:
        lines.append(
            f"broker CPU    {report.broker_cpu.share:.0%} of a core (pid {report.broker_cpu.pid})"
        )
    if report.broker_peak_rss_bytes is not None:
        lines.append(f"broker RSS    {report.broker_peak_rss_bytes / 2**20:.1f} MiB at peak")
    if report.unexpected:
        lines.append(f"unexpected    {report.unexpected:,} bodies not from this run")
    lines.append(
        f"consumers     max share {report.max_share:.1%}, min {report.min_share:.1%}; "
        f"held at most {report.max_held:,} messages unacknowledged"
    )
    for c in report.consumers:
        delay = f", {c.delay_ms:g} ms each" if c.delay_ms else ""
        delay += ", adaptive window" if c.window_auto else ""
        while_held = ""
        if c.idle_while_others_held is not None:
            while_held = f" ({c.idle_while_others_held:.2f} s while another held unstarted ones)"
        lines.append(
            f"  #{c.consumer}  {c.received:>10,}  {c.share:6.1%}  "
            f"idle {c.idle_seconds:.2f} s{while_held}, held {c.held_peak:,}{delay}"
        )
    return "\n".join(lines) + "\n"


def write_json(report: Report, target: str, stdout: Any) -> None:
    if target == "-":
        stdout.write(report.to_json() + "\n")
    else:
        Path(target).write_text(report.to_json() + "\n")


def write_plot(report: Report, target: str) -> None:
    """Throughput and latency per second; matplotlib is imported only here, when asked."""
    import matplotlib  # noqa: PLC0415 (optional, and slow to import)

    matplotlib.use("Agg")  # no display needed: the figure goes to a file
    import matplotlib.pyplot as plt  # noqa: PLC0415 (after matplotlib.use)

    figure, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(8, 6))
    for name in ("sent", "received"):
        values = report.series[f"{name}_per_second"]
        top.plot(range(len(values)), values, label=name)
    top.set_ylabel("messages/s")
    top.set_title(f"sluiceway bench {report.scenario}")
    top.legend()
    seconds = range(len(report.series["latency_mean_ms"]))
    bottom.plot(seconds, report.series["latency_mean_ms"], label="mean")
    bottom.plot(seconds, report.series["latency_max_ms"], label="max")
    bottom.set_ylabel("latency (ms)")
    bottom.set_xlabel("seconds since start")
    bottom.legend()
    figure.savefig(target)
    plt.close(figure)
