"""benchmarks/adaptive.py at a tiny scale: it runs to the end, writes its figures in the shape
documented, sees the window come down when the consumer slows, and leaves no broker behind.
(No time is asserted: the figures are only read, never held to a target here.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "adaptive.py"

pytestmark = pytest.mark.timeout(180)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )


def test_a_tiny_run_writes_its_figures_and_the_window_shrinks(tmp_path: Path) -> None:
    results = tmp_path / "adaptive.json"
    done = run(
        "--runs", "1", "--fast-seconds", "1", "--slow-seconds", "1", "--backlog", "500",
        "--results", str(results),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    document = json.loads(results.read_text())
    assert set(document) == {"machine", "settings", "target", "met", "median", "runs"}
    assert document["settings"]["slow_ms"] == 20.0
    assert isinstance(document["met"], bool)
    (found,) = document["runs"]
    for name in ("window_before", "window_after", "shrink_seconds", "drained_seconds"):
        assert name in found
        assert name in document["median"]
    # 20 ms a message against 1 ms: the broker sizes a smaller window for the slower pace.
    assert found["window_after"] < found["window_before"] <= found["window_max"]
    assert found["pace_ms_after"] > found["pace_ms_before"]
    assert found["shrink_seconds"] is None or found["shrink_seconds"] >= 0
    assert found["samples"]
    assert found["messages_consumed"] > 0
    assert "| window before | window after |" in done.stdout
    # The broker it started is gone.
    with pytest.raises(ProcessLookupError):
        os.kill(found["broker_pid"], 0)


def test_options_that_cannot_show_a_slowdown_are_refused(tmp_path: Path) -> None:
    results = tmp_path / "never.json"
    done = run("--fast-ms", "20", "--slow-ms", "5", "--results", str(results))
    assert done.returncode == 2
    assert "--slow-ms must be more than --fast-ms" in done.stderr
    assert not results.exists()
