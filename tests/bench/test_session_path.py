"""benchmarks/session_path.py: the in-process session path benchmark runs each scenario and
checks that every message went out to every consumer."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "session_path.py"


@pytest.mark.timeout(150)  # the run's own bound, 120 s, and room to report its failure
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


@pytest.mark.timeout(150)
def test_a_single_pass_runs_quietly() -> None:
    """What --instructions has valgrind count: a warm-up and one pass, nothing printed."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--scenario", "queue", "--single-pass", "200"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, ""), done.stderr


@pytest.mark.skipif(
    shutil.which("valgrind") is None, reason="needs valgrind (apt-get install valgrind)"
)
@pytest.mark.timeout(660)  # valgrind's run is bounded at 600 s
def test_instructions_are_counted_per_message() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--instructions", "--scenario", "queue", "--messages", "200"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found = re.fullmatch(
        r"queue: ([\d,]+) instructions per message \(a pass of 200\)\n", done.stdout
    )
    assert found is not None, done.stdout
    assert int(found.group(1).replace(",", "")) > 1_000  # a message is thousands of steps
