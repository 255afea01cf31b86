"""Hand-written metrics histories for the adaptive-window and deadline rules, row by row as
admin/history.py writes them, with every figure the analysis should find known in advance.

Thirty-six samples a second apart, one broker run that started just before the first. The
analysis cuts the range into six periods of six samples each (traffic.SLICES). Each destination
tells one story:

- MIXED (queue, windows of 100): `1/slow` holds a full, paused window and consumes 2 messages a
  second; `2/fast` holds 40 and consumes 40 a second for five intervals, then sits empty for 30
  samples while `1/slow` still holds 100 and none wait: mixed speeds (20 times), stranded.
- ROOMY (topic, windows of 500): `3/quick` never holds more than 2, `4/stuck` holds all 500 and
  is paused throughout: an idle window beside a full one.
- TIDAL (queue, windows of 100): `5/hog` holds every message (4 for four periods, 80 for the
  last two) while `6/idle` sits empty: uneven, with a fair share of 2 in four periods and 40 in
  the other two.
- STEADY (queue, windows of 100): two consumers of one speed, each holding half its window:
  nothing to change.
- ADAPTIVE (queue, consumerFlowLimit=auto): the broker sized `7/tortoise` from 16 down to 4
  (30 ms a message) and `8/hare` from 16 up to 162 (0.1 ms), both capped at 1000.
- QUOTES (fifo queue): 1,050 messages in, 35 expired and 7 acknowledged late. SLA (fifo): no
  misses. ORDERED (deadline queue): 70 expired.
- LEGACY: rows as a broker wrote them before windows and deadlines were recorded.

`rows(older=True)` writes every row without the fields added with adaptive windows and
deadline order, as an older broker did.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

T0: Final = 1_774_346_400_000  # 2026-03-24T10:00:00Z, the first sample
RUN: Final = T0 - 500  # the broker started half a second before it
SAMPLES: Final = 36
AUTO_LIMIT: Final = -2  # consumer_flow_limit of consumerFlowLimit=auto in the history

MIXED: Final = "/queue/mixed"
ROOMY: Final = "/topic/roomy"
TIDAL: Final = "/queue/tidal"
STEADY: Final = "/queue/steady"
ADAPTIVE: Final = "/queue/adaptive"
QUOTES: Final = "/queue/quotes"
SLA: Final = "/queue/sla"
ORDERED: Final = "/queue/ordered"
LEGACY: Final = "/queue/legacy"

FAST_BUSY: Final = 5  # samples after the first during which 2/fast holds messages
TIDE_TURNS: Final = 24  # TIDAL's load rises at this sample (the fifth period)
QUOTES_IN_PER_S: Final = 30
# Fields the history gained with adaptive windows and deadline order.
NEW_FIELDS: Final = frozenset(
    {
        "window_auto",
        "window_max",
        "pace_ms",
        "round_trip_ms",
        "delivery_order",
        "expired",
        "consumed_late",
    }
)


def destination(ts: int, name: str, limit: int = 100, **fields: Any) -> dict[str, Any]:
    kind = name.split("/")[1]
    row = {
        "ts": ts,
        "kind": "destination",
        "destination": name,
        "type": kind,
        "state": "RUNNING",
        "msgs": 0,
        "pending": 0,
        "unacked": 0,
        "consumers": 2,
        "held_sends": 0,
        "throttled": False,
        "msgs_in": 0,
        "msgs_out": 0,
        "consumer_flow_limit": limit,
        "limit_behavior": "REJECT_NEWEST",
        "dispatch_policy": "openmq" if kind == "queue" else None,
        "delivery_order": "fifo" if kind == "queue" else None,
        "expired": 0,
        "consumed_late": 0,
    }
    return row | fields


def consumer(
    ts: int, name: str, connection: int, sub: str, window: int, **fields: Any
) -> dict[str, Any]:
    row = {
        "ts": ts,
        "kind": "consumer",
        "destination": name,
        "connection": connection,
        "subscription": sub,
        "ack": "client-individual",
        "backup": False,
        "window_limit": window,
        "window_threshold": 50,
        "window_auto": False,
        "window_max": window,
        "pace_ms": None,
        "round_trip_ms": None,
        "outstanding": 0,
        "unacked": 0,
        "delivered": 0,
        "flow_paused_for": None,
    }
    return row | fields


def mixed(ts: int, i: int) -> list[dict[str, Any]]:
    fast_holds = 40 if i <= FAST_BUSY else 0
    return [
        destination(ts, MIXED, msgs=100 + fast_holds),
        consumer(
            ts,
            MIXED,
            1,
            "slow",
            100,
            outstanding=100,
            delivered=100 + 2 * i,
            flow_paused_for=i + 0.5,
        ),
        consumer(ts, MIXED, 2, "fast", 100, outstanding=fast_holds, delivered=40 + 40 * min(i, 5)),
    ]


def roomy(ts: int, i: int) -> list[dict[str, Any]]:
    return [
        destination(ts, ROOMY, 500, msgs=502),
        consumer(ts, ROOMY, 3, "quick", 500, outstanding=2, delivered=2 + 10 * i),
        consumer(
            ts, ROOMY, 4, "stuck", 500, outstanding=500, delivered=500 + i, flow_paused_for=i + 0.5
        ),
    ]


def tidal(ts: int, i: int) -> list[dict[str, Any]]:
    high = i >= TIDE_TURNS
    held = 80 if high else 4
    return [
        destination(ts, TIDAL, msgs=held),
        consumer(
            ts,
            TIDAL,
            5,
            "hog",
            100,
            outstanding=held,
            delivered=4 + 10 * i + (76 if high else 0),
        ),
        consumer(ts, TIDAL, 6, "idle", 100, outstanding=0, delivered=i // 3),
    ]


def steady(ts: int, i: int) -> list[dict[str, Any]]:
    return [
        destination(ts, STEADY, msgs=110, pending=10),
        consumer(ts, STEADY, 9, "a", 100, outstanding=50, delivered=50 + 20 * i),
        consumer(ts, STEADY, 10, "b", 100, outstanding=50, delivered=50 + 20 * i),
    ]


def adaptive(ts: int, i: int) -> list[dict[str, Any]]:
    tortoise_window = 16 if i == 0 else 6 if i < 5 else 4
    sized = {"window_auto": True, "window_max": 1000}
    return [
        destination(ts, ADAPTIVE, AUTO_LIMIT, msgs=14),
        consumer(
            ts,
            ADAPTIVE,
            7,
            "tortoise",
            tortoise_window,
            **sized,
            pace_ms=None if i == 0 else 30.0,
            round_trip_ms=None if i == 0 else 1.2,
            outstanding=4,
            delivered=4 + 2 * i,
        ),
        consumer(
            ts,
            ADAPTIVE,
            8,
            "hare",
            16 if i == 0 else 162,
            **sized,
            pace_ms=None if i == 0 else 0.1,
            round_trip_ms=None if i == 0 else 1.0,
            outstanding=10,
            delivered=100 * i,
        ),
    ]


def deadlines(ts: int, i: int) -> list[dict[str, Any]]:
    arrived = {"msgs_in": QUOTES_IN_PER_S * i, "msgs_out": QUOTES_IN_PER_S * i, "consumers": 0}
    return [
        destination(ts, QUOTES, **arrived, expired=i, consumed_late=i // 5),
        destination(ts, SLA, **arrived),
        destination(ts, ORDERED, **arrived, delivery_order="deadline", expired=2 * i),
    ]


def legacy(ts: int, i: int) -> list[dict[str, Any]]:
    rows = [
        destination(ts, LEGACY, msgs=5, consumers=1),
        consumer(ts, LEGACY, 11, "old", 100, outstanding=5, delivered=5 + 3 * i),
    ]
    return [{k: v for k, v in row.items() if k not in NEW_FIELDS} for row in rows]


def rows(*, older: bool = False) -> list[dict[str, Any]]:
    """Every row of the history; `older`: without the fields an older broker did not write."""
    written: list[dict[str, Any]] = []
    for i in range(SAMPLES):
        ts = T0 + 1000 * i
        written.append({"ts": ts, "kind": "broker", "started": RUN, "msgs": 0, "throttled": 0})
        for story in (mixed, roomy, tidal, steady, adaptive, deadlines, legacy):
            written.extend(story(ts, i))
    if older:
        written = [
            {k: v for k, v in row.items() if k not in NEW_FIELDS}
            for row in written
            if row.get("destination") != ADAPTIVE
        ]
    return written


def write(directory: Path, *, older: bool = False) -> list[str]:
    """Write the history as the broker names its files; return the paths for the job."""
    path = directory / "20260324-10.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows(older=older)))
    return [str(path)]
