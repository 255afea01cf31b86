"""benchmarks/session_path.py: the in-process session path benchmark runs each scenario and
checks that every message went out to every consumer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "session_path.py"


@pytest.mark.parametrize("scenario", ["queue", "persistent", "topic"])
def test_each_scenario_reports_its_cost_per_message(scenario: str) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--scenario", scenario, "--messages", "400"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{scenario}: ")
    assert "microseconds of CPU per message (median of 5 rounds of 400;" in done.stdout
