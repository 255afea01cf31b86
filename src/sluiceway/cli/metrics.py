"""`sluiceway cmd metrics bkr|dst|svc`: imqcmd's metric tables over the admin API.

One sample by default (a terminal command that returns); `-int SECONDS` alone samples every
SECONDS until Ctrl-C, as imqcmd does; `-msp COUNT` stops after COUNT samples (every 5 seconds
unless -int says otherwise). The header is printed once and each sample adds rows under it;
with --json each sample is one line of the API's JSON (JSON Lines).

What each table shows, by imqcmd's metric type (-m):

- bkr: ttl Msgs and Msg Bytes In/Out since start, and the messages held now; rts the same per
  second; cxn connections and memory (Sluiceway's memory ledger where Open MQ shows the JVM
  heap); dsk the journal's size on disk, and the state and free space of the disk holding it.
- svc (each service, or the one named by -n): ttl Msgs, Pkts (STOMP frames) and Pkt Bytes
  (bytes on the wire) In/Out; rts the same per second; cxn connections open and closed.
- dst: ttl Msgs and Msg Bytes In/Out, Msg Count and Total Msg Bytes (Current, Peak, Avg),
  Largest Msg; rts the same with Msgs/sec and Msg Bytes/sec; con consumers (queue: Active and
  Backup) and Msg Count. Bytes are bytes (imqcmd shows k).

Rates are the broker's, measured over its last 5 seconds (admin/metrics.RATE_WINDOW), whatever
-int is.
"""

from __future__ import annotations

import argparse
import time
from functools import partial
from typing import Any, Final

from sluiceway.cli.adminapi import AdminApi, Refused, UsageError
from sluiceway.cli.tables import Column, Table, json_or_text
from sluiceway.cli.verbs import Context, destination_path

DEFAULT_INTERVAL: Final = 5  # seconds, imqcmd's -int default
MIN_WIDTH: Final = 5  # so numbers of later samples still fit under their titles


def _in_out(group: str, key_in: str, key_out: str) -> tuple[Column, Column]:
    return Column("In", key_in, group=group), Column("Out", key_out, group=group)


def _current_peak_avg(group: str, prefix: str) -> tuple[Column, ...]:
    return (
        Column("Current", f"trend.{prefix}_current", group=group),
        Column("Peak", f"trend.{prefix}_peak", group=group),
        Column("Avg", f"trend.{prefix}_avg", group=group),
    )


_DST_SIZES = (
    *_current_peak_avg("Msg Count", "msgs"),
    *_current_peak_avg("Total Msg Bytes", "bytes"),
    Column("Largest Msg", "trend.largest_msg"),
)
_SERVICE = Column("Service", "name", numeric=False)

COLUMNS: Final[dict[tuple[str, str], tuple[Column, ...]]] = {
    ("bkr", "ttl"): (
        *_in_out("Msgs", "totals.msgs_in", "totals.msgs_out"),
        *_in_out("Msg Bytes", "totals.bytes_in", "totals.bytes_out"),
        Column("Msgs", "msgs", group="Held Now"),
        Column("Msg Bytes", "msg_bytes", group="Held Now"),
    ),
    ("bkr", "rts"): (
        *_in_out("Msgs/sec", "rates.msgs_in", "rates.msgs_out"),
        *_in_out("Msg Bytes/sec", "rates.bytes_in", "rates.bytes_out"),
    ),
    ("bkr", "cxn"): (
        Column("Num Connections", "connections"),
        Column("Level", "memory.level", group="Memory", numeric=False),
        Column("Used (bytes)", "memory.used", group="Memory"),
        Column("Peak (bytes)", "memory.peak", group="Memory"),
    ),
    ("bkr", "dsk"): (
        Column("Journal Bytes on Disk", "disk_bytes"),
        Column("State", "disk.state", group="Disk", numeric=False),
        Column("Free (bytes)", "disk.free", group="Disk"),
        Column("Free Limit (bytes)", "disk.free_limit", group="Disk"),
    ),
    ("svc", "ttl"): (
        _SERVICE,
        *_in_out("Msgs", "msgs_in", "msgs_out"),
        *_in_out("Pkts", "frames_in", "frames_out"),
        *_in_out("Pkt Bytes", "bytes_in", "bytes_out"),
    ),
    ("svc", "rts"): (
        _SERVICE,
        *_in_out("Msgs/sec", "rates.msgs_in", "rates.msgs_out"),
        *_in_out("Pkts/sec", "frames_in_rate", "frames_out_rate"),
        *_in_out("Pkt Bytes/sec", "rates.bytes_in", "rates.bytes_out"),
    ),
    ("svc", "cxn"): (
        _SERVICE,
        Column("Num Connections", "connections"),
        Column("Closed", "connections_closed"),
    ),
    ("dst", "ttl"): (
        *_in_out("Msgs", "totals.msgs_in", "totals.msgs_out"),
        *_in_out("Msg Bytes", "totals.bytes_in", "totals.bytes_out"),
        *_DST_SIZES,
    ),
    ("dst", "rts"): (
        *_in_out("Msgs/sec", "trend.rates.msgs_in", "trend.rates.msgs_out"),
        *_in_out("Msg Bytes/sec", "trend.rates.bytes_in", "trend.rates.bytes_out"),
        *_DST_SIZES,
    ),
    ("dst", "con-queue"): (
        Column("Current", "summary.active_consumers", group="Active Consumers"),
        Column("Peak", "trend.active_consumers_peak", group="Active Consumers"),
        Column("Current", "summary.backup_consumers", group="Backup Consumers"),
        *_current_peak_avg("Msg Count", "msgs"),
    ),
    ("dst", "con-topic"): (
        Column("Current", "summary.consumers", group="Consumers"),
        Column("Peak", "trend.active_consumers_peak", group="Consumers"),
        *_current_peak_avg("Msg Count", "msgs"),
    ),
}


def run(ctx: Context) -> None:
    args = ctx.args
    metric = args.metric or "ttl"
    columns = _columns(args.object, metric, args.type)
    interval = args.interval if args.interval is not None else DEFAULT_INTERVAL
    # One sample unless told: a terminal command should return. -int alone: until Ctrl-C.
    samples = args.samples if args.samples is not None else (None if args.interval else 1)
    table: Table | None = None
    taken = 0
    try:
        while True:
            answer, rows = _sample(ctx.api, args)
            taken += 1
            first = table is None
            if table is None:  # its widths fit the first sample, as imqcmd's do
                table = Table(columns, MIN_WIDTH)
                table.fit(table.cells(row) for row in rows)
            text = partial(_lines, table, rows, header=first)
            json_or_text(ctx.out, ctx.json, answer, text, indent=None)  # JSON Lines
            ctx.out.flush()
            if samples is not None and taken >= samples:
                return
            time.sleep(interval)
    except KeyboardInterrupt:
        return  # the way to end sampling that has no -msp


def _columns(obj: str, metric: str, kind: str | None) -> tuple[Column, ...]:
    if obj == "dst" and metric == "dsk":
        raise UsageError(
            "metrics dst -m dsk: every destination shares one journal, so there is no disk use "
            "per destination; `metrics bkr -m dsk` shows the journal's size on disk"
        )
    key = (obj, f"con-{kind}" if metric == "con" else metric)
    if key not in COLUMNS:
        valid = sorted({m.partition("-")[0] for o, m in COLUMNS if o == obj})
        raise UsageError(f"metrics {obj} -m {metric}: use one of {', '.join(valid)}")
    return COLUMNS[key]


def _sample(api: AdminApi, args: argparse.Namespace) -> tuple[Any, list[dict[str, Any]]]:
    """(the API's answer, the rows of the table) for one sample."""
    if args.object == "bkr":
        answer = api.get("/metrics/broker")
        return answer, [answer]
    if args.object == "dst":
        # The destination's detail has the counters (totals) and the trend (rates, peaks).
        answer = api.get(destination_path(args.type, args.name))
        return answer, [answer]
    services = api.get("/metrics/services")
    if args.name is not None:
        services = [s for s in services if s.get("name") == args.name]
        if not services:
            raise Refused(f"no service called {args.name!r} (see metrics svc without -n)")
    return services, services


def _lines(table: Table, rows: list[dict[str, Any]], *, header: bool) -> str:
    """One sample's lines, under the table's header if it is the first."""
    lines = [*table.header()] if header else []
    lines.extend(table.line(table.cells(row)) for row in rows)
    return "".join(f"{line}\n" for line in lines)
