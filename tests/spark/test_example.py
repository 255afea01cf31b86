"""The example pipeline runs with one command and reports every order through once."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.spark.conftest import java_problem, spark_environment

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "orders_pipeline.py"


@pytest.mark.slow
@pytest.mark.timeout(360)  # a whole Spark application; the run below is bounded at 300 s
def test_the_orders_example_runs_end_to_end() -> None:
    problem = java_problem()
    if problem is not None:
        pytest.skip(problem)
    # Its own process group, killed whole however the test ends: the example starts a broker
    # and Spark's JVM, which a kill of the example alone would leave running.
    process = subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--orders", "1500"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **spark_environment()},
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "sent 1500 orders to /queue/orders" in result.stdout
    assert "1500 enriched orders received: 0 missing, 0 duplicated, 0 with a wrong total" in (
        result.stdout
    )
