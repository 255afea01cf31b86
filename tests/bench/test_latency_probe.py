"""benchmarks/latency_probe.py end to end: a short, slow run against a broker it starts itself.

Speed is never asserted: only that every message is counted once and the figures are sane.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.processes import run_group

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "latency_probe.py"
RATE = 200
SECONDS = 3


def test_the_probe_reports_ordered_percentiles_for_every_message(tmp_path: Path) -> None:
    out = tmp_path / "probe.json"
    # A process group of its own, killed however the run ends: the probe's producer, consumer
    # and broker are all in it.
    done = run_group(
        [
            sys.executable, str(SCRIPT), "--rate", str(RATE), "--seconds", str(SECONDS),
            "--warmup", "0.5", "--timeout", "3", "--json", str(out),
        ],
        timeout=40,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    document = json.loads(out.read_text())
    [run] = document["runs"]
    assert run["expected"] == RATE * SECONDS
    assert run["count"] == run["expected"]
    assert (run["missing"], run["duplicated"], run["unexpected"]) == (0, 0, 0)
    latency = run["latency_ms"]
    figures = [latency[k] for k in ("p50", "p90", "p99", "p99.9", "max")]
    assert figures[0] > 0, latency
    assert figures == sorted(figures), latency
    # Counted from the scheduled send time, never shorter than from the actual one.
    assert run["latency_from_sent_ms"]["p50"] <= latency["p50"]
    assert set(run["cpu_share"]) >= {"producer", "consumer", "broker"}
    assert all(0 < run["cpu_share"][k] < 2 for k in ("producer", "consumer", "broker"))
    assert document["latency_ms"]["p99"]["median"] == latency["p99"]
